"""The accelerators this machine has, and the one rule that turns backend "auto" into a backend."""
from __future__ import annotations


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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
