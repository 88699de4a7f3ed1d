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

The analysis is pure: ``summarize`` turns a run's metrics into one row, ``pareto_front`` marks the
settings nothing beats on both axes, ``recommend`` applies the stated rule.
"""
from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from commlab.config import POWERSGD_HOOKS, WRAPPERS, ConfigError, RunConfig, default_runs_dir
from commlab.engine import store
from commlab.tune.whatif import cfg_label, config_link_label

SWEEPS = "sweeps"
FINAL_WINDOW = 5  # final loss: mean over this many last steps


@dataclass
class SweepSpec:
    """The grid: every combination of the listed values, each on top of ``base``."""

    base: RunConfig = field(default_factory=RunConfig)
    matrix_approximation_rank: list[int] = field(default_factory=lambda: [1, 2, 4])
    start_powerSGD_iter: list[int] = field(default_factory=list)  # empty: base's value
    min_compression_rate: list[float] = field(default_factory=list)  # empty: base's value
    wrapper: list[str] = field(default_factory=list)  # empty: base's value
    baseline: bool = True  # run plain allreduce first, with the same job and link
    tolerance_pct: float = 5.0  # the recommendation's X

    def axes(self) -> dict[str, list]:
        b = self.base
        return {"matrix_approximation_rank": _unique(self.matrix_approximation_rank),
                "start_powerSGD_iter": _unique(self.start_powerSGD_iter) or [b.start_powerSGD_iter],
                "min_compression_rate": _unique(self.min_compression_rate) or [b.min_compression_rate],
                "wrapper": _unique(self.wrapper) or [b.wrapper]}

    def to_dict(self) -> dict:
        return {**asdict(self), "base": self.base.to_dict()}

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


def _unique(values) -> list:
    return list(dict.fromkeys(values))


def grid(spec: SweepSpec) -> list[RunConfig]:
    """Every run of the sweep in order, baseline first; raises ConfigError before anything starts."""
    errs: dict[str, str] = {}
    axes = spec.axes()
    for name, values in axes.items():
        if not values:
            errs[name] = "give at least one value"
    bad = [w for w in axes["wrapper"] if w not in WRAPPERS]
    if bad:
        errs["wrapper"] = f"unknown wrapper(s) {bad}; valid wrappers are: {', '.join(WRAPPERS)}"
    if not (math.isfinite(spec.tolerance_pct) and spec.tolerance_pct >= 0):
        errs["tolerance_pct"] = f"must be 0 or a positive percentage, got {spec.tolerance_pct}"
    if errs:
        raise ConfigError(errs)
    hook = spec.base.hook if spec.base.hook in POWERSGD_HOOKS else "powersgd"
    configs = [spec.base.with_overrides(hook="allreduce", wrapper="none")] if spec.baseline else []
    for rank, start, rate, wrapper in itertools.product(*axes.values()):
        configs.append(spec.base.with_overrides(
            hook=hook, matrix_approximation_rank=rank, start_powerSGD_iter=start,
            min_compression_rate=rate, wrapper=wrapper))
    for cfg in configs:
        for key, msg in cfg.errors().items():
            errs.setdefault(key, f"{cfg_label(cfg.to_dict())}: {msg}")
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
class Sweep(store.Folder):
    """One sweep's folder: its plan, its state, its runs."""

    MARKER = "sweep.json"

    def spec(self) -> SweepSpec:
        return SweepSpec.from_dict(store.read_json(self.file("sweep.json"))["spec"])

    def configs(self) -> list[RunConfig]:
        return grid(self.spec())

    def state(self) -> dict:
        return store.read_json(self.file("state.json"), {})

    def status(self) -> str:
        """running | finished | stopped | lost (the process died without recording an end)."""
        from commlab.engine.procs import alive

        state = self.state()
        status = state.get("status", "running")
        if status == "running" and not alive(state.get("pid"), state.get("create_time")):
            started = store.read_json(self.file("sweep.json"), {}).get("created_at", 0)
            return "running" if not state.get("pid") and time.time() - started < 30 else "lost"
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
                if run.status() in ("running", "lost"):
                    run.stop()
            _write_state(self, status="stopped")

    def runs(self) -> list:
        from commlab.engine.launch import Run

        return [Run(e["run_dir"]) for e in self.state().get("runs", []) if e.get("run_dir")]

    def progress(self) -> Progress:
        """Where the sweep stands, read from its folder (for a page polling from another process)."""
        state, labels = self.state(), store.read_json(self.file("sweep.json"), {}).get("labels", [])
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
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_running() and (deadline is None or time.monotonic() < deadline):
            time.sleep(poll_s)
        return self.status()


