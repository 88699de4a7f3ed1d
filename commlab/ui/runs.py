"""Runs as the pages show them, without Streamlit: a LiveView reads only the metric lines added
since it last looked; the run picker's choices, the run table and the overlays are plain rows; a run
folder is deleted only after checks that it is one, that it sits in the runs folder, and that
nothing still writes to it."""
from __future__ import annotations

import functools
import shutil
import threading
from pathlib import Path

import numpy as np

from commlab.analysis import ledger, metrics
from commlab.config import default_runs_dir, label_of
from commlab.engine import claims, run_folder, status_file, store
from commlab.engine.launch import open_run, workers_alive
from commlab.engine.launchers.nodes import NODES
from commlab.engine.run_state import FINAL, GOING
from commlab.hook_specs import spec_of

# The live charts' points per line, however long the run (W&B shows at most 1,500 a line,
# TensorBoard keeps a 1,000-point reservoir): the history downsampled by min/max-preselected LTTB
# (tsdownsample), which keeps a spike's shape, and the latest steps every one.
CHART_POINTS = 1500
RECENT_POINTS = 300
CHARTED = ("loss", "step_s", "hook_s", "plain_bytes", "payload_bytes", "compression_ratio")
# What the headline reads of the steady steps (the step: an averaging hook's whole periods).
STEADY_FIGURES = ("step", "step_s", "payload_bytes", "plain_bytes")


def chart_rows(steps: np.ndarray, columns: dict[str, np.ndarray], points: int = CHART_POINTS,
               recent: int = RECENT_POINTS) -> np.ndarray:
    """The indices of the rows a chart draws: every row of a short run; of a long one, for each
    column the rows its downsampled history keeps, and the last ``recent`` rows, joined."""
    n = len(steps)
    if n <= points:
        return np.arange(n)
    head = n - recent
    from tsdownsample import NaNMinMaxLTTBDownsampler

    kept = [NaNMinMaxLTTBDownsampler().downsample(steps[:head], y[:head], n_out=points - recent).astype(np.int64)
            for y in columns.values()]
    return np.unique(np.concatenate([*kept, np.arange(head, n)]))


