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
machine's load spreads over every setting instead of one.

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
from __future__ import annotations

import collections
import contextlib
import fcntl
import functools
import importlib
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from commlab.analysis import metrics
from commlab.config import (
    ConfigError,
    RunConfig,
    Setting,
    default_runs_dir,
    label_of,
    link_of,
    own_settings,
    settings,
)
from commlab.engine import procs, run_folder, store
from commlab.hook_specs import BASELINE, HOOKS
from commlab.tune import baseline as baselines
from commlab.tune import pareto, payoff, quality, whatif

SWEEPS = "sweeps"
RESULT = "result.json"  # what the sweep found, written as it ends (``Sweep.report``)
DEFAULT_REPEATS = pareto.MIN_SEEDS  # the fewest seeds the recommendation decides with
DEFAULT_TOLERANCE_PCT = 5.0
FINAL_WINDOW = quality.WINDOW  # final loss: mean over this many last steps
MAX_REPEATS = 100
ADOPT_WAIT_S = 60.0  # how long a resume waits for a run of the sweep's last attempt to end


# The sweep axes: the settings the table marks sweepable (``sweep=``), in its order, the compress
# wrapper last.  Which of them a hook varies is read off its spec (``hook_axes``): no list here.
AXES = tuple(sorted((s for s in settings() if s.sweepable), key=lambda s: s.group == "hook"))
DEFAULT_HOOK = "powersgd"  # what a sweep of plain allreduce, the baseline itself, varies instead
SWEPT_HOOKS = tuple(h for h in HOOKS if h != BASELINE)  # the hooks a sweep may name


@functools.cache
def hook_axes(hook: str) -> tuple[Setting, ...]:
    """The axes a sweep of ``hook`` varies, in the grid's order: the sweepable settings it reads
    (``config.own_settings``); () for a name that is no hook."""
    own = {s.name for s in own_settings(hook)}
    return tuple(s for s in AXES if s.name in own)


def axis_hooks(name: str) -> list[str]:
    """The hooks a sweep varies this axis of (plain allreduce is the baseline, not swept)."""
    return [h for h in SWEPT_HOOKS if any(s.name == name for s in hook_axes(h))]


@dataclass(init=False)
class SweepSpec:
    """The grid: every combination of the values listed per axis of the hook swept, each on top of
    ``base``.

    The hook swept is base's (``hook``); plain allreduce, the baseline itself and RunConfig's
    default, sweeps PowerSGD.  Its axes (``hook_axes``) take the table's values unless told (the
    rank: 1, 2, 4; top-k's compress_ratio: 0.001, 0.01, 0.1), else base's value.  Values given
    for another hook's axis are kept, and refused by the grid.  ``SweepSpec(base=RunConfig(
    hook="topk"), compress_ratio=[0.01, 0.05])`` names the axes as RunConfig names the settings.
    """

    base: RunConfig
    values: dict[str, list]  # axis -> the values listed, by AXES: the hook's, and any others given
    baseline: bool  # run the baselines first, with the same job and link
    tolerance_pct: float  # the recommendation's X
    repeats: int  # seeds per setting: base.seed, base.seed + 1, ...
    against: str  # the baseline judged against (``commlab.tune.baseline``); a 16-bit one runs after fp32's

    def __init__(self, base: RunConfig | None = None, baseline: bool = True,
                 tolerance_pct: float = DEFAULT_TOLERANCE_PCT, repeats: int = DEFAULT_REPEATS,
                 against: str = baselines.DEFAULT, **values: list):
        unknown = sorted(set(values) - {s.name for s in AXES})
        if unknown:
            raise TypeError(f"not a sweep axis: {', '.join(unknown)}; the axes are: "
                            f"{', '.join(s.name for s in AXES)}")
        self.base = RunConfig() if base is None else base
        own = {s.name for s in hook_axes(self.hook)}
        self.values = {s.name: list(values.get(s.name, s.sweep)) for s in AXES
                       if s.name in own or values.get(s.name)}
        self.baseline, self.tolerance_pct, self.repeats = baseline, tolerance_pct, repeats
        self.against = against

    @property
    def hook(self) -> str:
        """The hook swept."""
        return DEFAULT_HOOK if self.base.hook == BASELINE else self.base.hook

    def axes(self) -> dict[str, list]:
        """The hook's axes with their values, repeats dropped; an axis with no table values falls
        back to base's."""
        return {s.name: _unique(self.values[s.name]) or ([] if s.sweep else [getattr(self.base, s.name)])
                for s in hook_axes(self.hook)}

    def to_dict(self) -> dict:
        return {"base": self.base.to_dict(), **self.values, "baseline": self.baseline,
                "tolerance_pct": self.tolerance_pct, "repeats": self.repeats, "against": self.against}

    def seeds(self) -> list[int]:
        return [self.base.seed + k for k in range(self.repeats)]

    @classmethod
    def from_dict(cls, data: dict) -> SweepSpec:
        """A stored plan; ConfigError for a baseline that is none (a plan is read back checked)."""
        baselines.check(data.get("against", baselines.DEFAULT))
        return cls(**{**data, "base": RunConfig.from_dict(data["base"], "sweep base settings")})


