"""What the lab's pages need from runs, without Streamlit (notebooks may use it as well).

Form values become a checked RunConfig with one message per field; a launch is idempotent
across browser tabs; a LiveView reads only the metric lines added since it last looked; the run
table, the overlays and the bucket layouts are plain rows; a run folder is deleted only after
checks that it is one, that it sits in the runs folder, and that nothing still writes to it.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import secrets
import shutil
import statistics
from pathlib import Path

from commlab import api
from commlab.config import ConfigError, RunConfig, default_runs_dir, label_of
from commlab.engine import store
from commlab.engine.launch import workers_alive

MIB = 1024 * 1024  # DDP's bucket_cap_mb counts MiB

# Help texts for the form; the PowerSGD ones carry the tuning advice of PowerSGDState's docstring.
HELP = {
    "hook": "The communication hook DDP calls for every gradient bucket instead of its allreduce.",
    "wrapper": "A compress wrapper casts each bucket to fp16/bf16 around the hook and back.",
    "impl": "auto: PyTorch's hook wherever it works on this backend, commlab's Gloo-safe variant "
            "where it does not. stock: PyTorch's always (it may hang or fail). commlab: "
            "commlab's variant wherever one exists.",
    "matrix_approximation_rank": "The rank r of P and Q: lower compresses more. Start at 1 and "
            "double (1, 2, 4, ...) until the loss is good enough; usually 1-4 suffices "
            "(some NLP tasks needed 32). Higher ranks cost compute and may not help.",
    "start_powerSGD_iter": "Plain allreduce until this step, PowerSGD after: early training is "
            "sensitive to inexact gradients. Start at about 10% of the steps and raise it until "
            "the loss is good enough; with a warm-up, no fewer than the warm-up steps. At least "
            "2 with error feedback or warm start (DDP rebuilds its buckets after step 0).",
    "min_compression_rate": "A gradient viewed as an n x m matrix is compressed only when "
            "(n + m) * r * min_compression_rate < n * m; otherwise it is allreduced uncompressed. "
            "A 1-D tensor of length k is k x 1: never compressed at a rate of 1 or more (torch "
            "2.13 compresses it below 1).",
    "use_error_feedback": "Keep what compression lost and add it to the next step's gradient.",
    "warm_start": "Reuse last step's Q as the start of this step's power iteration.",
    "orthogonalization_epsilon": "Added to each column norm when orthogonalizing P, against "
            "division by zero (e.g. 1e-8); 0 is best for accuracy when no column is all zeros.",
    "random_seed": "Seeds the random initial Q (the same on every rank).",
    "batch_tensors_with_same_shape": "Compress same-shaped tensors in one batched operation; "
            "raise the bucket cap so more of them share a bucket. Helps when compression compute "
            "is the bottleneck.",
    "workload": "A built-in model and data, or your own module:function returning (model, "
                "batches); the module is imported from the folder the lab started in.",
    "world_size": "Processes (ranks) torchrun starts; NCCL needs one GPU per rank.",
    "backend": "auto: NCCL when there is a GPU per rank, Gloo on the CPU otherwise.",
    "bucket_cap_mb": "DDP's bucket_cap_mb: it starts a new bucket once one reaches this many MiB.",
    "steps": "Training steps; each writes one line of metrics.",
    "error_every": "Measure the approximation error against the exact mean gradient every K "
                   "steps (one extra allreduce, counted apart); 0 = never.",
    "save_grads_at": "Steps whose exact mean gradients are saved, comma-separated.",
    "stall_timeout_s": "The run is called stalled when no step completes for this long.",
    "emulate_bandwidth_gbps": "Hold each collective back as if the link moved this many Gb/s "
                              "(0 = off).",
    "emulate_latency_us": "Add this latency per ring hop to each collective (0 = off).",
}


# ---------------------------------------------------------------------------- the form
def config_from_form(values: dict) -> tuple[RunConfig | None, dict[str, str]]:
    """(config, errors by field): the config is None when a value has the wrong type."""
    try:
        cfg = RunConfig.from_dict(values, "the form")
    except ConfigError as e:
        return None, e.errors
    return cfg, cfg.errors()


def preview(cfg: RunConfig) -> dict:
    """Before launch: the backend and hook implementation this machine would use, and why."""
    from commlab.engine.launch import resolve_backend
    from commlab.hooks import registry

    backend, backend_reason = resolve_backend(cfg)
    impl, reason = registry.plan(cfg, backend)
    return {"backend": backend, "backend_reason": backend_reason, "hook_impl": impl,
            "hook_reason": reason, "warning": registry.stock_warning(cfg, backend)}


def new_draft() -> str:
    return secrets.token_hex(4)


def request_id(cfg: RunConfig, draft: str) -> str:
    """Stable for one submission of one form: the same settings from the same draft."""
    digest = hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode()).hexdigest()
    return f"{draft}-{digest[:12]}"


def launch(cfg: RunConfig, request_id: str | None = None) -> tuple[api.Run, bool]:
    """Start a run, or return the one already going with exactly these settings.

    Returns (run, started).  Browser tabs are separate sessions that share nothing but the runs
    folder, so the check and the start happen under a lock file there: two tabs that submit the
    same settings at once get one run.
    """
    with _runs_lock(cfg.runs_dir):
        for run in api.list_runs(cfg.runs_dir):
            if run.is_running() and run.config_dict() == cfg.to_dict():
                return run, False
        return api.launch(cfg, request_id), True


@contextlib.contextmanager
def _runs_lock(runs_dir: str):
    Path(runs_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(runs_dir) / ".launch.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------- watching
class LiveView:
    """One run as it goes: ``poll`` appends only the metric lines written since the last poll."""

    def __init__(self, path: str | Path):
        self.run = api.open_run(path)
        self._tail = store.JsonlTail(self.run.file("metrics.jsonl"))
        self.rows: list[dict] = []

    def poll(self) -> int:
        new = self._tail.read_new()
        self.rows.extend(new)
        return len(new)

    def status(self) -> dict:
        return self.run.status_record()

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows)

    def implementation(self) -> dict:
        """Which hook implementation ran and why (planned, until rank 0 reports it)."""
        meta, planned = self.run.meta(), self.run.launch_info()
        source = meta if meta.get("hook_impl") else planned
        impl = source.get("hook_impl")
        return {"ran": bool(meta.get("hook_impl")), "hook_impl": impl,
                "owner": {"stock": "PyTorch's", "commlab": "commlab's"}.get(impl, impl),
                "hook_reason": source.get("hook_reason"), "backend": source.get("backend"),
                "warning": planned.get("warning")}

    def headline(self) -> dict:
        """The numbers above the charts, defined as ``RunFolder.summary`` defines them."""
        rows = self.rows
        last = rows[-1] if rows else {}
        after_warmup = rows[1:] or rows
        return {"step": last.get("step"), "steps_planned": self.run.config_dict().get("steps"),
                "loss": last.get("loss"),
                "median_step_s": statistics.median(r["step_s"] for r in after_warmup) if rows else None,
                "bytes_per_step": (statistics.median(r["payload_bytes"] for r in after_warmup)
                                   if rows and "payload_bytes" in last else None),
                "plain_bytes_per_step": last.get("plain_bytes"),
                "compression_ratio": last.get("compression_ratio")}


def watch_choices(runs_dir: str | None = None) -> list[dict]:
    """Runs to offer in the live panel (path, label, status): those still going first, so that a
    reloaded page re-attaches to them, then the rest; newest first within each."""
    runs = [{"path": str(r.path), "label": run_label(r), "status": r.status()}
            for r in store.list_runs(runs_dir or default_runs_dir())]
    return sorted(runs, key=lambda r: r["status"] != "running")  # sorted() is stable


def run_label(run: store.RunFolder) -> str:
    """The settings that tell runs apart, and the run id's random tail that tells twins apart."""
    return f"{label_of(run.config_dict())} · {run.id[-4:]}"