class LiveView:
    """One run as it goes: ``poll`` appends only the metric lines written since the last poll, and
    a refresh's work (``headline``, ``frame``) does not grow with the run's length."""

    def __init__(self, path: str | Path):
        self.run = open_run(path)
        self._tail = self.run.metrics_tail()
        self.rows: list[dict] = []
        self._steady = metrics.Columns(STEADY_FIGURES)  # metrics.steady_rows of rows, as they come
        self._first_steady = metrics.first_steady_step(self.run.config_dict())
        self._charted = metrics.Columns(("step", *CHARTED))
        self._evals_tail = self.run.evals_tail()
        self.evals: list[dict] = []  # the held-out evaluations so far (``RunFolder.evals``)

    def poll(self) -> int:
        new = self._tail.read_new()
        self.rows.extend(new)
        self._steady.extend([r for r in new if metrics.is_steady(r, self._first_steady)])
        self._charted.extend(new)
        self.evals.extend(self._evals_tail.read_new())
        return len(new)

    def status(self) -> dict:
        return self.run.listed_status_record()

    def pitfalls(self) -> list[str]:
        """PowerSGD's pitfalls rank 0 caught so far, one line each (``pitfall_lines``)."""
        return pitfall_lines(self.run.pitfalls())

    @property
    def skipped(self) -> int:
        """Lines of metrics.jsonl skipped so far: not step records (``store.step_check``)."""
        return self._tail.skipped

    def frame(self, bounded: bool = True):
        """The rows as a DataFrame; ``bounded``: only those the live charts draw (``chart_rows``)
        and only the charted columns, so that what a refresh builds and sends does not grow with
        the run."""
        import pandas as pd

        if not bounded:
            return pd.DataFrame(self.rows)
        columns = self._charted.arrays()
        if len(self.rows) <= CHART_POINTS:
            return pd.DataFrame(columns)
        kept = chart_rows(columns["step"], {k: v for k, v in columns.items() if k != "step"})
        return pd.DataFrame({k: v[kept] for k, v in columns.items()})

    def implementation(self) -> dict:
        """Which hook implementation ran and why (planned, until rank 0 reports it)."""
        meta, planned = self.run.meta(), self.run.launch_info()
        source = meta if meta.get("hook_impl") else planned
        impl = source.get("hook_impl")
        return {"ran": bool(meta.get("hook_impl")), "hook_impl": impl,
                "owner": {"stock": "PyTorch's", "commlab": "commlab's"}.get(impl, impl),
                "hook_reason": source.get("hook_reason"), "backend": source.get("backend"),
                "warning": planned.get("warning"), "loss": meta.get("loss")}

    def headline(self) -> dict:
        """The numbers above the charts: ``RunFolder.summary``'s (``metrics.headline``), from the
        rows seen so far."""
        rows, cfg = self.rows, self.run.config_dict()
        last = rows[-1] if rows else {}
        figures = metrics.headline(rows, cfg, steady=self._steady)
        return {"step": last.get("step"), "steps_planned": cfg.get("steps"),
                # steps count from 0: a run whose last step is 199 has done 200
                "steps_done": last["step"] + 1 if rows else 0,
                "loss": figures["final_loss"], "median_step_s": figures["median_step_s"],
                "bytes_per_step": figures["bytes_per_step"], "steady_steps": figures["steady_steps"],
                "plain_bytes_per_step": last.get("plain_bytes"),
                "compression_ratio": metrics.cumulative_compression_ratio(rows),
                "steady_compression_ratio": metrics.steady_compression_ratio(rows, cfg, self._steady),
                # the latest held-out evaluation and its step (None before the first)
                **run_folder.heldout(self.evals),
                "heldout_step": self.evals[-1]["step"] if self.evals else None}


# The ledger table's columns, as ledger.json's rows name them; the link's only on a run with an
# emulated link.
LEDGER_COLUMNS = ("traffic", "collective", "ranks", "size_bytes", "count", "total_s", "mean_s",
                  "algbw_gbytes_s", "busbw_gbytes_s", "bus_factor", "bytes", "counted_bytes")
LINK_COLUMNS = ("link_s", "link_wait_s", "link_share")


def ledger_view(path: str | Path) -> dict:
    """A run's communication ledger as its pages show it: the rows (``LEDGER_COLUMNS``, and the
    link's when it had one), the totals by traffic (``ledger.totals``), the step it was written
    after (None: the run has no ledger: instrument off, or no step yet) and what each traffic is."""
    written = run_folder.RunFolder(path).ledger()
    rows = written.get("rows", [])
    columns = LEDGER_COLUMNS + (LINK_COLUMNS if written.get("emulated_link") else ())
    return {"rows": [{k: r.get(k) for k in columns} for r in rows], "columns": columns,
            "totals": ledger.totals(rows), "step": written.get("step"),
            "emulated_link": bool(written.get("emulated_link")), "traffic": ledger.TRAFFIC}


def pitfall_lines(records: list[dict]) -> list[str]:
    """pitfalls.jsonl's records as the lines a warning lists: layer, step, what, the fix."""
    return [f"Step {r['step']}, layer {r['layer']}: {r['kind'].replace('_', ' ')}. {r['detail']}. "
            f"Fix: {r['fix']}." for r in records]


def run_choices(runs_dir: str | None = None) -> list[dict]:
    """Runs to offer in every run picker (path, label, status): those still going first, so that a
    reloaded page re-attaches to them, then the rest; newest first within each."""
    runs = [{"path": str(r.path), "label": picker_label(r), "status": listed_status(r)}
            for r in run_folder.list_runs(runs_dir or default_runs_dir())]
    return sorted(runs, key=lambda r: r["status"] not in GOING)  # sorted() is stable


def listed_status(run: run_folder.RunFolder) -> str:
    """Its status, or "damaged" when a file every listing reads is (``RunFolder.damage``)."""
    return run.listed_status_record()["status"]


