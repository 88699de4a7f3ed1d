"""A sharded run's model: FSDP2's ``fully_shard`` applied as the run's settings ask, and the memory
each rank holds.

    fsdp: a 1-D mesh of every rank; each rank holds 1/world of every parameter.
    hsdp: init_device_mesh(device, (replicas, world / replicas), mesh_dim_names=("replicate", "shard")):
          each replica shards the model over its ranks, and the replicas all-reduce the gradients:
          with hook allreduce, FSDP's own (native HSDP, on the 2-D mesh); with fp16, bf16 or
          powersgd, the lab's (``commlab.hooks.replica``: FSDP on the 'shard' dimension, the hook
          on the 'replicate' dimension's group).

``fully_shard`` goes on each of the workload's units first (``commlab.workloads.shard_units``: the
rule a person reads and overrides with ``fsdp_units()``), then on the root, as torchtitan applies
it: a unit's parameters are gathered for its forward and backward only, the root's leftovers with
the first unit.  The module sharded is the model itself (FSDP2 changes its class in place), so
the training loop calls it as it calls DDP's wrapper.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from commlab import workloads
from commlab.config import RunConfig
from commlab.config_fields import lab_between_replicas
from commlab.hooks import registry
from commlab.hooks.replica import ReplicaAllReduce

REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MESH_DIMS = ("replicate", "shard")  # HSDP's mesh, as torch's docs and torchtitan name its dims


@dataclass
class Sharded:
    """What a rank's model was sharded as (meta.json says it), and the hook between its replicas."""

    mesh: DeviceMesh
    units: list[str]  # the modules sharded one by one, by name
    choice: registry.HookChoice  # the run's hook: what runs between replicas, if the lab runs it
    replica: ReplicaAllReduce | None  # the lab's all-reduce between replicas; None: FSDP's own or none

    @property
    def shards(self) -> int:
        """The ranks a replica shards the model over."""
        return self.mesh["shard"].size()

    @property
    def shard(self) -> int:
        """Which of them this rank is: the dim-0 shard of every parameter it holds."""
        return self.mesh["shard"].get_local_rank()

    def record(self) -> dict:
        return {"mesh": dict(zip(self.mesh.mesh_dim_names, self.mesh.shape)), "units": self.units,
                "between_replicas": ("none" if "replicate" not in self.mesh.mesh_dim_names
                                     else "lab" if self.replica else "native")}


def mesh_of(cfg: RunConfig, world: int, device_type: str) -> DeviceMesh:
    """The run's device mesh: every rank in one shard group (fsdp), or ``replicas`` x the rest (hsdp)."""
    if cfg.sharding == "hsdp":
        return init_device_mesh(device_type, (cfg.replicas, world // cfg.replicas), mesh_dim_names=MESH_DIMS)
    return init_device_mesh(device_type, (world,), mesh_dim_names=MESH_DIMS[1:])


def shard(model: torch.nn.Module, cfg: RunConfig, world: int, device: torch.device,
          backend: str) -> Sharded:
    """``model`` sharded in place: ``fully_shard`` on each unit, then on the root; on HSDP with a
    hook other than allreduce, the lab's all-reduce between replicas set on them."""
    units = workloads.shard_units(model)
    if not units:  # refused before the run started (workloads.check); a changed workload gets here
        raise ValueError(f"workload {cfg.workload!r}: the model has no layer to shard")
    mesh = mesh_of(cfg, world, device.type)
    ours = lab_between_replicas(cfg)
    options = {"mesh": mesh["shard"] if ours else mesh, "reshard_after_forward": cfg.reshard_after_forward,
               "mp_policy": MixedPrecisionPolicy(reduce_dtype=REDUCE_DTYPES[cfg.reduce_dtype])}
    for _, unit in units:
        fully_shard(unit, **options)
    fully_shard(model, **options)
    if not ours:
        return Sharded(mesh, [name for name, _ in units], registry.choose(cfg, backend), None)
    # FSDP reads the hook's result as soon as it returns: the variants that wait in the hook.
    choice = registry.choose(dataclasses.replace(cfg, overlap=False), backend,
                             process_group=mesh["replicate"].get_group())
    replica = ReplicaAllReduce(choice.hook, choice.state, [unit for _, unit in units] + [model],
                               mesh["shard"].size(), [name for name, _ in units] + [""])
    return Sharded(mesh, [name for name, _ in units], choice, replica)


# Where FSDP2 issues a unit's collectives (torch 2.13, _fsdp_param_group.py): ``unshard`` its
# all-gather, also when another unit's hook prefetches it; ``post_backward`` its reduce-scatter, the
# all-reduce between HSDP's replicas after it (FSDP's own, or the hook set on the unit: the lab's)
ISSUERS = ("FSDPParamGroup.unshard", "FSDPParamGroup.post_backward")


def issuing_unit() -> str | None:
    """The unit whose collective is being called, as ``fully_shard`` named it (its module's name
    in the model; "" the root), read off the call stack: the param group of the nearest ``ISSUERS``
    frame.  The collective's tensors do not say it (FSDP copies a unit's shards into a flat buffer
    of its own), and a unit's forward or backward does not either (its backward prefetches the next
    unit's all-gather).  None outside a unit's collectives (the mean loss over the ranks)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_qualname in ISSUERS:
            return frame.f_locals["self"]._module_fqn
        frame = frame.f_back
    return None


def _local(t: torch.Tensor) -> torch.Tensor:
    """What this rank holds of a tensor: a DTensor's local shard, a plain tensor whole."""
    return t.to_local() if isinstance(t, DTensor) else t


def _bytes(tensors) -> int:
    return sum(_local(t).numel() * t.element_size() for t in tensors)


def memory_held(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """The bytes this rank holds of the parameters, their gradients and the optimizer's state
    (after a step: the state exists from the first one), what sharding divides; not counted: the
    gathered parameters of the unit in use, activations, communication buffers."""
    params = [p for p in model.parameters()]
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {"parameters": _bytes(params), "gradients": _bytes(p.grad for p in params if p.grad is not None),
            "optimizer_state": _bytes(state)}
