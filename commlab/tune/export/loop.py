"""The loop export: DiLoCo in plain PyTorch, the outer optimizer over the parameters at the last sync."""
from __future__ import annotations

from commlab.config import RunConfig
from commlab.tune.export.outer_loop import diloco_what, require_outer_loop
from commlab.tune.export.preamble import header
from commlab.tune.export.target import Target
from commlab.tune.export.text import comment

_AVERAGE_CAST = '''

def average(tensors):
    """The mean over the ranks of each tensor: cast to {dtype}, divided by the ranks, allreduced."""
    world = dist.get_world_size()
    wire = torch.cat([t.reshape(-1) for t in tensors]).to(torch.{dtype}).div_(world)
    dist.all_reduce(wire)
    return wire.float().split([t.numel() for t in tensors])
'''
_AVERAGE_INT8 = '''

def average(tensors):
    """The mean over the ranks of each tensor, sent as int8: its codes round(x / scale), scale =
    max|x| / 127, allgathered with the scales (an int8 sum would overflow in an allreduce) and
    averaged in float32."""
    world = dist.get_world_size()
    scales = torch.stack([t.abs().max() / 127 for t in tensors])
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.cat([torch.round(t.reshape(-1) / s).clamp_(-127, 127)
                       for t, s in zip(tensors, safe)]).to(torch.int8)
    all_scales = [torch.empty_like(scales) for _ in range(world)]
    dist.all_gather(all_scales, scales)
    all_codes = [torch.empty_like(codes) for _ in range(world)]
    dist.all_gather(all_codes, codes)
    sizes = [t.numel() for t in tensors]
    total = torch.zeros(codes.numel(), device=codes.device)
    for c, s in zip(all_codes, all_scales):
        total += c.float() * torch.repeat_interleave(s, torch.tensor(sizes, device=s.device))
    return total.div_(world).split(sizes)
'''
_OUTER_STEP = '''

def diloco_step(step):
    """After optimizer.step(): the outer step at every SYNC_EVERY-th (``step`` counts from 0)."""
    if (step + 1) % SYNC_EVERY:
        return
    params = list(model.parameters())
    with torch.no_grad():
        pseudo = [outer - p.detach().float() for outer, p in zip(outer_params, params)]
        for outer, g in zip(outer_params, average(pseudo)):
            outer.grad = g.view_as(outer)
        outer_optimizer.step()
        outer_optimizer.zero_grad(set_to_none=True)
        for outer, p in zip(outer_params, params):
            p.copy_(outer)
'''


def loop_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """DiLoCo in plain PyTorch: the outer optimizer over the parameters at the last sync, the
    pseudo-gradient averaged as commlab's ``DiLoCoState`` averages it (the same operations: a run
    of both gives the same parameters), and the one line for the training loop."""
    require_outer_loop(cfg, "loop")
    text = comment(header(cfg, target, source)[:1] + [
        diloco_what(cfg) + " commlab.hooks.DiLoCoState runs the same steps in the lab.",
        f"Paste after dist.init_process_group({target.backend!r}) and after `model` (not wrapped in "
        "DistributedDataParallel) and its `optimizer` are made, on every rank."])
    text += "import torch\nimport torch.distributed as dist\n\n"
    text += f"SYNC_EVERY = {cfg.sync_every!r}\n"
    text += ("for p in model.parameters():  # every replica starts from rank 0's parameters\n"
             "    dist.broadcast(p.data, src=0)\n"
             "outer_params = [p.detach().float().clone() for p in model.parameters()]  # at the last sync\n"
             f"outer_optimizer = torch.optim.SGD(outer_params, lr={cfg.outer_lr!r}, "
             f"momentum={cfg.outer_momentum!r}, nesterov={cfg.outer_nesterov!r})\n")
    dtypes = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    text += (_AVERAGE_INT8 if cfg.outer_precision == "int8" else
             _AVERAGE_CAST.format(dtype=dtypes[cfg.outer_precision]))
    text += _OUTER_STEP + "\n\n"
    text += comment(["In the training loop, right after optimizer.step(), with `step` counting the "
                     "steps from 0:", "  diloco_step(step)",
                     "Checkpoint at a sync step (the model is then the last sync's parameters) with "
                     "outer_optimizer.state_dict() beside the model's."])
    return text