def picker_label(run: run_folder.RunFolder) -> str:
    """A run folder as the run picker, the run table and the overlays name it: the name a person
    gave it, its settings and link (``config.label_of``: a top-k run's k, QSGD's levels...) and
    the run id's random tail, which tells twins apart."""
    name = run.notes()["name"]
    return f"{name + ': ' if name else ''}{label_of(run.config_dict(), link=True)} · {run.id[-4:]}"


# The run table's PowerSGD columns, by the setting each shows: empty for a run of a hook that
# never read them.
POWERSGD_COLUMNS = {"rank": "matrix_approximation_rank", "start_iter": "start_powerSGD_iter",
                    "min_compression_rate": "min_compression_rate",
                    "use_error_feedback": "use_error_feedback", "warm_start": "warm_start"}


def run_table(runs_dir: str | None = None) -> list[dict]:
    """One row per run: its settings, status and headline figures (``RunFolder.summary``), the
    name and note a person gave it and the sweep it belongs to ("" for none)."""
    runs_dir = runs_dir or default_runs_dir()
    sweeps = sweep_of(runs_dir)
    rows = []
    for run in run_folder.list_runs(runs_dir):
        cfg = run.config_dict()
        row = {**_summary(run), "label": picker_label(run), **run.notes(),
               "sweep": sweeps.get(str(run.path.resolve()), ""),
               "min_compression_rate": cfg.get("min_compression_rate"),
               "use_error_feedback": cfg.get("use_error_feedback"),
               "warm_start": cfg.get("warm_start"), "bucket_cap_mb": cfg.get("bucket_cap_mb"),
               "backend": run.launch_info().get("backend")}
        reads = spec_of(cfg).reads() if spec_of(cfg) else ()
        row |= {column: None for column, name in POWERSGD_COLUMNS.items() if name not in reads}
        rows.append(row)
    return rows


def sweep_of(runs_dir: str) -> dict[str, str]:
    """Resolved run folder -> the id of the sweep that started it."""
    from commlab.tune.sweep import list_sweeps

    out = {}
    for sweep in list_sweeps(runs_dir):
        for run in sweep.runs():
            out[str(run.path.resolve())] = sweep.id
    return out


def filter_rows(rows: list[dict], **chosen: list) -> list[dict]:
    """The rows whose value of each named column is among the chosen ones (none chosen: all)."""
    return [r for r in rows if all(not allowed or r.get(col) in allowed
                                   for col, allowed in chosen.items())]


def config_diff(a: str | Path, b: str | Path, every: bool = False) -> list[dict]:
    """Two runs' settings side by side, one row per setting (those that differ, or ``every``):
    setting, the first run's value, the second's."""
    ca, cb = run_folder.RunFolder(a).config_dict(), run_folder.RunFolder(b).config_dict()
    return [{"setting": k, "first": _cell(ca.get(k)), "second": _cell(cb.get(k)),
             "differs": ca.get(k) != cb.get(k)}
            for k in dict.fromkeys([*ca, *cb]) if every or ca.get(k) != cb.get(k)]


def _cell(v) -> str:
    # One text column: a table column of mixed types (a list, a bool, a number) shows none well.
    return "–" if v is None else ",".join(map(str, v)) if isinstance(v, list) else str(v)


def metrics_csv(path: str | Path) -> bytes:
    """A run's metrics.jsonl as CSV, one row per step, every field a column."""
    import pandas as pd

    return pd.DataFrame(run_folder.RunFolder(path).metrics_records()).to_csv(index=False).encode()


