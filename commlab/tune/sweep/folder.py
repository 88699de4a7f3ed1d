"""A sweep's folder, ``<runs_dir>/sweeps/<sweep_id>/``: its plan (sweep.json), its state
(state.json), its stop flag and result; creating one, listing them, the claim that keeps one
running at a time."""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from commlab.config import ConfigError, RunConfig, default_runs_dir
from commlab.engine import claims, procs, run_folder, store
from commlab.engine.claims import SWEEPS
from commlab.engine.run_state import RunStatus
from commlab.tune import quality
from commlab.tune.sweep import table
from commlab.tune.sweep.progress import Progress, eta
from commlab.tune.sweep.spec import SweepSpec, grid, more_seeds, next_seed, plan_label

RESULT = "result.json"  # what the sweep found, written as it ends (``Sweep.report``)


# What sweep.json and state.json hold, as far as their readers rely on it (see store.load_json).
PLAN = {"spec": dict, "labels?": [str]}
# A run's run_dir: its folder relative to the runs folder the sweep sits in (``Sweep.run_path``).
STATE = {"status?": str, "index?": int, "runs?": [{"run_dir?": str, "status?": str}],
         "replaced?": [{"run_dir?": str, "status?": str}],
         "pid?": store.OPT_INT, "create_time?": store.OPT_NUM,
         "since?": {"time": store.NUM, "fraction": store.NUM, "paced?": store.NUM, "paced_fraction?": store.NUM},
         "estimate?": {"runs": int, "first_s": store.NUM, "run_s": store.NUM, "most_runs": int},
         "ended_at?": store.OPT_NUM,
         "error?": store.OPT_STR}


class Sweep(store.Folder):
    """One sweep's folder: its plan, its state, its runs."""

    MARKER = "sweep.json"

    def slurm(self):
        """The Slurm job each run is submitted as (``commlab.engine.slurm.SlurmJob``), or None: on this machine."""
        from commlab.engine.launchers.slurm import SlurmJob

        given = store.read_json(self.file("sweep.json"), {}).get("slurm")
        return SlurmJob(**given) if given else None

    @property
    def runs_root(self) -> Path:
        """The runs folder the sweep's folder sits in (``<runs_dir>/sweeps/<id>``), its runs beside it."""
        return self.path.parent.parent

    def run_path(self, stored: str) -> Path:
        """A run folder as state.json names it, relative to ``runs_root``: the sweep reads the same
        copied, moved or opened from another working folder.  Older sweeps stored it relative to
        the working folder they were made in (or absolute): read by its name in ``runs_root``."""
        stored_path = Path(stored)
        candidates = ([] if stored_path.is_absolute() else [self.runs_root / stored_path]) + \
            [self.runs_root / stored_path.name, stored_path]
        return next((p for p in candidates if p.exists()), candidates[0])

    def spec(self) -> SweepSpec:
        """The plan, its runs in ``runs_root`` wherever the sweep was made; ``store.Damaged`` when
        sweep.json is not one."""
        try:
            data = store.load_json(self.file("sweep.json"), PLAN)["spec"]
            return SweepSpec.from_dict({**data, "base": {**data["base"], "runs_dir": str(self.runs_root)}})
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
        """running | finished | stopped | failed (a run could not start: state.json's ``error``) |
        lost (the process answerable for it died without
        recording an end: the one that created it, then the one ``start`` spawned, then the one
        executing it)."""
        from commlab.engine.procs import alive

        state = self.state()
        status = state.get("status", RunStatus.RUNNING)
        if status == RunStatus.RUNNING and not alive(state.get("pid"), state.get("create_time")):
            return RunStatus.LOST
        return status

    def is_running(self) -> bool:
        return self.status() == RunStatus.RUNNING

    def stop_requested(self) -> bool:
        return self.file("stop").exists()

    def request_stop(self) -> None:
        """Ask the sweep to stop; its process stops the current run.  With no process left, do it here."""
        self.file("stop").touch()
        if self.status() == RunStatus.LOST:
            for run in self.runs():
                if run.status() in store.STOPPABLE:
                    run.stop()
            _write_state(self, status=RunStatus.STOPPED)

    def seconds_per_run(self) -> float | None:
        """This sweep's pace: its last execution's time over the runs that ended in it (start-up and
        each run's exit included); None before one ended."""
        state = self.state()
        since, ended_at = state.get("since"), state.get("ended_at")
        planned = len(store.read_json(self.file("sweep.json"), {}, PLAN).get("labels", []))
        ended = sum(e.get("status") not in (None, *store.GOING) for e in state.get("runs", []))
        ran = ended - round(since["fraction"] * planned) if since else 0
        if ran <= 0 or not ended_at or ended_at < since["time"]:  # none ended in it, or it is going
            return None
        return (ended_at - since["time"]) / ran

    def runs(self) -> list:
        from commlab.engine.launch import Run

        return [Run(self.run_path(e["run_dir"])) for e in self.state().get("runs", []) if e.get("run_dir")]

    def progress(self) -> Progress:
        """Where the sweep stands, read from its folder (for a page polling from another process)."""
        state, labels = self.state(), store.read_json(self.file("sweep.json"), {}, PLAN).get("labels", [])
        entries = state.get("runs", [])
        index = min(state.get("index", 0), max(len(labels) - 1, 0))
        entry = entries[index] if index < len(entries) else {}
        run_dir, status = entry.get("run_dir"), entry.get("status", RunStatus.STARTING)
        step = len(store.read_jsonl(self.run_path(run_dir) / "metrics.jsonl")) if run_dir else 0
        if run_dir and status == RunStatus.STARTING:  # the sweep records only a run's launch and its end
            status = run_folder.RunFolder(self.run_path(run_dir)).status()
        p = Progress(index, len(labels), labels[index] if labels else "",
                     status, step, self.spec().base.steps, self.status())
        p.eta_s = eta(p.fraction, state.get("since")) if p.sweep_status == RunStatus.RUNNING else None
        return p

    def results(self, tolerance_pct: float | None = None, cluster: quality.Cluster = quality.Cluster(),
                against: str | None = None):
        """One row per run started, in plan order (``table.results``)."""
        return table.results(self, tolerance_pct, cluster, against)

    def recommend(self, runs, tolerance_pct: float | None = None):
        """The recommendation on these runs of the sweep (``results``), its budget of sequential
        seeds in view (``pareto.recommend``'s ``most_seeds``); judged with the plan's tolerance
        unless told."""
        from commlab.tune import pareto

        spec = self.spec()
        return pareto.recommend(runs, spec.tolerance_pct if tolerance_pct is None else tolerance_pct,
                                most_seeds=spec.max_repeats)

    def report(self, cluster: quality.Cluster = quality.Cluster(), against: str | None = None) -> dict:
        """Every run, every setting over its seeds, the recommendation (``table.report``): what
        ``commlab sweep`` prints (``--json``) and ``result.json`` holds."""
        return table.report(self, cluster, against)

    def saved_report(self) -> dict | None:
        """``result.json`` as the sweep wrote it when it ended; None before."""
        return store.read_json(self.file(RESULT), None)

    def wait(self, timeout: float | None = None, poll_s: float = 0.5) -> str:
        procs.wait_until(lambda: not self.is_running(), timeout, poll_s)
        return self.status()


