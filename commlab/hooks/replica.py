"""HSDP's all-reduce between replicas, owned by the lab: plain, 16-bit or PowerSGD on each rank's shard.

FSDP2 reduce-scatters a unit's gradients within its replica, then calls the hook set with
``FSDPModule.set_all_reduce_hook`` on the reduce-scatter's output: one flat tensor, in
``reduce_dtype``, holding this rank's dim-0 shard of each of the unit's parameters one after
another, each padded to ``ceil(rows / shards)`` rows.  Here it is averaged over the replicas by
one of the lab's DDP hooks (the registry's choice, on the replica process group) handed a
``ShardBucket``: the shards without their padding, one gradient per parameter, the unit's index
as the bucket's.  PowerSGD's rule, error feedback and warm start are so kept per shard: a dim-0
shard of a weight is still a matrix (``rows / shards`` x the rest), and the replicas of a shard
all hold the same rows.

How torch means the hook to be set (torch/distributed/fsdp/_fully_shard/_fully_shard.py,
``set_all_reduce_hook``; ``_fsdp_param_group.py``, ``post_backward``; ``_fsdp_collectives.py``,
``foreach_reduce``): each module ``fully_shard`` was called on keeps its parameters in a param
group, and the hook is the param group's.  A root whose parameters all belong to its units has
none, so a hook set on the root alone never fires: it is set on every unit (and on the root, for
its own parameters, if it has any).  It fires once per unit and backward, after the reduce-scatter
(after native HSDP's own all-reduce on a 2-D mesh: the lab shards over the 'shard' dimension only
and leaves the replicas to this hook), before FSDP's post-divide and its cast back to the
parameters' dtype; it returns nothing and must leave its result in the tensor it was given.

FSDP reads that tensor as soon as the hook returns, so the hook waits for its collectives in its
body: the registry's blocking variants (the lab's ``overlap`` off).  Every rank calls its units'
hooks in the same order (backward's), so every replica group issues its collectives in order.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


class ShardBucket:
    """What the lab's DDP hooks read of a ``dist.GradBucket``, made of a unit's shards."""

    def __init__(self, index: int, buffer: torch.Tensor, shapes: list[torch.Size], last: bool):
        self._index, self._buffer, self._last = index, buffer, last
        self._gradients, offset = [], 0
        for shape in shapes:  # views into the buffer, as a bucket's gradients are
            self._gradients.append(buffer[offset:offset + shape.numel()].view(shape))
            offset += shape.numel()

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._gradients

    def is_last(self) -> bool:
        """The last unit reduced in a step: PyTorch's PowerSGD counts its iterations here."""
        return self._last

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer.copy_(tensor)


@dataclass(frozen=True)
class Region:
    """One parameter's shard in the reduce-scatter's output: where it starts, its rows and shape."""

    offset: int
    name: str  # the parameter's, in the model (a unit's are prefixed with the unit's name)
    shape: torch.Size  # this rank's shard, unpadded
    padded_numel: int  # what the output holds for it: its rows padded to ceil(rows / shards)


def regions(module: nn.Module, shards: int, prefix: str = "") -> list[Region]:
    """Where each parameter of ``module``'s param group lies in the flat tensor its hook gets: its
    own parameters (those of no FSDP module below it) in ``parameters()`` order, as FSDP collects
    them, each padded on dim 0 to a multiple of ``shards`` (``_get_dim0_padded_size``); named as
    the model names them, ``module`` being the model's ``prefix``."""
    below = {id(p) for name, m in module.named_modules() if name and isinstance(m, FSDPModule)
             for p in m.parameters()}
    out, offset = [], 0
    for name, p in module.named_parameters():  # parameters()'s order, and its names
        if id(p) in below:
            continue
        shape = p.to_local().shape if isinstance(p, DTensor) else p.shape
        rows = p.shape[0] if p.dim() else 1  # the global shape: a DTensor's is the whole parameter's
        padded = math.ceil(rows / shards) * math.prod(p.shape[1:])
        out.append(Region(offset, f"{prefix}.{name}" if prefix else name, shape, padded))
        offset += padded
    return out


class ReplicaAllReduce:
    """The all-reduce between replicas: ``hook(state, bucket)``, a DDP hook whose state names the
    replica group (one that waits in its body: PyTorch's fp16 hook, commlab's
    ``blocking_powerSGD_hook``), on each unit's shards, as FSDP calls the units' hooks in backward.
    Set on ``modules`` (every module ``fully_shard`` was called on; those holding no parameters of
    their own are passed over), each sharded over ``shards`` ranks::

        ReplicaAllReduce(blocking_powerSGD_hook, PowerSGDState(mesh["replicate"].get_group(), ...),
                         [*units, model], mesh["shard"].size())
    """

    def __init__(self, hook, state, modules: list[nn.Module], shards: int, names: list[str] | None = None):
        self.hook, self.state = hook, state
        # ``names``: the modules' in the model ("" the root's), so that a shard is named as its parameter
        self.layouts = [regions(u, shards, prefix) for u, prefix in zip(modules, names or [""] * len(modules))]
        self.held = [i for i, layout in enumerate(self.layouts) if layout]  # units with a param group
        self.calls = 0  # this step's so far
        self.handed: list[int] = []  # since ``take``: each call's bytes, what a plain all-reduce would carry
        self.hook_s = 0.0  # since ``take``: time in the hook, collectives and waiting included
        # around each call: the lab's measurement (a traced step's timeline), nothing unless set
        self.watch: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
        for i in self.held:
            modules[i].set_all_reduce_hook(lambda output, i=i: self(i, output))

    def take(self) -> tuple[list[int], float]:
        """Each call's bytes and the seconds in the hook since the last ``take`` (a step's)."""
        taken = self.handed, self.hook_s
        self.handed, self.hook_s = [], 0.0
        return taken

    def __call__(self, index: int, output: torch.Tensor) -> None:
        with self.watch():
            self._reduce(index, output)

    def _reduce(self, index: int, output: torch.Tensor) -> None:
        t0 = time.perf_counter()
        layout = self.layouts[index]
        if output.numel() != sum(r.padded_numel for r in layout):
            raise RuntimeError(f"unit {index}: FSDP handed the hook {output.numel()} elements, its "
                               f"parameters' padded shards are {sum(r.padded_numel for r in layout)}")
        shards = [output[r.offset:r.offset + r.shape.numel()] for r in layout]
        self.calls += 1
        last = self.calls == len(self.held)
        if last:
            self.calls = 0
        bucket = ShardBucket(index, torch.cat(shards), [r.shape for r in layout], last)
        self.handed.append(bucket.buffer().numel() * bucket.buffer().element_size())
        averaged = self.hook(self.state, bucket).wait()
        offset = 0
        for shard in shards:
            shard.copy_(averaged[offset:offset + shard.numel()])
            offset += shard.numel()
        self.hook_s += time.perf_counter() - t0
