"""DiLoCo (Douillard et al., 2023, "DiLoCo: Distributed Low-Communication Training of Language
Models"): local steps with the inner optimizer, then an outer Nesterov SGD step on the averaged
pseudo-gradient.

Every replica takes ``sync_every`` (H) steps with its own gradients and the run's optimizer (the
inner one): ``diloco_hook`` returns each bucket's gradient as it is, averaging nothing.  After
every H-th optimizer step ``DiLoCoState.average_parameters`` forms the pseudo-gradient, the
parameters at the last sync minus this replica's, averages it over the ranks (one collective for
all parameters, in ``precision``), sets it as the gradient of the last-sync parameters and steps
them with ``torch.optim.SGD(lr=outer_lr, momentum=outer_momentum, nesterov=nesterov)`` (DiLoCo's
0.7, 0.9, Nesterov, as torchft's ``DiLoCo`` and torchtitan's ``semi_sync_method = "diloco"`` are
used); every replica then copies the result.  PyTorch's ``PeriodicModelAverager`` is the same
family without the outer optimizer (outer_lr 1, no momentum: model averaging).

The state is its own averager, called after every ``optimizer.step()`` as post-local SGD's
averager is, and the hook records each parameter the first time it sees it, at the first
backward, before any step moved it: those are the parameters the first outer step starts from
(``remember`` does it by hand where no hook runs).

The pseudo-gradient travels as ``precision`` says (``commlab.hook_specs.OUTER_PRECISIONS``):
fp32, or bf16/fp16 cast and divided by the ranks before the allreduce (PyTorch's fp16 hook's
order), or int8: per parameter tensor, codes ``round(x / scale)`` in [-127, 127] with ``scale =
max|x| / 127``, allgathered with the float32 scales (a sum of int8 codes would overflow in an
allreduce) and averaged in float32 on every rank, as commlab's quantization hooks do.
Collectives are called through ``dist``'s module attributes, where the byte counter counts them.
"""
# No `from __future__ import annotations`: DDP compares a hook's annotations with real types.

import torch
import torch.distributed as dist

from commlab.hook_specs import OUTER_PRECISIONS
from commlab.hooks.groups import group_of

__all__ = ["DiLoCoState", "diloco_hook"]

INT8_LEVELS = 127
_CAST = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class DiLoCoState:
    """DiLoCo's outer loop: its settings, the parameters at the last sync and the outer SGD."""

    def __init__(self, process_group=None, sync_every: int = 8, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, nesterov: bool = True, precision: str = "fp32"):
        if int(sync_every) != sync_every or sync_every < 1:
            raise ValueError(f"sync_every must be a whole number of steps of at least 1, got {sync_every!r}")
        if not outer_lr > 0:
            raise ValueError(f"outer_lr must be above 0, got {outer_lr!r}")
        if not 0 <= outer_momentum < 1:
            raise ValueError(f"outer_momentum must be from 0 to below 1, got {outer_momentum!r}")
        if nesterov and outer_momentum == 0:
            raise ValueError("nesterov needs outer_momentum above 0 (torch.optim.SGD refuses it without)")
        if precision not in OUTER_PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; precisions are: {', '.join(OUTER_PRECISIONS)}")
        # hyperparameters
        self.process_group = process_group
        self.sync_every, self.outer_lr, self.outer_momentum = int(sync_every), outer_lr, outer_momentum
        self.nesterov, self.precision = nesterov, precision
        # internal state
        self.step = 0  # optimizer steps taken (the inner ones)
        self.outer_steps = 0
        self.anchors: dict[int, torch.Tensor] = {}  # a parameter's data_ptr -> it at the last sync, float32
        self.outer_optimizer: torch.optim.SGD | None = None

    def remember(self, params) -> None:
        """Record as the last sync's every parameter not yet recorded (the hook calls it)."""
        for p in params:
            if p.data_ptr() not in self.anchors:
                self.anchors[p.data_ptr()] = p.detach().float().clone()

    def average_parameters(self, params) -> bool:
        """After an optimizer step: at every ``sync_every``-th, the outer step, every replica set to
        its result.  Whether it synced."""
        params = list(params)
        self.step += 1
        if self.step % self.sync_every:
            return False
        self.remember(params)  # a parameter no backward reached has not moved since the start
        anchors = [self.anchors[p.data_ptr()] for p in params]
        if self.outer_optimizer is None:
            self.outer_optimizer = torch.optim.SGD(anchors, lr=self.outer_lr, momentum=self.outer_momentum,
                                                   nesterov=self.nesterov)
        with torch.no_grad():
            pseudo = [a - p.detach().float() for a, p in zip(anchors, params)]
            for a, g in zip(anchors, self.mean(pseudo)):
                a.grad = g
            self.outer_optimizer.step()
            self.outer_optimizer.zero_grad(set_to_none=True)
            for a, p in zip(anchors, params):
                p.copy_(a)
        self.outer_steps += 1
        return True

    def mean(self, tensors: list) -> list:
        """The mean over the ranks of each of ``tensors`` (float32), sent in ``precision``."""
        group = group_of(self.process_group)
        world = group.size()
        if self.precision == "int8":
            flat = _int8_mean(tensors, group, world)
        else:
            wire = torch.cat([t.reshape(-1) for t in tensors]).to(_CAST[self.precision]).div_(world)
            dist.all_reduce(wire, group=group)
            flat = wire.float()
        return [part.view_as(t) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


def _int8_mean(tensors: list, group, world: int) -> torch.Tensor:
    """Every rank's int8 codes and per-tensor scales allgathered, decoded and averaged in float32."""
    scales = torch.stack([t.abs().max() / INT8_LEVELS if t.numel() else t.new_zeros(()) for t in tensors])
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.cat([torch.round(t.reshape(-1) / s).clamp_(-INT8_LEVELS, INT8_LEVELS)
                       for t, s in zip(tensors, safe)]).to(torch.int8)
    all_scales = [torch.empty_like(scales) for _ in range(world)]
    dist.all_gather(all_scales, scales, group=group)
    all_codes = [torch.empty_like(codes) for _ in range(world)]
    dist.all_gather(all_codes, codes, group=group)
    sizes = [t.numel() for t in tensors]
    total = torch.zeros(codes.numel(), dtype=torch.float32, device=codes.device)
    for c, s in zip(all_codes, all_scales):
        total += c.float() * torch.repeat_interleave(s, torch.tensor(sizes, device=s.device))
    return total.div_(world)


def diloco_hook(state: DiLoCoState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The local step's gradient, as it is (no averaging); each parameter recorded on first sight."""
    state.remember(bucket.parameters())
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut
