"""A run's configuration for production: config files, code snippets, launch lines.

Every builder is pure (settings in, text out) and tested on its own, as Accelerate tests its
launch-command builder; none imports or runs the workload.  Each hook and wrapper is PyTorch's
where PyTorch's works on the target backend, and commlab's Gloo-safe variant (``commlab.hooks``,
the same algorithm and state) where PyTorch's fails there; which pieces fail where is read from
``commlab.hooks.registry``, and the snippet says which it chose and why in one comment line.

Text is safe whatever a person typed (``text``); floats are written with ``repr``; no file names
a path of the exporting machine.

One module per target, each asking ``hook_code.describe`` for the hook's code (its imports, its
state, its register call) and ``checkpoint`` for the state's save and load lines: json and toml
(``config_files``: load back to the same ``RunConfig``, less the lab's runs folder), ddp (plain
``register_comm_hook``), lightning (``DDPStrategy``), accelerate
(``DistributedDataParallelKwargs``), trainer (Hugging Face's ``Trainer``: a callback registers the
hook on the DDP model Accelerate prepared), torchrun (one node and several), slurm (a batch
script); for DiLoCo, without DDP, loop (plain PyTorch) and torchft; for a sharded run, in place
of DDP's, fsdp (FSDP2's ``fully_shard``, HSDP's mesh and the hook between replicas).  Every hook is exported with
its state built from the run's settings: PowerSGD's, the compressors' (commlab's, PyTorch has
none), post-local SGD's with its subgroups and its ``PeriodicModelAverager`` stepped after
``optimizer.step()`` as PyTorch's documentation shows.
"""
from __future__ import annotations

from commlab.config import RunConfig
from commlab.tune.export.accelerate import accelerate_launch, accelerate_members, accelerate_snippet
from commlab.tune.export.config_files import config_dict, to_json, to_toml
from commlab.tune.export.ddp import ddp_snippet
from commlab.tune.export.fsdp import fsdp_snippet
from commlab.tune.export.hook_code import Choice, HookCode, choices, describe, facts
from commlab.tune.export.lightning import LIGHTNING_CUDA_ONLY, lightning_snippet
from commlab.tune.export.loop import loop_snippet
from commlab.tune.export.preamble import notes
from commlab.tune.export.slurm import slurm_script
from commlab.tune.export.target import LAB_ONLY, Export, ExportRefused, Target, export_errors
from commlab.tune.export.text import one_line, quote
from commlab.tune.export.torchft import torchft_snippet
from commlab.tune.export.torchrun import HEAD_NODE_CHECK, PORT_NOTE, RDZV_PORT, torchrun_argv, torchrun_lines
from commlab.tune.export.trainer import trainer_snippet

__all__ = ["ALL_FORMATS", "FORMATS", "HEAD_NODE_CHECK", "LAB_ONLY", "LIGHTNING_CUDA_ONLY",
           "OUTER_LOOP_FORMATS", "PORT_NOTE", "RDZV_PORT", "Choice", "Export", "ExportRefused",
           "HookCode", "Target", "accelerate_launch", "accelerate_members", "accelerate_snippet",
           "choices", "config_dict", "ddp_snippet", "describe", "export_errors", "facts", "fsdp_snippet",
           "formats_for", "lightning_snippet", "loop_snippet", "notes", "one_line", "quote", "render",
           "slurm_script", "to_json", "to_toml", "torchft_snippet", "torchrun_argv", "torchrun_lines",
           "trainer_snippet", "world_refusal"]