# ---------------------------------------------------------------------------- the run table
def run_table(runs_dir: str | None = None) -> list[dict]:
    """One row per run: its settings, status and headline figures (``RunFolder.summary``)."""
    rows = []
    for run in store.list_runs(runs_dir or default_runs_dir()):
        cfg = run.config_dict()
        rows.append({**_summary(run), "label": run_label(run),
                     "min_compression_rate": cfg.get("min_compression_rate"),
                     "use_error_feedback": cfg.get("use_error_feedback"),
                     "warm_start": cfg.get("warm_start"), "bucket_cap_mb": cfg.get("bucket_cap_mb"),
                     "backend": run.launch_info().get("backend")})
    return rows


def _summary(run: store.RunFolder) -> dict:
    # An ended run never changes again: parse its metrics once per version of its files.
    status = run.file("status.json")
    if store.read_json(status, {}).get("status") in store.FINAL:
        metrics = run.file("metrics.jsonl")
        stamp = (status.stat().st_mtime_ns, metrics.stat().st_size if metrics.exists() else 0)
        return dict(_final_summary(str(run.path), stamp))
    return run.summary()


@functools.lru_cache(maxsize=512)
def _final_summary(path: str, stamp: tuple) -> dict:
    return store.RunFolder(path).summary()


def overlay(paths: list[str]) -> dict:
    """label -> a DataFrame of the run's metrics with sent_bytes, the cumulative hook payload
    (when the run was instrumented), for overlaying runs against step, wall time and bytes."""
    out = {}
    for path in paths:
        run = store.RunFolder(path)
        df = run.metrics()
        if df.empty:
            continue
        if "payload_bytes" in df:
            df["sent_bytes"] = df["payload_bytes"].cumsum()
        out[run_label(run)] = df
    return out