def parse_list(text: str | None, kind: type, name: str) -> list:
    """'1,2,4' -> [1, 2, 4]; raises ConfigError naming the field."""
    if text is None:
        return []
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    try:
        return [kind(t) for t in items]
    except ValueError:
        raise ConfigError({name: f"must be a comma-separated list of {kind.__name__} values, "
                                 f"got {text!r}"}) from None


AXIS_TYPES = {"int": int, "float": float, "str": str}  # the kinds a sweep axis may be


def axis_values(axis: Setting, text: str | None) -> list:
    """One axis' values from comma-separated text (the CLI's, the page's)."""
    return parse_list(text, AXIS_TYPES[axis.kind], axis.name)


def _unique(values) -> list:
    return list(dict.fromkeys(values))


def grid(spec: SweepSpec) -> list[RunConfig]:
    """Every run of the sweep in order, seed by seed, the baseline first in each; raises
    ConfigError before anything starts."""
    errs: dict[str, str] = {}
    hook, axes = spec.hook, spec.axes()
    if hook not in HOOKS:
        errs["hook"] = f"unknown hook {hook!r}; valid hooks are: {', '.join(HOOKS)}"
    for name, values in axes.items():
        if not values:
            errs[name] = "give at least one value"
    for name in spec.values.keys() - axes.keys():
        errs[name] = _not_an_axis(name, hook)
    for s in AXES:
        bad = [v for v in axes.get(s.name, []) if s.choices and v not in s.choices]
        if bad:
            errs[s.name] = f"unknown {s.name}(s) {bad}; valid {s.name}s are: {', '.join(s.choices)}"
    if not (math.isfinite(spec.tolerance_pct) and spec.tolerance_pct >= 0):
        errs["tolerance_pct"] = f"must be 0 or a positive percentage, got {spec.tolerance_pct}"
    if isinstance(spec.repeats, bool) or not isinstance(spec.repeats, int) or \
            not 1 <= spec.repeats <= MAX_REPEATS:
        errs["repeats"] = (f"must be a whole number of seeds from 1 to {MAX_REPEATS} (3 or more let "
                           f"the recommendation tell a difference from seed noise), got {spec.repeats!r}")
    # The job's own problems are named beside the grid's, all at once, each once: as the
    # field's, not as the first setting's; a setting's, for that setting.
    try:
        if baselines.check(spec.against) == hook:
            errs["against"] = (f"{hook} is the hook swept: judged against itself every setting would "
                               f"tie; judge it against another of {', '.join(baselines.BASELINES)}")
    except ConfigError as e:
        errs |= e.errors
    errs = {**spec.base.with_overrides(hook=BASELINE, wrapper="none").errors(), **errs}
    # fp32 allreduce first in every seed: it calibrates the what-if model and prices PowerSGD's
    # allreduce steps; a 16-bit baseline after it.
    one_seed = [spec.base.with_overrides(hook=b, wrapper="none")
                for b in dict.fromkeys((BASELINE, spec.against))
                if b in baselines.BASELINES] if spec.baseline else []
    for combination in itertools.product(*axes.values()):
        try:
            one_seed.append(spec.base.with_overrides(hook=hook, **dict(zip(axes, combination))))
        except ConfigError as e:  # a value of the wrong type, given through the API
            errs = {**e.errors, **errs}
    for cfg in one_seed:
        for key, msg in cfg.errors().items():
            errs.setdefault(key, f"{label_of(cfg.to_dict(), link=True)}: {msg}")
    if errs:
        raise ConfigError(errs)
    configs = [cfg.with_overrides(seed=seed) for seed in spec.seeds() for cfg in one_seed]
    for cfg in configs[len(one_seed):]:
        for key, msg in cfg.errors().items():
            errs.setdefault(key, f"seed {cfg.seed}: {msg}")
    if errs:
        raise ConfigError(errs)
    return configs