FORMATS = {
    # format: (builder, filename, language for display, MIME type)
    "json": (lambda cfg, target, source: to_json(cfg), "commlab.json", "json", "application/json"),
    "toml": (lambda cfg, target, source: to_toml(cfg), "commlab.toml", "toml", "application/toml"),
    "ddp": (ddp_snippet, "ddp_comm_hook.py", "python", "text/x-python"),
    "lightning": (lightning_snippet, "lightning_strategy.py", "python", "text/x-python"),
    "accelerate": (accelerate_snippet, "accelerate_kwargs.py", "python", "text/x-python"),
    "trainer": (trainer_snippet, "hf_trainer.py", "python", "text/x-python"),
    "torchrun": (torchrun_lines, "launch.sh", "bash", "text/x-shellscript"),
    "slurm": (slurm_script, "job.sbatch", "bash", "text/x-shellscript"),
}
# Formats of a hook with an outer loop (DiLoCo's), without DDP: ``formats_for`` offers them.
OUTER_LOOP_FORMATS = {
    "loop": (loop_snippet, "diloco_loop.py", "python", "text/x-python"),
    "torchft": (torchft_snippet, "diloco_torchft.py", "python", "text/x-python"),
}
# Formats of a sharded run (``sharding`` fsdp or hsdp), with the launch and config formats: DDP's
# (and the integrations that wrap a model in DDP) would train another algorithm.
SHARDED_FORMATS = {"fsdp": (fsdp_snippet, "fsdp_sharding.py", "python", "text/x-python")}
ALL_FORMATS = {**FORMATS, **OUTER_LOOP_FORMATS, **SHARDED_FORMATS}


def formats_for(cfg: RunConfig) -> tuple[str, ...]:
    """The formats that can express ``cfg``: every one, and DiLoCo's own for DiLoCo; for a sharded
    run, fsdp beside the config and launch formats."""
    if cfg.sharding != "ddp":
        return ("json", "toml", *SHARDED_FORMATS, "torchrun", "slurm")
    return tuple(FORMATS) + (tuple(OUTER_LOOP_FORMATS) if facts(cfg).outer_loop else ())


def world_refusal(cfg: RunConfig, target: Target) -> str | None:
    """Why ``cfg`` cannot run on ``target``'s ranks, or None: post-local SGD's subgroups must cut
    the target's world into equal parts, whatever world the lab's run had."""
    world = target.procs(cfg) * target.nnodes
    if cfg.sharding == "hsdp" and world % cfg.replicas:
        return (f"replicas={cfg.replicas} does not divide the target's {world} ranks ({target.nnodes} "
                f"node(s) × {target.procs(cfg)} process(es)): HSDP's mesh is replicas × (ranks / replicas)")
    if facts(cfg).subgroup and world % cfg.localsgd_subgroup_size:
        return (f"localsgd_subgroup_size={cfg.localsgd_subgroup_size} does not divide the target's "
                f"{world} ranks ({target.nnodes} node(s) × {target.procs(cfg)} process(es)): "
                "dist.new_subgroups cuts the ranks into subgroups of equal size, and raises "
                "ValueError otherwise. Choose a subgroup size that divides the ranks, or other "
                "nodes or processes per node")
    return None


def render(cfg: RunConfig, fmt: str, target: Target | None = None, source: str | None = None) -> Export:
    """One export of ``cfg``.  Raises ValueError for an unknown format or target, ExportRefused
    when the format cannot express the settings."""
    target = target or Target()
    if fmt not in ALL_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; formats are: {', '.join(ALL_FORMATS)}")
    errs = target.errors()
    if errs:
        raise ValueError("; ".join(f"{k}: {v}" for k, v in errs.items()))
    build, filename, language, mime = ALL_FORMATS[fmt]
    if fmt in (*FORMATS, *OUTER_LOOP_FORMATS, *SHARDED_FORMATS) and fmt not in formats_for(cfg) \
            and (cfg.sharding != "ddp" or fmt in SHARDED_FORMATS):
        raise ExportRefused(f"a {cfg.sharding} run exports as {', '.join(formats_for(cfg))}: {fmt} "
                            "would train another algorithm")
    if fmt not in ("json", "toml") and (why := world_refusal(cfg, target)):
        raise ExportRefused(why)
    text = build(cfg, target, source)
    extra = [f"Warning: {LIGHTNING_CUDA_ONLY}"] if fmt == "lightning" and target.backend == "nccl" else []
    return Export(fmt, text, filename, language, mime, notes(cfg, target) + extra)