def delete_run(path: str | Path, runs_dir: str | None = None) -> None:
    """Delete one run folder; refuses (ValueError) anything that is not a finished-with run
    folder directly inside the runs folder."""
    p = Path(path)
    root = Path(runs_dir or default_runs_dir()).resolve()
    if p.is_symlink() or p.resolve().parent != root:
        raise ValueError(f"{p} is not a folder directly inside the runs folder {root}; "
                         "nothing was deleted")
    run = store.RunFolder(p.resolve())
    if not run.exists():
        raise ValueError(f"{p} is not a commlab run folder (no config.json); nothing was deleted")
    if run.status() == "running":
        raise ValueError(f"run {run.id} is still running: stop it first")
    if workers_alive(store.read_json(run.file("supervisor.json"), {})):
        raise ValueError(f"run {run.id} has worker processes still alive: stop it first")
    shutil.rmtree(run.path)


# ---------------------------------------------------------------------------- buckets
LAYOUTS = {"iter0": "iteration 0", "rebuilt": "after the rebuild"}


def bucket_layouts(buckets: dict) -> dict[str, list[dict]]:
    """Layout name -> one row per bucket, in the order DDP reduces them (bucket index order)."""
    cap = cap_bytes(buckets)
    out = {}
    for key, title in LAYOUTS.items():
        rows = sorted(buckets.get(key) or [], key=lambda b: b["index"])
        out[title] = [{"index": b["index"], "order": b["index"] + 1, "is_last": b["is_last"],
                       "bytes": b["bytes"], "numel": b["numel"], "cap_bytes": cap,
                       "over_cap": cap is not None and b["bytes"] > cap, "params": b["params"]}
                      for b in rows]
    return out


def bucket_table(rows: list[dict]) -> list[dict]:
    """A layout's buckets as table rows, in reduction order."""
    return [{"bucket": b["index"], "reduced": f"#{b['order']}" + (" (last)" if b["is_last"] else ""),
             "bytes": b["bytes"], "share of cap": b["bytes"] / b["cap_bytes"] if b["cap_bytes"] else None,
             "parameters": ", ".join(p["name"] for p in b["params"])} for b in rows]


def ddp_logged_sizes(buckets: dict) -> dict[str, dict]:
    """DDP's own log of bucket sizes (``_get_ddp_logging_data``) next to the recorded layouts.

    DDP logs the rebuilt sizes only once it has rebuilt, and the run folder holds the log as it
    stood when buckets.json was last written (after step 1 and at the end of the run)."""
    logged = buckets.get("ddp_logging") or {}
    out = {}
    for (key, title), field in zip(LAYOUTS.items(), ("bucket_sizes", "rebuilt_bucket_sizes")):
        text = logged.get(field)
        sizes = [int(x) for x in str(text).split(",")] if text else None
        recorded = [b["bytes"] for b in sorted(buckets.get(key) or [], key=lambda b: b["index"])]
        out[title] = {"field": field, "logged": sizes, "recorded": recorded,
                      "agrees": sizes == recorded if sizes else None}
    return out


def cap_bytes(buckets: dict) -> int | None:
    cap = buckets.get("bucket_cap_mb")
    return None if cap is None else int(cap * MIB)


def bucket_story(buckets: dict) -> str:
    """One paragraph on why the two layouts differ, from what this run recorded."""
    first, rebuilt = buckets.get("iter0") or [], buckets.get("rebuilt") or []
    if not first:
        return ("No bucket layout was recorded: the run had not finished its first step, or it "
                "ran without instrumentation.")
    if not rebuilt:
        return ("Only iteration 0's layout is recorded: DDP rebuilds its buckets after the first "
                "iteration, and this run did not finish a second step.")
    n_params = sum(len(b["params"]) for b in first)
    by_index = sorted(rebuilt, key=lambda b: b["index"])
    first_ready = by_index[0]["params"][0]["name"] if by_index[0]["params"] else "?"
    if len(first) == 1:
        before = (f"At iteration 0 DDP had not yet seen the order in which backward produces the "
                  f"gradients, so it did not split them: all {n_params} parameters went into one "
                  f"bucket of {first[0]['bytes']:,} bytes.")
    else:
        before = (f"At iteration 0 DDP cut {n_params} parameters into {len(first)} buckets in "
                  f"the reverse order of model.parameters(), its guess at the order backward "
                  f"produces gradients.")
    same = [[p["name"] for p in b["params"]] for b in sorted(first, key=lambda b: b["index"])] == \
           [[p["name"] for p in b["params"]] for b in by_index]
    after = (f"After that iteration it rebuilt them in the order the gradients actually became "
             f"ready ({first_ready} first), starting a new bucket whenever the current one reached "
             f"the cap ({cap_bytes(buckets):,} bytes), so a bucket can exceed the cap by its last "
             f"tensor: {len(rebuilt)} bucket{'s' if len(rebuilt) != 1 else ''}.")
    if same:
        after += " That happens to give the same layout."
    return f"{before} {after}"
