"""Where gradient averaging sits in a training step, on real processes (the classroom's third part).

``grad_averaging``: two (or more) ranks train the same model three ways -- DDP, gradients
averaged by hand with ``dist.all_reduce`` between ``backward()`` and ``optimizer.step()``
(``average_gradients``), and no allreduce at all -- so one can see that the first two agree and
the third drifts apart.  Ranks start through the engine's rank harness, as the classroom's do.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from commlab.config import ConfigError
from commlab.engine.ranks import DEFAULT_TIMEOUT_S, run_ranks
from commlab.seeds import stream_seed
from commlab.teach.classroom import check_world_size


@dataclass
class GradAveraging:
    """Per step: the largest |DDP gradient - hand-averaged gradient| on any rank, and how far
    apart the ranks' parameters are (L2, the farthest rank from rank 0) for each way of training."""

    world_size: int
    steps: int
    rows: list[dict]  # step, max_grad_diff, distance_{ddp,by_hand,no_allreduce}, loss_{...}

    @property
    def max_grad_diff(self) -> float:
        return max((r["max_grad_diff"] for r in self.rows), default=0.0)

    def to_dict(self) -> dict:
        return {**asdict(self), "max_grad_diff": self.max_grad_diff}


VARIANTS = ("ddp", "by_hand", "no_allreduce")


def average_gradients(model) -> None:
    """What DDP does for you: after backward(), before optimizer.step(), make every rank's
    gradient the mean over ranks.  Without it each rank would step along its own data alone."""
    import torch.distributed as dist

    world_size = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world_size


def grad_averaging(world_size: int = 2, steps: int = 30, lr: float = 0.05, seed: int = 0,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> GradAveraging:
    """Train one small model on every rank three ways, each rank on its own data: with DDP,
    with ``average_gradients`` by hand, and with no allreduce."""
    world_size = check_world_size(world_size)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 1000:
        raise ConfigError({"steps": f"must be a whole number from 1 to 1000, got {steps!r}"})
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ConfigError({"lr": f"must be a number above 0, got {lr!r}"})
    reports = run_ranks(_grad_rank, world_size, (steps, float(lr), int(seed)), timeout_s=timeout_s)
    return GradAveraging(world_size, steps, [_grad_row(step, [r for r in reports if r[0] == step])
                                             for step in range(steps + 1)])


def replica_distance(vectors: Sequence[Sequence[float]]) -> float:
    """How far the farthest rank's parameters are from rank 0's (L2 norm)."""
    v = np.asarray(vectors, dtype=np.float64)
    return float(np.linalg.norm(v - v[0], axis=1).max())


def _grad_row(step: int, reports: list[tuple]) -> dict:
    reports = sorted(reports, key=lambda r: r[1])
    row = {"step": step, "max_grad_diff": max(r[2] for r in reports)}
    for name in VARIANTS:
        row[f"distance_{name}"] = replica_distance([r[3][name] for r in reports])
        row[f"loss_{name}"] = float(np.mean([r[4][name] for r in reports])) if step else None
    return row


def _demo_model():
    from torch import nn

    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def _grad_rank(rank: int, world_size: int, report, steps: int, lr: float, seed: int) -> None:
    import copy

    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(seed)  # the same initial model on every rank
    base = _demo_model()
    models = {"ddp": DDP(copy.deepcopy(base)), "by_hand": copy.deepcopy(base),
              "no_allreduce": copy.deepcopy(base)}
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=lr) for k, m in models.items()}
    teacher = torch.randn(8, 1, generator=torch.Generator().manual_seed(seed))
    data = torch.Generator().manual_seed(stream_seed(seed, rank))  # each rank sees its own data

    def params():
        return {k: torch.nn.utils.parameters_to_vector(m.parameters()).tolist()
                for k, m in models.items()}

    report((0, rank, 0.0, params(), {}))
    for step in range(1, steps + 1):
        x = torch.randn(32, 8, generator=data)
        y = x @ teacher + 0.1 * torch.randn(32, 1, generator=data)
        grads, losses = {}, {}
        for name, model in models.items():
            optimizers[name].zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()  # DDP averages its gradients inside backward()
            if name == "by_hand":
                average_gradients(model)
            grads[name] = [p.grad.clone() for p in model.parameters()]
            optimizers[name].step()
            losses[name] = loss.item()
        diff = max((a - b).abs().max().item() for a, b in zip(grads["ddp"], grads["by_hand"]))
        report((step, rank, diff, params(), losses))
