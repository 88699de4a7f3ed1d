"""A PowerSGD sweep: a grid of settings beside a plain allreduce baseline, run one after another.

    python -m commlab.tune.sweep SWEEP_DIR      (started detached by ``start``, for the UI)

Every run is an ordinary run in the runs folder (its own run folder, listed with the others); the
sweep keeps its plan and its state in ``<runs_dir>/sweeps/<sweep_id>/``:

  sweep.json   the spec and the planned labels       state.json   status, current index, run folders
  stop         present once a stop was asked for     sweep.log    the detached process's output

Runs go one at a time: run together they would share the cores and spoil each other's timings.
Between polls the executor reads the stop flag; on a stop it stops the current run (``Run.stop``),
starts no other, and keeps every finished run.  A stop asked of a sweep whose process is gone
stops its current run directly.

The analysis is pure: ``summarize`` turns a run's metrics into one row; ``commlab.tune.pareto``
marks the settings nothing beats on both axes and applies the recommendation's rule.
"""
from __future__ import annotations

import fcntl
import itertools
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from commlab.analysis import metrics
from commlab.config import (
    POWERSGD_HOOKS,
    ConfigError,
    RunConfig,
    Setting,
    default_runs_dir,
    is_plain_allreduce,
    settings,
)
from commlab.engine import procs, store
from commlab.tune.pareto import mark
from commlab.tune.whatif import config_link_label, run_label

SWEEPS = "sweeps"
FINAL_WINDOW = 5  # final loss: mean over this many last steps


# The sweep axes: the settings the table marks sweepable.  PowerSGD's own settings come first, in
# PowerSGDState's order, the wrapper last: the order of the grid's runs.
AXES = tuple(sorted((s for s in settings() if s.sweepable), key=lambda s: s.group != "powersgd"))


@dataclass(init=False)
class SweepSpec:
    """The grid: every combination of the values listed per axis, each on top of ``base``.

    An axis the table gives default values (the rank: 1, 2, 4) takes those unless told; the other
    axes take base's value.  ``SweepSpec(matrix_approximation_rank=[1, 2], wrapper=["none",
    "fp16"])`` names the axes as RunConfig names the settings.
    """

    base: RunConfig
    values: dict[str, list]  # axis -> the values listed, by AXES
    baseline: bool  # run plain allreduce first, with the same job and link
    tolerance_pct: float  # the recommendation's X

    def __init__(self, base: RunConfig | None = None, baseline: bool = True,
                 tolerance_pct: float = 5.0, **values: list):
        unknown = sorted(set(values) - {s.name for s in AXES})
        if unknown:
            raise TypeError(f"not a sweep axis: {', '.join(unknown)}; the axes are: "
                            f"{', '.join(s.name for s in AXES)}")
        self.base = RunConfig() if base is None else base
        self.values = {s.name: list(values.get(s.name, s.sweep)) for s in AXES}
        self.baseline, self.tolerance_pct = baseline, tolerance_pct

    def axes(self) -> dict[str, list]:
        """Each axis' values, repeats dropped; an axis with no default values falls back to base's."""
        return {s.name: _unique(self.values[s.name]) or ([] if s.sweep else [getattr(self.base, s.name)])
                for s in AXES}

    def to_dict(self) -> dict:
        return {"base": self.base.to_dict(), **self.values, "baseline": self.baseline,
                "tolerance_pct": self.tolerance_pct}

    @classmethod
    def from_dict(cls, data: dict) -> SweepSpec:
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
    """Every run of the sweep in order, baseline first; raises ConfigError before anything starts."""
    errs: dict[str, str] = {}
    axes = spec.axes()
    for name, values in axes.items():
        if not values:
            errs[name] = "give at least one value"
    for s in AXES:
        bad = [v for v in axes[s.name] if s.choices and v not in s.choices]
        if bad:
            errs[s.name] = f"unknown {s.name}(s) {bad}; valid {s.name}s are: {', '.join(s.choices)}"
    if not (math.isfinite(spec.tolerance_pct) and spec.tolerance_pct >= 0):
        errs["tolerance_pct"] = f"must be 0 or a positive percentage, got {spec.tolerance_pct}"
    if errs:
        raise ConfigError(errs)
    hook = spec.base.hook if spec.base.hook in POWERSGD_HOOKS else "powersgd"
    configs = [spec.base.with_overrides(hook="allreduce", wrapper="none")] if spec.baseline else []
    for combination in itertools.product(*axes.values()):
        configs.append(spec.base.with_overrides(hook=hook, **dict(zip(axes, combination))))
    for cfg in configs:
        for key, msg in cfg.errors().items():
            errs.setdefault(key, f"{run_label(cfg.to_dict())}: {msg}")
    if errs:
        raise ConfigError(errs)
    return configs


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

    @property
    def fraction(self) -> float:
        done = self.index + (min(self.step, self.steps) / self.steps if self.steps else 0.0)
        return min(1.0, done / self.total) if self.total else 1.0

    def line(self) -> str:
        return (f"[{self.index + 1}/{self.total}] {self.label}: {self.run_status}, "
                f"step {self.step}/{self.steps}")