def list_sweeps(runs_dir: str | os.PathLike | None = None) -> list[Sweep]:
    """Every sweep under the runs folder, newest first."""
    root = Path(runs_dir or default_runs_dir()) / SWEEPS
    if not root.is_dir():
        return []
    return sorted((Sweep(p) for p in root.iterdir() if (p / "sweep.json").exists()),
                  key=lambda s: s.id, reverse=True)


def create(spec: SweepSpec) -> Sweep:
    """Validate the whole grid, then write the sweep's folder; raises ConfigError first."""
    configs = grid(spec)
    going = [s.id for s in list_sweeps(spec.base.runs_dir) if s.status() == "running"]
    if going:
        raise ConfigError({"sweep": f"sweep {going[0]} is still running: two sweeps at once would "
                                    "share the cores and spoil each other's step times; stop it "
                                    "or let it finish first"})
    sweep = Sweep(store.new_run_dir(Path(spec.base.runs_dir) / SWEEPS, "sweep"))
    store.write_json(sweep.file("sweep.json"), {
        "spec": spec.to_dict(), "labels": [run_label(c.to_dict()) for c in configs],
        "created_at": time.time()})
    store.write_json(sweep.file("state.json"), {"status": "running", "index": 0, "runs": []})
    return sweep


def _write_state(sweep: Sweep, **changes) -> dict:
    state = {**sweep.state(), **changes}
    store.write_json(sweep.file("state.json"), state)
    return state


def execute(sweep: Sweep, on_progress: Callable[[Progress], None] | None = None,
            should_stop: Callable[[], bool] | None = None, poll_s: float = 0.5) -> str:
    """Run the sweep's runs here, one after another; returns "finished" or "stopped".

    ``should_stop`` is asked between polls beside the stop flag (a CLI's Ctrl-C, a test).
    """
    import psutil

    from commlab.engine.launch import start as launch

    me = psutil.Process()
    configs = sweep.configs()
    labels = [run_label(c.to_dict()) for c in configs]
    _write_state(sweep, status="running", pid=me.pid, create_time=me.create_time())
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
        entries.append({"label": labels[i], "run_dir": str(run.path), "status": "running"})
        _write_state(sweep, index=i, runs=entries)
        while run.is_running():
            if stopping():
                stopped = True
                run.stop()
                break
            report(i, "running", len(run.metrics_records()))
            time.sleep(poll_s)
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
    """Create a sweep and execute it in a detached process, which outlives the caller (the UI)."""
    from commlab.engine.launch import worker_env

    sweep = create(spec)
    with open(sweep.file("sweep.log"), "ab") as log:
        subprocess.Popen([sys.executable, "-m", "commlab.tune.sweep", str(sweep.path.resolve())],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         env=worker_env(spec.base), start_new_session=True, close_fds=True)
    deadline = time.monotonic() + 30
    while not sweep.state().get("pid") and time.monotonic() < deadline:
        time.sleep(0.05)
    return sweep


# ============================================================================ analysis (pure)
ROW_COLUMNS = ["label", "run_id", "run_dir", "status", "baseline", "hook", "wrapper",
               "matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate",
               "steps", "final_loss", "bytes_per_step", "time_s", "median_step_s", "link"]


def run_label(cfg: dict) -> str:
    link = config_link_label(cfg)
    return cfg_label(cfg) + (f" [{link}]" if link else "")


