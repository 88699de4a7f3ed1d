"""The accelerators this machine has: the one fact settings and the engine both ask of it."""
from __future__ import annotations


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