# ============================================================================ the sweep folder
# What sweep.json and state.json hold, as far as their readers rely on it (see store.load_json).
PLAN = {"spec": dict, "labels?": [str]}
STATE = {"status?": str, "index?": int, "runs?": [{"run_dir?": str, "status?": str}],
         "pid?": store.OPT_INT, "create_time?": store.OPT_NUM}


class Sweep(store.Folder):
    """One sweep's folder: its plan, its state, its runs."""

    MARKER = "sweep.json"

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
        run_dir = entry.get("run_dir")
        step = len(store.read_jsonl(Path(run_dir) / "metrics.jsonl")) if run_dir else 0
        return Progress(index, len(labels), labels[index] if labels else "",
                        entry.get("status", "starting"), step, self.spec().base.steps, self.status())

    def results(self):
        """One row per run started, in plan order (a pandas DataFrame), Pareto fronts marked."""
        import pandas as pd

        rows = [summarize(r.metrics_records(), r.config_dict(), r.status(), r.id, str(r.path))
                for r in self.runs()]
        return mark(pd.DataFrame(rows, columns=ROW_COLUMNS))

    def wait(self, timeout: float | None = None, poll_s: float = 0.5) -> str:
        procs.wait_until(lambda: not self.is_running(), timeout, poll_s)
        return self.status()


def list_sweeps(runs_dir: str | os.PathLike | None = None) -> list[Sweep]:
    """Every sweep under the runs folder, newest first."""
    root = Path(runs_dir or default_runs_dir()) / SWEEPS
    if not root.is_dir():
        return []
    return sorted((s for s in map(Sweep, root.iterdir()) if s.exists()),
                  key=lambda s: s.id, reverse=True)


def create(spec: SweepSpec) -> Sweep:
    """Validate the whole grid, then write the sweep's folder; raises ConfigError first."""
    configs = grid(spec)
    going = [s.id for s in list_sweeps(spec.base.runs_dir) if s.status() == "running"]
    if going:
        raise ConfigError({"sweep": f"sweep {going[0]} is still running: two sweeps at once would "
                                    "share the cores and spoil each other's step times; stop it "
                                    "or let it finish first"})
    sweep = Sweep(store.new_run_dir(Path(spec.base.runs_dir) / SWEEPS, "sweep", reserve=False))
    # This process answers for the sweep until another executes it; sweep.json, the marker, last.
    store.write_json(sweep.file("state.json"), {"status": "running", "index": 0, "runs": [],
                                                **procs.identity(os.getpid())})
    store.write_json(sweep.file("sweep.json"), {
        "spec": spec.to_dict(), "labels": [run_label(c.to_dict()) for c in configs],
        "created_at": time.time()})
    return sweep


