"""What this machine would run on: backend, GPUs, torch version, runs folder."""
from __future__ import annotations

import os


def describe() -> dict:
    import torch

    from commlab.config import RunConfig, default_runs_dir
    from commlab.devices import gpu_count
    from commlab.engine.launch import resolve_backend

    gpus = gpu_count()
    backend, why = resolve_backend(RunConfig(), gpus)
    return {"backend": backend, "backend_reason": why, "gpus": gpus, "torch": torch.__version__,
            "cpus": os.cpu_count(), "runs_dir": os.path.abspath(default_runs_dir())}