def _not_an_axis(name: str, hook: str) -> str:
    own = ", ".join(s.name for s in hook_axes(hook)) or "none"
    why = ("no compress wrapper may wrap it" if name == "wrapper"
           else f"{hook} does not read {name}, so every value would run alike")
    return (f"is not an axis of {hook}: {why}; it is an axis of {', '.join(axis_hooks(name))} "
            f"(sweep one of those as the hook); {hook}'s axes are: {own}")


def plan_label(cfg: RunConfig, spec: SweepSpec) -> str:
    """A run's name in the plan and the progress line: its setting, and its seed when there are several."""
    return label_of(cfg.to_dict(), link=True, seed=spec.repeats > 1)


# ============================================================================ progress
@dataclass
class Progress:
    index: int  # the current run, from 0
    total: int
    label: str
    run_status: str  # "starting" or the current run's status
    step: int  # steps the current run has completed
    steps: int
    sweep_status: str
    eta_s: float | None = None  # time left at the pace of this execution so far

    @property
    def fraction(self) -> float:
        done = self.index + (min(self.step, self.steps) / self.steps if self.steps else 0.0)
        return min(1.0, done / self.total) if self.total else 1.0

    def line(self) -> str:
        going = self.eta_s is not None and self.run_status in ("starting", "running")
        left = f", about {_duration(self.eta_s)} left" if going else ""
        return (f"[{self.index + 1}/{self.total}] {self.label}: {self.run_status}, "
                f"step {self.step}/{self.steps}{left}")


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def eta(fraction: float, since: dict | None) -> float | None:
    """Seconds left: the time this execution took per share of the sweep, times the share left.
    ``since``: when the execution began (``time``) and how far the sweep was then (``fraction``)."""
    if not since:
        return None
    done = fraction - since.get("fraction", 0.0)
    if done <= 0.01:
        return None
    return (time.time() - since["time"]) / done * (1 - fraction)


# ============================================================================ the sweep folder
# What sweep.json and state.json hold, as far as their readers rely on it (see store.load_json).
PLAN = {"spec": dict, "labels?": [str]}
STATE = {"status?": str, "index?": int, "runs?": [{"run_dir?": str, "status?": str}],
         "replaced?": [{"run_dir?": str, "status?": str}],
         "pid?": store.OPT_INT, "create_time?": store.OPT_NUM,
         "since?": {"time": store.NUM, "fraction": store.NUM}}