def summarize(records: list[dict], cfg: dict, status: str, run_id: str = "", run_dir: str = "",
              final_window: int = FINAL_WINDOW) -> dict:
    """One sweep row from a run's metrics.

    final_loss: the mean loss of the last ``final_window`` steps; every run draws the same batches
    (they depend only on the seed), so runs are compared on the same data.  bytes_per_step: all the
    bytes the hook handed over, divided by the steps (the allreduce steps before
    ``start_powerSGD_iter`` count).  time_s: training time to the last step, start-up excluded.
    """
    import statistics

    tail = records[-final_window:]
    losses = [r["loss"] for r in tail]
    steady = records[1:] or records
    return {
        "label": run_label(cfg), "run_id": run_id, "run_dir": run_dir, "status": status,
        "baseline": cfg.get("hook") == "allreduce" and cfg.get("wrapper") == "none",
        "hook": cfg.get("hook"), "wrapper": cfg.get("wrapper"),
        "matrix_approximation_rank": cfg.get("matrix_approximation_rank"),
        "start_powerSGD_iter": cfg.get("start_powerSGD_iter"),
        "min_compression_rate": cfg.get("min_compression_rate"), "steps": len(records),
        "final_loss": sum(losses) / len(losses) if losses else None,
        "bytes_per_step": (sum(r.get("payload_bytes", 0) for r in records) / len(records)
                           if records and "payload_bytes" in records[0] else None),
        "time_s": records[-1]["t"] if records else None,
        "median_step_s": statistics.median(r["step_s"] for r in steady) if steady else None,
        "link": config_link_label(cfg) or "loopback",
    }


def comparable(df):
    """Rows that may enter the front and the recommendation: finished, finite loss, bytes counted."""
    import numpy as np

    loss = df["final_loss"].astype(float)
    return (df["status"] == "finished") & np.isfinite(loss) & df["bytes_per_step"].notna()


def pareto_front(xs: list[float], ys: list[float]) -> list[bool]:
    """Which points no other point beats on both (smaller is better on both axes)."""
    return [not any((xj <= xi and yj <= yi) and (xj < xi or yj < yi)
                    for j, (xj, yj) in enumerate(zip(xs, ys)) if j != i)
            for i, (xi, yi) in enumerate(zip(xs, ys))]


def mark(df):
    """Add ``pareto_bytes`` and ``pareto_time``: on the front of final loss against that axis."""
    df = df.copy()
    ok = comparable(df)
    for col, axis in (("pareto_bytes", "bytes_per_step"), ("pareto_time", "time_s")):
        df[col] = False
        sub = df[ok]
        if len(sub):
            df.loc[sub.index, col] = pareto_front(sub[axis].astype(float).tolist(),
                                                  sub["final_loss"].astype(float).tolist())
    return df


@dataclass
class Recommendation:
    rule: str
    run_id: str | None
    label: str | None
    text: str
    bytes_per_step: float | None = None
    final_loss: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def recommend(df, tolerance_pct: float) -> Recommendation:
    """The fewest bytes per step among runs whose final loss is within X% of allreduce's."""
    rule = (f"fewest bytes per step among finished runs whose final loss is within "
            f"{tolerance_pct:g}% of the allreduce baseline's")
    ok = df[comparable(df)]
    base = ok[ok["baseline"].astype(bool)]
    if not len(base):
        return Recommendation(rule, None, None, "no finished allreduce baseline to compare with: "
                              "run the sweep with its baseline")
    base_loss, base_bytes = float(base["final_loss"].iloc[0]), float(base["bytes_per_step"].iloc[0])
    limit = base_loss + abs(base_loss) * tolerance_pct / 100
    within = ok[ok["final_loss"].astype(float) <= limit]
    best = within.sort_values(["bytes_per_step", "final_loss"]).iloc[0]
    if best["baseline"]:
        return Recommendation(rule, best["run_id"], best["label"],
                              f"keep allreduce: no compressed setting came within {tolerance_pct:g}% "
                              f"of its final loss {base_loss:.4g}; raise X or start PowerSGD later",
                              float(best["bytes_per_step"]), float(best["final_loss"]))
    loss = float(best["final_loss"])
    change = (loss - base_loss) / abs(base_loss) * 100 if base_loss else 0.0
    return Recommendation(
        rule, best["run_id"], best["label"],
        f"{best['label']}: {best['bytes_per_step']:,.0f} bytes per step, "
        f"{base_bytes / best['bytes_per_step']:.1f}x fewer than allreduce, final loss {loss:.4g} "
        f"({change:+.1f}% against allreduce's {base_loss:.4g})",
        float(best["bytes_per_step"]), loss)


if __name__ == "__main__":
    execute(Sweep(sys.argv[1]))