def _write_state(sweep: Sweep, **changes) -> dict:
    # Read, change, replace, under a lock: the spawning process and the executing one both write.
    with open(sweep.file(".state.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = {**sweep.state(), **changes}
        store.write_json(sweep.file("state.json"), state)
    return state


def execute(sweep: Sweep, on_progress: Callable[[Progress], None] | None = None,
            should_stop: Callable[[], bool] | None = None, poll_s: float = 0.5) -> str:
    """Run the sweep's runs here, one after another; returns "finished" or "stopped".

    ``should_stop`` is asked between polls beside the stop flag (a CLI's Ctrl-C, a test).
    """
    from commlab.engine.launch import start as launch

    configs = sweep.configs()
    labels = [run_label(c.to_dict()) for c in configs]
    _write_state(sweep, status="running", **procs.identity(os.getpid()))
    entries: list[dict] = []
    stopped = False

    def stopping() -> bool:
        return sweep.stop_requested() or bool(should_stop and should_stop())

    def report(i: int, status: str, step: int) -> None:
        if on_progress:
            on_progress(Progress(i, len(configs), labels[i], status, step, configs[i].steps, "running"))

    for i, cfg in enumerate(configs):
        if stopped or stopping():
            stopped = True
            break
        report(i, "starting", 0)
        run = launch(cfg, request_id=f"{sweep.id}-{i}")
        entries.append({"label": labels[i], "run_dir": str(run.path), "status": run.status()})
        _write_state(sweep, index=i, runs=entries)

        def look(run=run, i=i) -> bool:
            """True once the run has ended, or was stopped here."""
            nonlocal stopped
            status = run.status()
            if status not in store.GOING:
                return True
            if stopping():
                stopped = True
                run.stop()
                return True
            report(i, status, len(run.metrics_records()))
            return False

        procs.wait_until(look, interval=poll_s)
        status = run.wait()
        entries[i]["status"] = status
        _write_state(sweep, runs=entries)
        report(i, status, len(run.metrics_records()))
    final = "stopped" if stopped else "finished"
    _write_state(sweep, status=final, ended_at=time.time())
    return final


def run_sweep(spec: SweepSpec, on_progress: Callable[[Progress], None] | None = None,
              should_stop: Callable[[], bool] | None = None) -> Sweep:
    """Create and execute a sweep in this process (notebooks, scripts, the CLI)."""
    sweep = create(spec)
    execute(sweep, on_progress, should_stop)
    return sweep


def start(spec: SweepSpec) -> Sweep:
    """Create a sweep and execute it in a detached process, which outlives the caller (the UI);
    that process answers for the sweep from the moment it is spawned."""
    from commlab.engine import workload_probe
    workload_probe.check(spec.base)  # its runs share the base's workload: refused before any starts
    sweep = create(spec)
    child = procs.spawn([sys.executable, "-m", "commlab.tune.sweep", str(sweep.path.resolve())],
                        log=sweep.file("sweep.log"), env=procs.package_env(), detached=True)
    _write_state(sweep, **procs.identity(child.pid))
    return sweep


# ============================================================================ analysis (pure)
ROW_COLUMNS = ["label", "run_id", "run_dir", "status", "baseline", "hook", "wrapper",
               "matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate",
               "steps", "final_loss", "bytes_per_step", "time_s", "median_step_s", "link"]


def summarize(records: list[dict], cfg: dict, status: str, run_id: str = "", run_dir: str = "",
              final_window: int = FINAL_WINDOW) -> dict:
    """One sweep row from a run's metrics: its headline (``commlab.analysis.metrics.headline``),
    two of its figures read over other windows, for the comparison a sweep makes.

    final_loss: the mean loss of the last ``final_window`` steps, not the last step's alone, so that
    one noisy batch does not rank the runs; every run draws the same batches (they depend only on
    the seed), so runs are compared on the same data.  bytes_per_step: all the bytes the hook
    handed over, divided by the steps, not the steady median: ``start_powerSGD_iter`` is an axis,
    and its allreduce steps are part of what a setting costs.  time_s: training time to the last
    step, start-up excluded.  median_step_s: over the steady steps, as in the run's headline.
    """
    figures = metrics.headline(records, cfg, final_window, bytes_over_run=True)
    return {
        "label": run_label(cfg), "run_id": run_id, "run_dir": run_dir, "status": status,
        "baseline": is_plain_allreduce(cfg),
        "hook": cfg.get("hook"), "wrapper": cfg.get("wrapper"),
        "matrix_approximation_rank": cfg.get("matrix_approximation_rank"),
        "start_powerSGD_iter": cfg.get("start_powerSGD_iter"),
        "min_compression_rate": cfg.get("min_compression_rate"), "steps": len(records),
        "final_loss": figures["final_loss"], "bytes_per_step": figures["bytes_per_step"],
        "time_s": records[-1]["t"] if records else None, "median_step_s": figures["median_step_s"],
        "link": config_link_label(cfg) or "loopback",
    }


if __name__ == "__main__":
    execute(Sweep(sys.argv[1]))
