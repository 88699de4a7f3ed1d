"""The ddp export: the hook registered on your DistributedDataParallel with ``register_comm_hook``."""
from __future__ import annotations

from commlab.config import RunConfig, is_plain_allreduce
from commlab.tune.export.checkpoint import checkpoint_lines
from commlab.tune.export.hook_code import bucket_cap, describe
from commlab.tune.export.preamble import header
from commlab.tune.export.target import Target
from commlab.tune.export.text import comment


def ddp_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """Imports, the state, the hook, ``register_comm_hook``: to paste after the model is wrapped;
    for post-local SGD the subgroups first and the averager with its line for the training loop."""
    code = describe(cfg, target.backend)
    ddp_args = ["model"] + (["device_ids=[local_rank]"] if target.backend == "nccl" else [])
    ddp_args += [a for a in [bucket_cap(cfg)] if a]
    text = comment(header(cfg, target, source) + [
        "Paste after the model is wrapped, with `ddp_model` your DistributedDataParallel:",
        f"  dist.init_process_group({target.backend!r})",
        f"  ddp_model = DistributedDataParallel({', '.join(ddp_args)})"])
    text += code.imports() + code.choice_line()
    if is_plain_allreduce(cfg.to_dict()):
        text += f"# {code.facts.name} is what DDP does with no hook; registering it changes nothing.\n"
    text += code.setup() + code.register("ddp_model") + code.after("ddp_model")
    return text + checkpoint_lines(code.facts, "ddp_model.state_dict()", "on resume, before register_comm_hook")