class Sweep(store.Folder):
    """One sweep's folder: its plan, its state, its runs."""

    MARKER = "sweep.json"

    def slurm(self):
        """The Slurm job each run is submitted as (``commlab.engine.launchers.slurm.SlurmJob``), or None: on this machine."""
        from commlab.engine.launchers.slurm import SlurmJob

        given = store.read_json(self.file("sweep.json"), {}).get("slurm")
        return SlurmJob(**given) if given else None

    def spec(self) -> SweepSpec:
        """The plan; ``store.Damaged`` when sweep.json is not one."""
        try:
            return SweepSpec.from_dict(store.load_json(self.file("sweep.json"), PLAN)["spec"])
        except (ConfigError, TypeError, ValueError, KeyError) as e:
            if isinstance(e, store.Damaged):
                raise
            raise store.Damaged("sweep.json", f"not a sweep's plan ({str(e)[:120]})") from None

    def damage(self) -> str | None:
        """``damaged: sweep.json: <what>`` when the plan cannot be read; None when it can."""
        try:
            self.spec()
        except (store.Damaged, OSError) as e:
            return f"damaged: {e}"
        return None

    def configs(self) -> list[RunConfig]:
        return grid(self.spec())

    def state(self) -> dict:
        return store.read_json(self.file("state.json"), {}, STATE)

    def status(self) -> str:
        """running | finished | stopped | lost (the process answerable for it died without
        recording an end: the one that created it, then the one ``start`` spawned, then the one
        executing it)."""
        from commlab.engine.procs import alive

        state = self.state()
        status = state.get("status", "running")
        if status == "running" and not alive(state.get("pid"), state.get("create_time")):
            return "lost"
        return status

    def is_running(self) -> bool:
        return self.status() == "running"

    def stop_requested(self) -> bool:
        return self.file("stop").exists()

    def request_stop(self) -> None:
        """Ask the sweep to stop; its process stops the current run.  With no process left, do it here."""
        self.file("stop").touch()
        if self.status() == "lost":
            for run in self.runs():
                if run.status() in store.STOPPABLE:
                    run.stop()
            _write_state(self, status="stopped")

    def runs(self) -> list:
        from commlab.engine.launch import Run

        return [Run(e["run_dir"]) for e in self.state().get("runs", []) if e.get("run_dir")]

    def progress(self) -> Progress:
        """Where the sweep stands, read from its folder (for a page polling from another process)."""
        state, labels = self.state(), store.read_json(self.file("sweep.json"), {}, PLAN).get("labels", [])
        entries = state.get("runs", [])
        index = min(state.get("index", 0), max(len(labels) - 1, 0))
        entry = entries[index] if index < len(entries) else {}
        run_dir, status = entry.get("run_dir"), entry.get("status", "starting")
        step = len(store.read_jsonl(Path(run_dir) / "metrics.jsonl")) if run_dir else 0
        if run_dir and status == "starting":  # the sweep records only a run's launch and its end
            status = run_folder.RunFolder(run_dir).status()
        p = Progress(index, len(labels), labels[index] if labels else "",
                     status, step, self.spec().base.steps, self.status())
        p.eta_s = eta(p.fraction, state.get("since")) if p.sweep_status == "running" else None
        return p

    def results(self, tolerance_pct: float | None = None, cluster: quality.Cluster = quality.Cluster(),
                against: str | None = None):
        """One row per run started, in plan order (a pandas DataFrame, ``ROW_COLUMNS``): its
        quality, bytes, measured time, the time the what-if model predicts on ``cluster``, and
        where it first reached the target (the baseline's mean final quality plus
        ``tolerance_pct``, default the spec's); judged against the baseline ``against`` (default
        the spec's; ConfigError for a name that is none): whether it pays on ``cluster``
        (``commlab.tune.payoff``, against the baseline's run of its seed) and its predicted speed-up
        there.  ``commlab.tune.pareto.by_setting`` folds the seeds."""
        against = baselines.check(self.spec().against if against is None else against)
        runs = self.runs()
        loaded = [(r, r.config_dict(), r.metrics_records(), r.evals()) for r in runs]
        profiles = {p.run_id: p for p in whatif.profiles_from_runs(runs)}
        plain, based = _by_seed(loaded, profiles, baselines.BASELINE), _by_seed(loaded, profiles, against)
        rows, extra = [], []
        for r, cfg, recs, evals in loaded:
            seed = cfg.get("seed")
            per_step = quality.predicted_step_s(recs, cfg, profiles.get(r.id), plain[seed], cluster)
            rows.append({**summarize(recs, cfg, r.status(), r.id, str(r.path), evals=evals,
                                     predicted_step_s=per_step, against=against),
                         **payoff.judged(based[seed], profiles.get(r.id), cluster, against)})
            extra.append((recs, per_step))
        table = _frame(rows)
        table["against"] = against
        goal = pareto.target(table, self.spec().tolerance_pct if tolerance_pct is None else tolerance_pct)
        for i, (recs, per_step) in enumerate(extra):
            got = quality.reach(table.at[i, "curve"], recs, per_step, goal) if goal is not None \
                else quality.Reached()
            for key in ("step", "time_s", "predicted_s", "bytes"):
                table.at[i, f"reach_{key}"] = getattr(got, key)
        table["target"] = goal
        table["cluster"] = cluster.text()
        return table

    def report(self, cluster: quality.Cluster = quality.Cluster(), against: str | None = None) -> dict:
        """Every run, every setting over its seeds, the recommendation: what ``commlab sweep``
        prints (``--json``) and ``result.json`` holds; judged against ``against`` (default the spec's)."""
        tolerance = self.spec().tolerance_pct
        runs = self.results(tolerance, cluster, against)
        table = pareto.by_setting(runs)
        return {"sweep_id": self.id, "sweep_dir": str(self.path), "status": self.status(),
                "cluster": cluster.text(), "against": pareto.against(runs),
                "target": runs["target"].iloc[0] if len(runs) else None,
                "runs": _records(runs.drop(columns=["curve"])), "settings": _records(table),
                "recommendation": pareto.recommend(runs, tolerance).to_dict(),
                "pareto_bytes": table[table["pareto_bytes"]]["label"].tolist(),
                "pareto_predicted": table[table["pareto_predicted"]]["label"].tolist()}

    def saved_report(self) -> dict | None:
        """``result.json`` as the sweep wrote it when it ended; None before."""
        return store.read_json(self.file(RESULT), None)

    def wait(self, timeout: float | None = None, poll_s: float = 0.5) -> str:
        procs.wait_until(lambda: not self.is_running(), timeout, poll_s)
        return self.status()


