"""The fsdp export: a sharded run as plain PyTorch FSDP2 (``fully_shard``) or HSDP code.

The mesh (1-D, or HSDP's ``(replicas, world / replicas)`` with dims 'replicate' and 'shard'), the
mixed precision policy, ``fully_shard`` on each unit by the lab's rule (or the model's own
``fsdp_units()``) then on the root; on HSDP with a hook other than allreduce, FSDP on the 'shard'
dimension and the hook between replicas by ``commlab.hooks.ReplicaAllReduce`` (a hook that waits in
its body: commlab's blocking PowerSGD where commlab's PowerSGD is the one that runs on the backend).
"""
from __future__ import annotations

import dataclasses

from commlab.config import RunConfig
from commlab.hook_specs import BASELINE, SPECS
from commlab.tune.export.hook_code import COMMLAB_ALIAS, COMMLAB_MODULE, describe
from commlab.tune.export.preamble import header
from commlab.tune.export.target import Target
from commlab.tune.export.text import comment

DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16"}
# The lab's rule (commlab.workloads.shard_units), written out: the units fully_shard goes on.
UNITS = '''def shard_units(module):
    """Every direct child holding parameters; a ModuleList's or ModuleDict's items one by one."""
    for child in module.children():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            yield from shard_units(child)
        elif any(True for _ in child.parameters()):
            yield child


units = list(model.fsdp_units()) if hasattr(model, "fsdp_units") else list(shard_units(model))
'''


def fsdp_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """Imports, the mesh, ``fully_shard`` per unit and on the root, the hook between replicas: to
    paste where DDP would wrap the model (``model`` built, on this rank's device)."""
    device = "cuda" if target.backend == "nccl" else "cpu"
    ours = cfg.sharding == "hsdp" and cfg.hook != BASELINE  # the lab's hook between replicas
    text = comment(header(cfg, target, source) + [
        "Paste after the model is built (`model`, on this rank's device), in place of DistributedDataParallel,",
        f"after dist.init_process_group({target.backend!r}); build the optimizer on model.parameters() after it."])
    lines = ["import torch", "import torch.distributed as dist",
             "from torch.distributed.device_mesh import init_device_mesh",
             "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard"]
    code = describe(dataclasses.replace(cfg, wrapper="none"), target.backend) if ours else None
    hook = ""
    if code:
        spec, piece = SPECS[cfg.hook], code.chosen[0]
        hook = piece.expr
        lines[:0] = code.imports().splitlines()
        if piece.commlab and spec.blocking:  # FSDP reads the result as the hook returns
            lines.append(f"import {spec.variant} as commlab_{spec.variant.rsplit('.', 1)[1]}")
            hook = f"commlab_{spec.variant.rsplit('.', 1)[1]}.{spec.blocking}"
        if not piece.commlab:
            lines.append(f"import {COMMLAB_MODULE} as {COMMLAB_ALIAS}")
        text += "\n".join(dict.fromkeys(lines)) + "\n" + code.choice_line()
    else:
        text += "\n".join(lines) + "\n"
    text += "\n"
    if cfg.sharding == "hsdp":
        text += (f"mesh = init_device_mesh({device!r}, ({cfg.replicas!r}, dist.get_world_size() // {cfg.replicas!r}), "
                 "mesh_dim_names=('replicate', 'shard'))\n")
    else:
        text += f"mesh = init_device_mesh({device!r}, (dist.get_world_size(),), mesh_dim_names=('shard',))\n"
    where = 'mesh["shard"]' if ours else "mesh"
    text += (f"options = dict(mesh={where}, reshard_after_forward={cfg.reshard_after_forward!r},\n"
             f"               mp_policy=MixedPrecisionPolicy(reduce_dtype={DTYPES[cfg.reduce_dtype]}))\n")
    text += UNITS
    text += "for unit in units:\n    fully_shard(unit, **options)\nfully_shard(model, **options)\n"
    if code:
        group = 'mesh["replicate"].get_group()'
        state = group if code.state == "None" else code.state.replace("process_group=None", f"process_group={group}", 1)
        text += (comment(["The all-reduce between replicas, on each rank's shards, by the hook (set on every "
                          "unit: FSDP keeps the hook per module it sharded)."])
                 + f"state = {state}\n"
                 + f"replicas_hook = {COMMLAB_ALIAS}.ReplicaAllReduce({hook}, state, [*units, model], "
                   'mesh["shard"].size())\n')
    return text