def add_seeds(sweep: Sweep, repeats: int) -> None:
    """Plan ``repeats`` seeds per setting where the sweep planned fewer: the runs lacking come after
    every planned run, which keep their places (and state.json its entries).  ConfigError for no
    more seeds than planned, or more than a sweep may have."""
    spec = sweep.spec()
    _replan(sweep, spec, more_seeds(spec, repeats))


def add_seed(sweep: Sweep, settings: list[int]) -> None:
    """Plan one more seed for the settings at these indices of a seed's runs (the sequential seeds:
    the open verdicts' settings and the baselines they are judged against), after every planned run."""
    spec = sweep.spec()
    _replan(sweep, spec, next_seed(spec, settings))


def _replan(sweep: Sweep, spec: SweepSpec, configs: list[RunConfig]) -> None:
    plan = store.read_json(sweep.file("sweep.json"), {})
    store.write_json(sweep.file("sweep.json"), {
        **plan, "spec": {**plan["spec"], "added": spec.added},
        "labels": [plan_label(c, spec) for c in configs]})


def list_sweeps(runs_dir: str | os.PathLike | None = None) -> list[Sweep]:
    """Every sweep under the runs folder, newest first."""
    root = Path(runs_dir or default_runs_dir()) / SWEEPS
    if not root.is_dir():
        return []
    return sorted((s for s in map(Sweep, root.iterdir()) if s.exists()),
                  key=lambda s: s.id, reverse=True)


def create(spec: SweepSpec, slurm=None) -> Sweep:
    """Validate the whole grid, then write the sweep's folder; raises ConfigError first.
    ``slurm``: its runs are Slurm jobs (``commlab.engine.slurm.SlurmJob``), one job per run."""
    configs = grid(spec)
    with one_at_a_time(spec.base.runs_dir):
        _none_running(spec.base.runs_dir)
        # Its reserve keeps room for state.json and result.json when a run fills the disk.
        sweep = Sweep(store.new_run_dir(Path(spec.base.runs_dir) / SWEEPS, "sweep"))
        # This process answers for the sweep until another executes it; sweep.json, the marker, last.
        store.write_json(sweep.file("state.json"), {"status": RunStatus.RUNNING, "index": 0, "runs": [],
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
    with claims.locked(Path(runs_dir) / SWEEPS / claims.SWEEP_CLAIM):
        yield


def _none_running(runs_dir) -> None:
    going = [s.id for s in list_sweeps(runs_dir) if s.status() == RunStatus.RUNNING]
    if going:
        raise ConfigError({"sweep": f"sweep {going[0]} is still running: two sweeps at once would "
                                    "share the cores and spoil each other's step times; stop it "
                                    "or let it finish first"})


def _write_state(sweep: Sweep, **changes) -> dict:
    # Read, change, replace, under a lock: the spawning process and the executing one both write.
    with claims.locked(sweep.file(claims.STATE_LOCK)):
        state = {**sweep.state(), **changes}
        store.write_json(sweep.file("state.json"), state)
    return state