def _by_seed(loaded, profiles: dict, against: str) -> collections.defaultdict:
    """The profile of the baseline ``against``'s run of each seed; a seed without one gets the
    first seed's that has one (None when no seed has)."""
    found = {cfg.get("seed"): profiles.get(r.id) for r, cfg, _, _ in loaded
             if baselines.is_baseline(cfg, against)}
    fallback = next((p for p in found.values() if p), None)
    return collections.defaultdict(lambda: fallback, {k: v for k, v in found.items() if v})


def _records(df) -> list[dict]:
    return df.astype(object).where(df.notna(), None).to_dict(orient="records")


def list_sweeps(runs_dir: str | os.PathLike | None = None) -> list[Sweep]:
    """Every sweep under the runs folder, newest first."""
    root = Path(runs_dir or default_runs_dir()) / SWEEPS
    if not root.is_dir():
        return []
    return sorted((s for s in map(Sweep, root.iterdir()) if s.exists()),
                  key=lambda s: s.id, reverse=True)


def create(spec: SweepSpec, slurm=None) -> Sweep:
    """Validate the whole grid, then write the sweep's folder; raises ConfigError first.
    ``slurm``: its runs are Slurm jobs (``commlab.engine.launchers.slurm.SlurmJob``), one job per run."""
    configs = grid(spec)
    with one_at_a_time(spec.base.runs_dir):
        _none_running(spec.base.runs_dir)
        sweep = Sweep(store.new_run_dir(Path(spec.base.runs_dir) / SWEEPS, "sweep", reserve=False))
        # This process answers for the sweep until another executes it; sweep.json, the marker, last.
        store.write_json(sweep.file("state.json"), {"status": "running", "index": 0, "runs": [],
                                                    **procs.identity(os.getpid())})
        store.write_json(sweep.file("sweep.json"), {
            "spec": spec.to_dict(), "labels": [plan_label(c, spec) for c in configs],
            "slurm": slurm.as_dict() if slurm is not None else None, "created_at": time.time()})
    return sweep


