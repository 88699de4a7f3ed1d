"""The accelerators this machine has, and the one rule that turns backend "auto" into a backend."""
from __future__ import annotations

import os
import sys

# A machine with none of these has no GPU driver, so torch would see no GPU: it is not imported to
# say so (seconds, at every run's start).  NVIDIA's, AMD's (ROCm: torch.cuda too), WSL's.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg")
FORK_ENV = "COMMLAB_FORK_RANKS"  # "0": never fork the ranks (``ranks_forkable``)


def gpu_count() -> int:
    if "torch" not in sys.modules and not any(os.path.exists(p) for p in GPU_DEVICE_FILES):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def ranks_forkable() -> bool:
    """Whether torchrun may fork the ranks from its own process, its imports done (``commlab.engine
    .torchrun``), instead of starting a fresh interpreter for each: on Linux with no GPU driver.
    A process that has touched CUDA cannot use it in a forked child, and importing what the ranks
    need may touch it; macOS's system libraries do not survive a fork either.
    ``COMMLAB_FORK_RANKS=0`` starts each rank as an interpreter of its own anyway
    (``benchmarks/startup.py`` times both; a workload that cannot be forked)."""
    if os.environ.get(FORK_ENV) == "0" or not sys.platform.startswith("linux"):
        return False
    return not any(os.path.exists(p) for p in GPU_DEVICE_FILES)


def pick_backend(asked: str, world_size: int, gpus: int | None = None) -> tuple[str, str]:
    """(backend, why): "auto" is NCCL when there is a GPU for every rank, Gloo on the CPU otherwise."""
    if asked != "auto":
        return asked, f"backend {asked} was asked for"
    gpus = gpu_count() if gpus is None else gpus
    if gpus >= world_size:
        return "nccl", f"auto: {gpus} CUDA GPU(s) seen, enough for {world_size} rank(s), so NCCL"
    if gpus:
        return "gloo", (f"auto: {gpus} CUDA GPU(s) seen, fewer than {world_size} ranks, so Gloo "
                        "on the CPU")
    return "gloo", "auto: no CUDA GPU seen, so Gloo on the CPU"
