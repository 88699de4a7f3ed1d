"""The baseline a comparison is judged against: DDP's allreduce in fp32, fp16 or bf16 (pure).

Han et al. (2024, "Beyond Throughput and Compression Ratios") argue that compression must be judged
against a 16-bit allreduce, not an fp32 one: fp16 and bf16 halve the bytes for free on most models.
So the sweep's recommendation, ``commlab sweep``, the Sweep and Compare pages and ``commlab compare``
take the baseline as a choice, one of ``BASELINES``, checked here (``check``), and every table and
sentence names it (``title``).  A baseline is a hook of the table (``commlab.hook_specs``) run like
any other: on Gloo, bf16 runs commlab's variant, as every bf16 run there does.

Plain fp32 allreduce (``hook_specs.BASELINE``) stays the run that calibrates the what-if model
(the loopback's speed, the compute time the profiles share, ``commlab.tune.whatif``) and prices
PowerSGD's allreduce steps before it starts, so a sweep judged against a 16-bit baseline runs both.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from commlab.config import ConfigError
from commlab.hook_specs import BASELINE

PRECISIONS = {BASELINE: "fp32", "fp16": "fp16", "bf16": "bf16"}  # baseline (a hook) -> what it sends
BASELINES = tuple(PRECISIONS)
DEFAULT = BASELINE


def title(name: str) -> str:
    """How tables and sentences name a baseline: 'fp16 allreduce'."""
    return f"{PRECISIONS[name]} allreduce"


def check(name: Any, field: str = "against") -> str:
    """``name`` when it is a baseline; ConfigError naming ``field`` and the choices otherwise."""
    if name not in BASELINES:
        choices = ", ".join(f"{b} ({title(b)})" for b in BASELINES)
        raise ConfigError({field: f"unknown baseline {name!r}; choose one of {choices}: the "
                                  "allreduce every ratio, speed-up and recommendation is judged against"})
    return name


def is_baseline(cfg: Mapping[str, Any], name: str) -> bool:
    """Whether a stored config (or a what-if row) runs baseline ``name``: its hook unwrapped, or,
    for a 16-bit one, plain allreduce in PyTorch's compress wrapper of that precision (the same
    bytes on the wire)."""
    return (cfg.get("hook"), cfg.get("wrapper", "none")) in ((name, "none"), (BASELINE, name))
