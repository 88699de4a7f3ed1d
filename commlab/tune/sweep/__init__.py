"""A sweep: a grid of one hook's own settings beside a plain allreduce baseline, each run with
several seeds, one run after another.

The hook is the base config's (PowerSGD when the base is plain allreduce, the baseline itself);
its axes are the settings the table marks sweepable (``sweep=`` in ``commlab.config``) that the
hook reads, as the registry builds it (``hook_axes``): PowerSGD's rank, start and rate, top-k's,
random-k's and DGC's compress_ratio, QSGD's levels, threshold's threshold, per-channel
quantization's bucket size, post-local SGD's period and start, and the compress wrapper for the
hooks one may wrap.  Values for an axis the hook does not read are refused by name: they would
run the same setting again under other labels.  One hook per sweep: a "hook" axis, each hook
combined only with its own axes, would generalize it, and is left out because a sweep's
recommendation and front answer "which setting of this method", while the comparison view
(``commlab.tune.compare``) puts the methods side by side.

    python -m commlab.tune.sweep SWEEP_DIR      (started detached by ``start``, for the UI)

The package: ``spec`` (the axes, ``SweepSpec``, the grid), ``folder`` (``Sweep``: the sweep's
folder, its plan and state; ``create``, ``list_sweeps``), ``executor`` (``Executor``: the runs
one after another; ``resume``, ``start``), ``table`` (a row per run, the report), ``progress``.

Every run is an ordinary run in the runs folder (its own run folder, listed with the others); the
sweep keeps its plan and its state in ``<runs_dir>/sweeps/<sweep_id>/``:

  sweep.json   the spec and the planned labels       state.json   status, current index, run folders
  stop         present once a stop was asked for     sweep.log    the detached process's output
  result.json  every run, every setting, the recommendation: written as the sweep ends

Seeds: with ``repeats`` N every setting, the baseline included, runs with seeds ``base.seed``
to ``base.seed + N - 1``; a seed sets the initial weights and the data order, so the runs of one
seed are identical across settings until the hook makes them differ, and the analysis compares
them seed by seed (``commlab.tune.pareto``).  The plan goes seed by seed (every setting with the
first seed, then the second...): a sweep stopped early has whole comparisons, and a drift in the
machine's load spreads over every setting instead of one.  After the planned runs, while the seeds
cannot tell, the settings whose open verdict one more seed may decide get one, with the baselines,
until decided or the budget (``max_repeats``) is spent (``Executor._seed_open``); the plan grows by
runs appended to it (``spec.added``), and past the budget the recommendation keeps the baseline
with its reason (``pareto.recommend``'s ``most_seeds``).

Runs go one at a time: run together they would share the cores and spoil each other's timings;
the next starts as soon as one has recorded its end, while its processes exit.  Between polls the executor reads the stop flag; on a stop it
stops the current run (``Run.stop``), starts no other, and keeps every finished run.  A stop asked
of a sweep whose process is gone stops its current run directly.  ``resume`` (``commlab sweep
--resume``, the page's Resume) executes a stopped or lost sweep again: finished runs are kept,
the others run anew.

No early stopping: a grid suffices.  The grid is small (PyTorch advises ranks 1-4 and a few start
iterations; a compressor has one or two knobs), the decision needs every setting's final held-out
loss on every seed, and an early checkpoint misleads here: a later ``start_powerSGD_iter`` (or
``start_localSGD_iter``) is plain allreduce, indistinguishable from the baseline, until it starts,
and a compressed run's error feedback recovers what it lost over later steps, so a median rule at
a checkpoint would prune the settings that would have won.

The analysis is pure: ``summarize`` turns a run's metrics and evaluations into one row;
``commlab.tune.pareto`` folds the seeds of each setting, marks the settings nothing beats and
applies the recommendation's rule.
"""
from commlab.tune.sweep.executor import (
    ADOPT_WAIT_S,
    Executor,
    execute,
    resume,
    run_sweep,
    start,
    start_resume,
)
from commlab.tune.sweep.folder import (
    PLAN,
    RESULT,
    STATE,
    SWEEPS,
    Sweep,
    _write_state,
    add_seeds,
    create,
    list_sweeps,
    one_at_a_time,
)
from commlab.tune.sweep.progress import Progress, eta
from commlab.tune.sweep.spec import (
    AXES,
    AXIS_TYPES,
    DEFAULT_HOOK,
    DEFAULT_MAX_REPEATS,
    DEFAULT_REPEATS,
    DEFAULT_TOLERANCE_PCT,
    JOB_AXES,
    MAX_REPEATS,
    SWEPT_HOOKS,
    SweepSpec,
    axis_hooks,
    axis_values,
    grid,
    hook_axes,
    more_seeds,
    parse_list,
    plan_label,
)
from commlab.tune.sweep.table import FINAL_WINDOW, REACH_COLUMNS, ROW_COLUMNS, next_step, summarize

__all__ = [
    "ADOPT_WAIT_S", "AXES", "AXIS_TYPES", "DEFAULT_HOOK", "DEFAULT_MAX_REPEATS", "DEFAULT_REPEATS", "DEFAULT_TOLERANCE_PCT",
    "FINAL_WINDOW", "JOB_AXES", "MAX_REPEATS", "PLAN", "REACH_COLUMNS", "RESULT", "ROW_COLUMNS", "STATE",
    "SWEEPS", "SWEPT_HOOKS", "Executor", "add_seeds", "Progress", "Sweep", "SweepSpec", "_write_state",
    "axis_hooks", "axis_values", "create", "eta", "execute", "grid", "hook_axes", "list_sweeps", "more_seeds", "next_step",
    "one_at_a_time", "parse_list", "plan_label", "resume", "run_sweep", "start", "start_resume",
    "summarize",
]
