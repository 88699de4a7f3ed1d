"""The Launch form without Streamlit: form values become a checked RunConfig with one message per
field, a preview says what this machine would run, and a launch is idempotent across browser tabs."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import secrets
from pathlib import Path

from commlab.config import ConfigError, RunConfig
from commlab.engine import launch as engine

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


def launch(cfg: RunConfig, request_id: str | None = None) -> tuple[engine.Run, bool]:
    """Start a run, or return the one already going with exactly these settings.

    Returns (run, started).  Browser tabs are separate sessions that share nothing but the runs
    folder, so the check and the start happen under a lock file there: two tabs that submit the
    same settings at once get one run.
    """
    with _runs_lock(cfg.runs_dir):
        for run in engine.list_runs(cfg.runs_dir):
            if run.is_running() and run.config_dict() == cfg.to_dict():
                return run, False
        return engine.start(cfg, request_id), True


@contextlib.contextmanager
def _runs_lock(runs_dir: str):
    Path(runs_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(runs_dir) / ".launch.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
