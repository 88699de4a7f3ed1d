"""A sweep's executor: its runs here, one after another (``Executor``); resuming a stopped or lost
sweep; starting one in a detached process for the UI."""
from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict

from commlab.config import ConfigError, label_of
from commlab.engine import procs, store
from commlab.engine.run_state import RunStatus
from commlab.tune import pareto, quality
from commlab.tune.sweep.folder import (
    RESULT,
    Sweep,
    _none_running,
    _write_state,
    add_seed,
    add_seeds,
    create,
    one_at_a_time,
)
from commlab.tune.sweep.progress import Estimate, Progress, eta
from commlab.tune.sweep.spec import SweepSpec, baseline_hooks, per_seed, plan_label

ADOPT_WAIT_S = 60.0  # how long a resume waits for a run of the sweep's last attempt to end


class Executor:
    """One execution of a sweep: the runs not yet finished, one at a time, then its result.

    Runs a resumed sweep already finished are kept, not run again.  ``should_stop`` is asked
    between polls beside the stop flag (a CLI's Ctrl-C, a test).  As it ends, what it found
    (``Sweep.report`` with times predicted on ``cluster``) goes to result.json.
    """

    def __init__(self, sweep: Sweep, on_progress: Callable[[Progress], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, poll_s: float = 0.05,
                 cluster: quality.Cluster = quality.Cluster()):
        self.sweep, self.on_progress, self.should_stop = sweep, on_progress, should_stop
        self.poll_s, self.cluster = poll_s, cluster
        self.configs = sweep.configs()
        spec = sweep.spec()
        self.labels = [plan_label(c, spec) for c in self.configs]
        self.stopped = False
        self.failed: str | None = None  # why a run could not start, which ends the sweep failed
        self.exiting: list = []  # runs past their last step whose processes are still exiting
        self.since: dict = {}  # when this execution began and how far the sweep was (``_begin``)
        self.entries: list[dict] = []  # state.json's runs, by plan index
        self.steps_done = 0  # of the current run
        self.estimate: Estimate | None = None  # made as this execution's second run ends (``_estimate``)

    def run(self) -> str:
        """Returns "finished", "stopped", or "failed" (a run could not start: state.json's ``error``)."""
        from commlab.engine.launchers.warm import Batch

        done = self._begin()
        # Its runs die with this process (their supervisors watch it), so a sweep killed mid-run
        # leaves no run training on that a resume would start a second beside.
        launch = Batch(f"sweep {self.sweep.id}", self.sweep.file("pool"),
                       warm=len(self.configs) - len(done) > 1, slurm=self.sweep.slurm())
        # The report reads the runs with pandas, whose import (0.45 s) would come after the last
        # run: it is done now, beside the first run's start-up, which leaves this process idle.
        threading.Thread(target=importlib.import_module, args=("pandas",), daemon=True).start()
        try:
            ran = set(done)
            while self._run_planned(launch, ran) and self._seed_open(len(done)):
                pass
            launch.release()  # the ranks leave while the runs' supervisors end and the report is made
            for run in self.exiting:
                run.wait()
            return self._end()
        finally:
            launch.close()

    def _run_planned(self, launch, ran: set[int]) -> bool:
        """Run the planned runs not yet run; False when the sweep stopped or a run could not start."""
        for i, cfg in enumerate(self.configs):
            if i in ran:
                continue
            if self.stopped or self._stopping():
                self.stopped = True
                return False
            ran.add(i)
            try:
                self._run_one(launch, i, cfg)
            except (ConfigError, OSError) as e:  # a full disk, a runs folder gone: none would start
                self.failed = f"run {i + 1} of {len(self.configs)} ({self.labels[i]}) could not start: {e}"
                return False
        return True

    def _seed_open(self, kept: int) -> bool:
        """The sequential seeds: while the recommendation is open, one more seed for the settings
        whose verdicts one more may decide within the budget (``pareto.to_seed``) and the baselines
        they are judged against.  False when none may (decided, or the budget spent).  ``kept``: the
        runs of earlier executions, which the pace leaves out."""
        spec = self.sweep.spec()
        if len({c.seed for c in self.configs}) >= spec.max_repeats:  # a baseline's seed failing adds no pair
            return False
        rec = self.sweep.recommend(self.sweep.results(cluster=self.cluster))
        open_ = set(rec.to_seed(spec.max_repeats))
        if not open_:
            return False
        one_seed = self.configs[:per_seed(spec)]
        add_seed(self.sweep, [k for k, cfg in enumerate(one_seed)
                              if k < len(baseline_hooks(spec)) or label_of(cfg.to_dict(), link=True) in open_])
        spec = self.sweep.spec()
        self.configs = self.sweep.configs()
        self.labels = [plan_label(c, spec) for c in self.configs]
        self.entries += [{"label": label} for label in self.labels[len(self.entries):]]
        # The share of the sweep done before this execution, of the plan as it is now.
        self.since["fraction"] = kept / len(self.configs)
        if "paced" in self.since:
            self.since["paced_fraction"] = (kept + 1) / len(self.configs)
        _write_state(self.sweep, since=self.since)
        return True

    def _begin(self) -> dict[int, dict]:
        """Record this execution's start; returns the runs of earlier ones that finished, by plan index."""
        from commlab.engine.launch import Run

        state = self.sweep.state()
        before = [{**e, "status": Run(self.sweep.run_path(e["run_dir"])).status()} if e.get("run_dir") else e
                  for e in state.get("runs", [])]
        done = {i: e for i, e in enumerate(before) if e.get("status") == RunStatus.FINISHED}
        # A run of an earlier attempt that did not finish runs again; its folder stays, listed here.
        replaced = state.get("replaced", []) + [e for i, e in enumerate(before)
                                                if e.get("run_dir") and i not in done]
        total = len(self.configs)
        self.since = {"time": time.time(), "fraction": len(done) / total if total else 1.0}
        self.entries = [done.get(i, {"label": self.labels[i]}) for i in range(total)]
        _write_state(self.sweep, status=RunStatus.RUNNING, since=self.since, runs=_started(self.entries),
                     replaced=replaced, error=None, **procs.identity(os.getpid()))
        return done

    def _run_one(self, launch, i: int, cfg) -> None:
        self._report(i, RunStatus.STARTING, 0)
        run = launch.start(cfg, request_id=f"{self.sweep.id}-{i}-{int(self.since['time'])}")
        self.entries[i] = {"label": self.labels[i], "status": run.status(),
                           "run_dir": os.path.relpath(run.path.resolve(), self.sweep.runs_root.resolve())}
        _write_state(self.sweep, index=i, runs=_started(self.entries))
        steps = run.metrics_tail(keep=("step",))  # read as they come: polled often
        self.steps_done = 0
        procs.wait_until(lambda: self._ended(i, run, steps), interval=self.poll_s)
        # The next run starts while this one's processes exit: they are past their last step,
        # and their exit (seconds on a busy machine) overlaps the next one's start-up instead of
        # idling the sweep.  Every one is waited for before the sweep ends.
        status = run.wait() if self.stopped else run.status()
        self.exiting.append(run)
        self.entries[i]["status"] = status
        _write_state(self.sweep, runs=_started(self.entries))
        if "paced" not in self.since:  # this execution's first run: the pace is counted from here
            self.since.update(paced=time.time(), paced_fraction=self.since["fraction"] + 1 / len(self.configs))
            _write_state(self.sweep, since=self.since)
            estimate = None
        else:
            estimate = None if self.estimate or self.stopped else self._estimate().line(
                self.sweep.spec().max_repeats)
        self._report(i, status, self.steps_done + len(steps.read_new()), estimate)

    def _estimate(self) -> Estimate:
        """The first estimate, as this execution's second run ends: the first run's time, start-up
        included, then every other at the second's.  Made then, not before: a run's time on this
        machine, under its load, is known once runs have run; the first alone carries the start-up."""
        spec, now = self.sweep.spec(), time.time()
        runs = len(self.configs) - round(self.since["fraction"] * len(self.configs))
        seeds = len({c.seed for c in self.configs})
        # Only a sweep with a baseline and the rule's least seeds has open verdicts to seed.
        rounds = max(0, spec.max_repeats - seeds) if spec.baseline and seeds >= pareto.MIN_SEEDS else 0
        self.estimate = Estimate(runs, self.since["paced"] - self.since["time"], now - self.since["paced"],
                                 runs + rounds * per_seed(spec))
        _write_state(self.sweep, estimate=asdict(self.estimate))
        return self.estimate

    def _ended(self, i: int, run, steps) -> bool:
        """True once the run has ended, or was stopped here."""
        status = run.status()
        if status not in store.GOING:
            return True
        if self._stopping():
            self.stopped = True
            run.stop()
            return True
        self.steps_done += len(steps.read_new())
        self._report(i, status, self.steps_done)
        return False

    def _end(self) -> str:
        final = RunStatus.FAILED if self.failed else RunStatus.STOPPED if self.stopped else RunStatus.FINISHED
        _write_state(self.sweep, status=final, ended_at=time.time(), error=self.failed)
        try:
            store.write_json(self.sweep.file(RESULT), store.finite(self.sweep.report(self.cluster)))
        except Exception as e:  # the runs and the state are kept: `commlab sweep --show` asks again
            store.write_json(self.sweep.file(RESULT), {"error": f"{type(e).__name__}: {e}"})
            raise
        return final

    def _stopping(self) -> bool:
        return self.sweep.stop_requested() or bool(self.should_stop and self.should_stop())

    def _report(self, i: int, status: str, step: int, estimate: str | None = None) -> None:
        if self.on_progress:
            p = Progress(i, len(self.configs), self.labels[i], status, step, self.configs[i].steps,
                         RunStatus.RUNNING, estimate=estimate)
            # No time left before the first estimate: until then no pace leaves the start-up out.
            p.eta_s = eta(p.fraction, self.since) if self.estimate else None
            self.on_progress(p)


def execute(sweep: Sweep, on_progress: Callable[[Progress], None] | None = None,
            should_stop: Callable[[], bool] | None = None, poll_s: float = 0.05,
            cluster: quality.Cluster = quality.Cluster()) -> str:
    """Run the sweep's runs here, one after another (``Executor``); returns "finished" or "stopped"."""
    return Executor(sweep, on_progress, should_stop, poll_s, cluster).run()

def _started(entries: list[dict]) -> list[dict]:
    # state.json lists runs by plan index: those not started (yet, or again) have no run_dir.
    return entries[:max((i + 1 for i, e in enumerate(entries) if e.get("run_dir")), default=0)]


def _resumable(sweep: Sweep, repeats: int | None = None) -> None:
    """Refuses (ConfigError) a sweep that may not run again now; with ``repeats`` more seeds than it
    planned, a finished one may."""
    status = sweep.status()
    if status == RunStatus.RUNNING or status == RunStatus.FINISHED and repeats is None:
        raise ConfigError({"resume": f"sweep {sweep.id} is {status}: only a stopped or lost sweep "
                                     f"resumes, or any that ended with more seeds (--repeats N); "
                                     f"`commlab sweep --show {sweep.id}` prints its result"})
    _none_running(sweep.runs_root)
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
           cluster: quality.Cluster = quality.Cluster(), repeats: int | None = None) -> str:
    """Execute a stopped or lost sweep again here: its finished runs are kept, the rest run.
    ``repeats``: that many seeds per setting from now on (``add_seeds``), for a sweep whose seeds
    could not tell, finished or not."""
    _last_attempt_ended(sweep)
    with one_at_a_time(sweep.runs_root):
        _resumable(sweep, repeats)
        if repeats is not None:
            add_seeds(sweep, repeats)
        _write_state(sweep, status=RunStatus.RUNNING, **procs.identity(os.getpid()))
    return execute(sweep, on_progress, should_stop, cluster=cluster)


def start_resume(sweep: Sweep) -> Sweep:
    """``resume`` in a detached process (the UI)."""
    _last_attempt_ended(sweep)
    with one_at_a_time(sweep.runs_root):
        _resumable(sweep)
        _spawn(sweep)
    return sweep


def _spawn(sweep: Sweep) -> None:
    child = procs.spawn([sys.executable, "-m", "commlab.tune.sweep", str(sweep.path.resolve())],
                        log=sweep.file("sweep.log"), env=procs.package_env(), detached=True)
    _write_state(sweep, status=RunStatus.RUNNING, **procs.identity(child.pid))


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