def _summary(run: run_folder.RunFolder) -> dict:
    # An ended run never changes again: its metrics are parsed once per version of its files.
    # A run still going is read on from where the last look stopped.
    path = str(run.path)
    if status_file.said(run.path).get("status") in FINAL:
        _going.pop(path, None)
        return dict(_final_summary(path, _version(run)))
    with _going_lock:  # pages of several sessions run in threads of one process
        if path not in _going:
            while len(_going) >= 64:  # runs that never ended (lost) must not pile up
                _going.pop(next(iter(_going)))
            _going[path] = (run.metrics_tail(run_folder.SUMMARY_FIELDS), [])
        tail, records = _going[path]
        records.extend(tail.read_new())
        return run.summary(list(records), tail.skipped)


_going: dict[str, tuple[store.JsonlTail, list[dict]]] = {}  # path -> the tail read so far
_going_lock = threading.Lock()


def _version(run: run_folder.RunFolder) -> tuple:
    def stamp(name: str) -> tuple:
        try:
            st = run.file(name).stat()
            return st.st_mtime_ns, st.st_size
        except OSError:
            return ()

    return tuple(stamp(n) for n in run_folder.LISTED)


@functools.lru_cache(maxsize=512)
def _final_summary(path: str, version: tuple) -> dict:
    return run_folder.RunFolder(path).summary()


def overlay(paths: list[str]) -> dict:
    """label -> a DataFrame of the run's metrics with sent_bytes, the cumulative hook payload
    (when the run was instrumented), for overlaying runs against step, wall time and bytes."""
    out = {}
    for path in paths:
        run = run_folder.RunFolder(path)
        df = _overlay_frame(str(run.path), _version(run))
        if df is not None:
            out[picker_label(run)] = df.copy()
    return out


OVERLAY_FIELDS = ("step", "loss", "t", "payload_bytes")
OVERLAY_POINTS = 4000  # per run


@functools.lru_cache(maxsize=32)
def _overlay_frame(path: str, version: tuple):
    import pandas as pd

    df = pd.DataFrame(run_folder.RunFolder(path).metrics_records(OVERLAY_FIELDS))
    if df.empty:
        return None
    if "payload_bytes" in df:
        df["sent_bytes"] = df["payload_bytes"].cumsum()
    return _thinned(df)


def _thinned(df):
    """Every k-th row and the last, at most about OVERLAY_POINTS: a chart of a million points
    shows no more than one of a few thousand, and takes the browser seconds."""
    stride = -(-len(df) // OVERLAY_POINTS)
    return df if stride == 1 else df.iloc[sorted({*range(0, len(df), stride), len(df) - 1})]


def delete_run(path: str | Path, runs_dir: str | None = None) -> None:
    """Delete one run folder; refuses (ValueError) anything that is not a finished-with run
    folder directly inside the runs folder, and a folder that holds what is not that run's."""
    p = Path(path)
    root = Path(runs_dir or default_runs_dir()).resolve()
    if p.is_symlink() or p.resolve().parent != root:
        raise ValueError(f"{p} is not a folder directly inside the runs folder {root}; "
                         "nothing was deleted")
    if p.name in claims.LAB_FOLDERS:
        raise ValueError(f"{p} is {claims.LAB_FOLDERS[p.name]}, not a run's; nothing was deleted")
    run = run_folder.RunFolder(p.resolve())
    if not run.exists():
        raise ValueError(f"{p} is not a commlab run folder (no config.json); nothing was deleted")
    if others := _others_inside(run.path):
        raise ValueError(f"{p} holds what is not its run's ({', '.join(others[:3])}: another run's "
                         "or a sweep's); nothing was deleted")
    if run.status() in GOING:
        raise ValueError(f"run {run.id} is still running: stop it first")
    if workers_alive(store.read_json(run.file("supervisor.json"), {})):
        raise ValueError(f"run {run.id} has worker processes still alive: stop it first")
    shutil.rmtree(run.path)


def _others_inside(path: Path) -> list[str]:
    """The folders in a run folder that are another run's or a sweep's (their own config.json,
    sweep.json or state.json); a run of several nodes keeps its nodes' records in nodes/."""
    return sorted(d.name for d in path.iterdir() if d.is_dir() and not d.is_symlink() and d.name != NODES
                  and any((d / name).exists() for name in ("config.json", "sweep.json", "state.json")))
