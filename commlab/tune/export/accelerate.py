"""The accelerate export: ``DistributedDataParallelKwargs`` and ``Accelerator``, then ``prepare``,
and the launch line for Accelerate's processes, which the trainer export shares."""
from __future__ import annotations

from commlab.config import RunConfig
from commlab.hook_specs import BASELINE
from commlab.tune.export.checkpoint import checkpoint_lines
from commlab.tune.export.hook_code import ACCELERATE_MEMBERS, bucket_cap, describe, facts
from commlab.tune.export.preamble import header
from commlab.tune.export.target import Target
from commlab.tune.export.text import comment, words
from commlab.tune.export.torchrun import RDZV_PORT, torchrun_comment_lines


def accelerate_members(cfg: RunConfig) -> tuple[str, str] | None:
    """(comm_hook, comm_wrapper) members of DDPCommunicationHookType naming ``cfg``'s hook, or
    None where it has none (the snippet then registers the hook on the prepared model)."""
    f = facts(cfg)
    if f.accelerate is None:
        return None
    if cfg.hook == BASELINE and cfg.wrapper != "none":
        # Accelerate applies a wrapper only to a hook it registers, and NO registers none; PyTorch
        # documents fp16_compress_hook as fp16_compress_wrapper(allreduce_hook) (bf16 alike).
        return f.wrapper_accelerate, "NO"
    return f.accelerate, f.wrapper_accelerate


def accelerate_launch(cfg: RunConfig, target: Target) -> list[str]:
    """The launch comment lines.  ``accelerate launch --cpu`` starts one process (its simple
    launcher, without mpirun), so on CPU torchrun starts the processes and ``Accelerator(cpu=True)``
    joins them (MULTI_CPU); on GPUs ``accelerate launch --multi_gpu``, with every argument that
    several machines need."""
    script = [target.script, *target.script_args]
    if target.backend != "nccl":
        return ["launch (accelerate launch --cpu would start one process; torchrun starts "
                f"{target.procs(cfg)} per node):", *torchrun_comment_lines(cfg, target)]
    world = target.procs(cfg) * target.nnodes
    argv = ["accelerate", "launch", "--multi_gpu", "--num_machines", str(target.nnodes),
            "--num_processes", str(world)]
    ours: tuple[str, ...] = ()
    if target.nnodes > 1:
        ip, port = (target.rdzv_endpoint.rsplit(":", 1) if target.rdzv_endpoint and ":" in
                    target.rdzv_endpoint else ('"$HEAD_NODE"', str(RDZV_PORT)))
        argv += ["--machine_rank", '"$NODE_RANK"', "--main_process_ip", ip, "--main_process_port", port]
        ours = ('"$NODE_RANK"', '"$HEAD_NODE"')
        lines = [f"launch, on every node with NODE_RANK its index (0 on the first) and HEAD_NODE the "
                 f"first node's address; {RDZV_PORT} is a free TCP port there that every node reaches:"]
    else:
        lines = ["launch:"]
    return lines + ["  " + words(argv + script, ours)]


def accelerate_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """``DistributedDataParallelKwargs`` and ``Accelerator``, then ``prepare``; the hook by name in
    the kwargs where Accelerate can register it, else registered on the prepared model (its
    DistributedDataParallel) with ``model.register_comm_hook``.

    Every state is built here and registered on the prepared model: Accelerate would build
    PowerSGD's inside ``prepare`` where no checkpoint can reach it, and ``DDPCommunicationHookType``
    names only PyTorch's default and PowerSGD hooks.  commlab's pieces are always registered on the
    prepared model: Accelerate's names mean PyTorch's hooks."""
    code = describe(cfg, target.backend)
    members = accelerate_members(cfg)
    # A state is built here, where a checkpoint reaches it: never by Accelerate, inside prepare.
    by_name = members is not None and code.facts.state is None and not code.commlab
    extra = []
    if by_name and cfg.hook == BASELINE and cfg.wrapper != "none":
        extra.append(f"{cfg.wrapper}_compress_wrapper(allreduce_hook) is {cfg.wrapper}_compress_hook, "
                     f"so comm_hook={members[0]} says it.")
    if members is None:
        extra.append(f"Accelerate's DDPCommunicationHookType cannot name {code.facts.name} "
                     f"(it has {', '.join(ACCELERATE_MEMBERS)}, and NO means "
                     "DDP's own allreduce): the snippet registers it on the prepared model.")
    text = comment(header(cfg, target, source) + extra)
    names = "DDPCommunicationHookType, DistributedDataParallelKwargs" if by_name else "DistributedDataParallelKwargs"
    imports = ("from accelerate import Accelerator", f"from accelerate.utils import {names}")
    text += code.imports(imports, hooks=not by_name)
    text += code.choice_line()
    args = []
    if by_name:
        hook_member, wrapper_member = members
        args.append(f"    comm_hook=DDPCommunicationHookType.{hook_member},")
        if wrapper_member != "NO":
            args.append(f"    comm_wrapper=DDPCommunicationHookType.{wrapper_member},")
    if bucket_cap(cfg):
        args.append(f"    {bucket_cap(cfg)},")
    text += "ddp_kwargs = DistributedDataParallelKwargs(" + "".join(f"\n{a}" for a in args) + ("\n" if args else "") + ")\n"
    cpu = "cpu=True, " if target.backend != "nccl" else ""
    text += f"accelerator = Accelerator({cpu}kwargs_handlers=[ddp_kwargs])\n"
    text += "model, optimizer = accelerator.prepare(model, optimizer)  # your model and optimizer\n"
    if not by_name:
        text += code.setup() + code.register("model") + code.after("model")
    text += comment(accelerate_launch(cfg, target))
    return text + checkpoint_lines(code.facts, "accelerator.get_state_dict(model)",
                                   "on resume, before register_comm_hook")