@contextlib.contextmanager
def one_at_a_time(runs_dir):
    """The check that no sweep is running and the claim of the next, as one step: processes that
    create or resume a sweep at the same instant take turns here (a lock file in the sweeps
    folder), so that the second sees the first's claim and is refused."""
    root = Path(runs_dir) / SWEEPS
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".claim.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _none_running(runs_dir) -> None:
    going = [s.id for s in list_sweeps(runs_dir) if s.status() == "running"]
    if going:
        raise ConfigError({"sweep": f"sweep {going[0]} is still running: two sweeps at once would "
                                    "share the cores and spoil each other's step times; stop it "
                                    "or let it finish first"})


def _write_state(sweep: Sweep, **changes) -> dict:
    # Read, change, replace, under a lock: the spawning process and the executing one both write.
    with open(sweep.file(".state.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = {**sweep.state(), **changes}
        store.write_json(sweep.file("state.json"), state)
    return state


def _frame(rows: list[dict]):
    import pandas as pd

    return pd.DataFrame(rows, columns=ROW_COLUMNS).astype({c: object for c in REACH_COLUMNS})


def execute(sweep: Sweep, on_progress: Callable[[Progress], None] | None = None,
            should_stop: Callable[[], bool] | None = None, poll_s: float = 0.05,
            cluster: quality.Cluster = quality.Cluster()) -> str:
    """Run the sweep's runs here, one after another; returns "finished" or "stopped".

    Runs a resumed sweep already finished are kept, not run again.  ``should_stop`` is asked
    between polls beside the stop flag (a CLI's Ctrl-C, a test).  As it ends, what it found
    (``Sweep.report`` with times predicted on ``cluster``) goes to result.json.
    """
    from commlab.engine.launch import Run
    from commlab.engine.launchers.warm import Batch

    configs = sweep.configs()
    spec = sweep.spec()
    labels = [plan_label(c, spec) for c in configs]
    state = sweep.state()
    before = [{**e, "status": Run(e["run_dir"]).status()} if e.get("run_dir") else e
              for e in state.get("runs", [])]
    done = {i: e for i, e in enumerate(before) if e.get("status") == "finished"}
    # A run of an earlier attempt that did not finish runs again; its folder stays, listed here.
    replaced = state.get("replaced", []) + [e for i, e in enumerate(before) if e.get("run_dir") and i not in done]
    since = {"time": time.time(), "fraction": len(done) / len(configs) if configs else 1.0}
    entries: list[dict] = [done.get(i, {"label": labels[i]}) for i in range(len(configs))]
    _write_state(sweep, status="running", since=since, runs=_started(entries), replaced=replaced,
                 **procs.identity(os.getpid()))
    stopped = False
    exiting: list = []

    def stopping() -> bool:
        return sweep.stop_requested() or bool(should_stop and should_stop())

    def report(i: int, status: str, step: int) -> None:
        if on_progress:
            p = Progress(i, len(configs), labels[i], status, step, configs[i].steps, "running")
            p.eta_s = eta(p.fraction, since)
            on_progress(p)

    # Its runs die with this process (their supervisors watch it), so a sweep killed mid-run
    # leaves no run training on that a resume would start a second beside.
    launch = Batch(f"sweep {sweep.id}", sweep.file("pool"), warm=len(configs) - len(done) > 1,
                   slurm=sweep.slurm())
    # The report reads the runs with pandas, whose import (0.45 s) would come after the last run:
    # it is done now, beside the first run's start-up, which leaves this process idle.
    threading.Thread(target=importlib.import_module, args=("pandas",), daemon=True).start()
    try:
        for i, cfg in enumerate(configs):
            if i in done:
                continue
            if stopped or stopping():
                stopped = True
                break
            report(i, "starting", 0)
            run = launch.start(cfg, request_id=f"{sweep.id}-{i}-{int(since['time'])}")
            entries[i] = {"label": labels[i], "run_dir": str(run.path), "status": run.status()}
            _write_state(sweep, index=i, runs=_started(entries))

            steps, steps_done = run.metrics_tail(keep=("step",)), 0  # read as they come: polled often

            def look(run=run, i=i, steps=steps) -> bool:
                """True once the run has ended, or was stopped here."""
                nonlocal stopped, steps_done
                status = run.status()
                if status not in store.GOING:
                    return True
                if stopping():
                    stopped = True
                    run.stop()
                    return True
                steps_done += len(steps.read_new())
                report(i, status, steps_done)
                return False

            procs.wait_until(look, interval=poll_s)
            # The next run starts while this one's processes exit: they are past their last step,
            # and their exit (seconds on a busy machine) overlaps the next one's start-up instead of
            # idling the sweep.  Every one is waited for before the sweep ends.
            status = run.wait() if stopped else run.status()
            exiting.append(run)
            entries[i]["status"] = status
            _write_state(sweep, runs=_started(entries))
            report(i, status, steps_done + len(steps.read_new()))
        launch.release()  # the ranks leave while the runs' supervisors end and the report is made
        for run in exiting:
            run.wait()
        final = "stopped" if stopped else "finished"
        _write_state(sweep, status=final, ended_at=time.time())
        try:
            store.write_json(sweep.file(RESULT), store.finite(sweep.report(cluster)))
        except Exception as e:  # the runs and the state are kept: `commlab sweep --show` asks again
            store.write_json(sweep.file(RESULT), {"error": f"{type(e).__name__}: {e}"})
            raise
    finally:
        launch.close()
    return final


def _started(entries: list[dict]) -> list[dict]:
    # state.json lists runs by plan index: those not started (yet, or again) have no run_dir.
    return entries[:max((i + 1 for i, e in enumerate(entries) if e.get("run_dir")), default=0)]


def _resumable(sweep: Sweep) -> None:
    status = sweep.status()
    if status in ("running", "finished"):
        raise ConfigError({"resume": f"sweep {sweep.id} is {status}: only a stopped or lost sweep "
                                     f"resumes (`commlab sweep --show {sweep.id}` prints its result)"})
    _none_running(sweep.path.parent.parent)
    going = [run.id for run in sweep.runs() if run.is_running()]
    if going:
        raise ConfigError({"resume": f"run {going[0]} of sweep {sweep.id} still runs: stop it "
                                     "(commlab runs) before resuming"})
    sweep.file("stop").unlink(missing_ok=True)


def _last_attempt_ended(sweep: Sweep) -> None:
    """A run of a sweep whose process died is stopped by its supervisor within a second or two
    (launch.json's owner): wait for that, outside the claim, so that a resume never starts its
    setting again beside it (``_resumable`` refuses one still going)."""
    for run in sweep.runs():
        if run.is_running():
            run.wait(timeout=ADOPT_WAIT_S)


def resume(sweep: Sweep, on_progress: Callable[[Progress], None] | None = None,
           should_stop: Callable[[], bool] | None = None,
           cluster: quality.Cluster = quality.Cluster()) -> str:
    """Execute a stopped or lost sweep again here: its finished runs are kept, the rest run."""
    _last_attempt_ended(sweep)
    with one_at_a_time(sweep.path.parent.parent):
        _resumable(sweep)
        _write_state(sweep, status="running", **procs.identity(os.getpid()))
    return execute(sweep, on_progress, should_stop, cluster=cluster)


def start_resume(sweep: Sweep) -> Sweep:
    """``resume`` in a detached process (the UI)."""
    _last_attempt_ended(sweep)
    with one_at_a_time(sweep.path.parent.parent):
        _resumable(sweep)
        _spawn(sweep)
    return sweep


def _spawn(sweep: Sweep) -> None:
    child = procs.spawn([sys.executable, "-m", "commlab.tune.sweep", str(sweep.path.resolve())],
                        log=sweep.file("sweep.log"), env=procs.package_env(), detached=True)
    _write_state(sweep, status="running", **procs.identity(child.pid))


def run_sweep(spec: SweepSpec, on_progress: Callable[[Progress], None] | None = None,
              should_stop: Callable[[], bool] | None = None, slurm=None) -> Sweep:
    """Create and execute a sweep in this process (notebooks, scripts, the CLI); ``slurm``: each
    run a Slurm job (``create``)."""
    sweep = create(spec, slurm)
    execute(sweep, on_progress, should_stop)
    return sweep


def start(spec: SweepSpec, slurm=None) -> Sweep:
    """Create a sweep and execute it in a detached process, which outlives the caller (the UI);
    that process answers for the sweep from the moment it is spawned.  ``slurm``: see ``create``."""
    from commlab.engine import workload_probe
    workload_probe.check(spec.base)  # its runs share the base's workload: refused before any starts
    sweep = create(spec, slurm)
    _spawn(sweep)
    return sweep


# ============================================================================ analysis (pure)
REACH_COLUMNS = ["reach_step", "reach_time_s", "reach_predicted_s", "reach_bytes"]
ROW_COLUMNS = ["label", "seed", "run_id", "run_dir", "status", "diverged", "baseline", "against",
               "hook", "wrapper", *pareto.AXIS_KEYS, "steps", "quality", "quality_basis", "accuracy",
               "bits_per_char", "final_loss", "bytes_per_step", "time_s", "median_step_s",
               "predicted_s", *pareto.PAYOFF_KEYS, "link", "curve", *REACH_COLUMNS]


def summarize(records: list[dict], cfg: dict, status: str, run_id: str = "", run_dir: str = "",
              final_window: int = FINAL_WINDOW, evals: list[dict] | None = None,
              predicted_step_s: list[float] | None = None, against: str = baselines.DEFAULT) -> dict:
    """One sweep row from a run's metrics and evaluations: its headline
    (``commlab.analysis.metrics.headline``) read over the windows a sweep compares.

    quality: the final held-out loss, else the training loss's mean over the last
    ``final_window`` steps (``quality_basis`` says which; ``commlab.tune.quality``); curve: the
    same by step, for time to quality.  final_loss: that training-loss mean, always.
    The hook's own axes carry its values, the others None.
    bytes_per_step: all the bytes the hook handed over, divided by the steps, not the steady
    median: ``start_powerSGD_iter`` (and ``start_localSGD_iter``) is an axis, and its allreduce
    steps are part of what a setting costs.  time_s: training time to the last step, start-up excluded.  median_step_s: over the
    steady steps, as in the run's headline.  predicted_s: the sum of ``predicted_step_s``, the
    what-if model's step times on the chosen cluster.  baseline: whether it is a run of the
    baseline ``against``.  The reach and payoff columns are filled by the sweep (they need every
    seed's baseline first).
    """
    figures = metrics.headline(records, cfg, final_window, bytes_over_run=True)
    c = quality.curve(evals, records, final_window)
    own = {s.name for s in hook_axes(cfg.get("hook"))}  # the other axes' values are not this run's
    return {
        "label": label_of(cfg, link=True), "seed": cfg.get("seed"), "run_id": run_id, "run_dir": run_dir, "status": status,
        "diverged": status == "diverged" or quality.diverged(c, records),
        "baseline": baselines.is_baseline(cfg, against), "against": against,
        "hook": cfg.get("hook"), "wrapper": cfg.get("wrapper"),
        **{k: cfg.get(k) if k in own else None for k in pareto.AXIS_KEYS}, "steps": len(records),
        "quality": c.final, "quality_basis": c.basis, "accuracy": c.accuracy,
        "bits_per_char": c.bits_per_char,
        "final_loss": figures["final_loss"], "bytes_per_step": figures["bytes_per_step"],
        "time_s": records[-1]["t"] if records else None, "median_step_s": figures["median_step_s"],
        "predicted_s": sum(predicted_step_s) if predicted_step_s else None,
        "link": link_of(cfg) or "loopback", "curve": c,
        **dict.fromkeys([*pareto.PAYOFF_KEYS, *REACH_COLUMNS]),
    }


if __name__ == "__main__":
    execute(Sweep(sys.argv[1]))
