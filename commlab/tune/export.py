"""A run's configuration for production: config files, code snippets, launch lines.

Every builder is pure (settings in, text out) and tested on its own, as Accelerate tests its
launch-command builder.  Production means PyTorch's own hooks: a snippet never imports commlab, and
where commlab ran its Gloo-safe variant the snippet names PyTorch's hook and says what differs.
Text meant for a shell quotes every value that came from the user with ``shlex.quote``.

Formats: json and toml (load back to the identical ``RunConfig``), ddp (plain
``register_comm_hook``), lightning (``DDPStrategy``), accelerate (``DistributedDataParallelKwargs``),
torchrun (one node and several), slurm (a batch script).
"""
from __future__ import annotations

import dataclasses
import re
import shlex
import textwrap
from dataclasses import dataclass, field

from commlab.config import POWERSGD_FIELDS, RunConfig
from commlab.hooks import registry
from commlab.tune.whatif import config_link_label

# PowerSGDState's own defaults (torch 2.13); a test holds them to the installed signature.
TORCH_POWERSGD_DEFAULTS = {
    "matrix_approximation_rank": 1, "start_powerSGD_iter": 1000, "min_compression_rate": 2,
    "use_error_feedback": True, "warm_start": True, "orthogonalization_epsilon": 0,
    "random_seed": 0, "batch_tensors_with_same_shape": False,
}
# Spelled out even at their defaults: they are what a sweep tunes.
ALWAYS_SPELLED = ("matrix_approximation_rank", "start_powerSGD_iter")
DDP_DEFAULT_BUCKET_CAP_MB = 25.0

_PKG = "torch.distributed.algorithms.ddp_comm_hooks"
MODULES = {"default": f"{_PKG}.default_hooks", "powerSGD": f"{_PKG}.powerSGD_hook",
           "debugging": f"{_PKG}.debugging_hooks"}
# hook / wrapper -> (module alias, attribute) of PyTorch's function
HOOKS = {"allreduce": ("default", "allreduce_hook"), "fp16": ("default", "fp16_compress_hook"),
         "bf16": ("default", "bf16_compress_hook"), "powersgd": ("powerSGD", "powerSGD_hook"),
         "batched_powersgd": ("powerSGD", "batched_powerSGD_hook"),
         "noop": ("debugging", "noop_hook")}
WRAPPERS = {"fp16": ("default", "fp16_compress_wrapper"), "bf16": ("default", "bf16_compress_wrapper")}
# commlab hook -> Accelerate's DDPCommunicationHookType member
ACCELERATE_HOOKS = {"allreduce": "NO", "fp16": "FP16", "bf16": "BF16", "powersgd": "POWER_SGD",
                    "batched_powersgd": "BATCHED_POWER_SGD"}
ACCELERATE_WRAPPERS = {"none": "NO", "fp16": "FP16", "bf16": "BF16"}
LIGHTNING_CUDA_ONLY = ("Lightning registers DDP communication hooks only when the strategy's root "
                       "device is CUDA (DDPStrategy._register_ddp_hooks): on CPU it silently trains "
                       "with DDP's plain allreduce.")
_SAFE = re.compile(r"[A-Za-z0-9._:-]+")


class ExportRefused(ValueError):
    """The target cannot express these settings; the message says why and what to do instead."""


@dataclass
class Target:
    """Where the job will run: the launch formats read it, the config formats ignore it."""

    nnodes: int = 1
    nproc_per_node: int | None = None  # None: the run's world size on one node
    backend: str = "nccl"  # what production runs on; decides the warnings
    script: str = "train.py"
    script_args: list[str] = field(default_factory=list)
    rdzv_endpoint: str | None = None  # host:port of the first node; None: $HEAD_NODE:29500
    job_name: str = "commlab"
    time_limit: str = "01:00:00"
    partition: str | None = None

    @classmethod
    def from_entries(cls, script_args: str | None = None, **entries) -> Target:
        """A target from what a person typed (CLI flags, a form): the script's arguments as one
        shell-quoted string, an empty entry for an optional field meaning "not given".  Raises
        ValueError for unbalanced quotes."""
        optional = {f.name for f in dataclasses.fields(cls) if f.default is None}
        given = {k: None if k in optional and v == "" else v for k, v in entries.items()}
        return cls(script_args=shlex.split(script_args or ""), **given)

    def procs(self, cfg: RunConfig) -> int:
        return self.nproc_per_node or cfg.world_size

    def errors(self) -> dict[str, str]:
        e = {}
        if self.nnodes < 1:
            e["nnodes"] = f"must be at least 1, got {self.nnodes}"
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            e["nproc_per_node"] = f"must be at least 1, got {self.nproc_per_node}"
        if self.backend not in registry.BACKENDS:
            e["backend"] = f"must be one of {', '.join(registry.BACKENDS)}, got {self.backend!r}"
        if not self.script.strip():
            e["script"] = "name the training script torchrun starts"
        # SBATCH lines are read by sbatch, not a shell: quoting cannot protect them.
        for name in ("job_name", "time_limit", "partition"):
            value = getattr(self, name)
            if value is not None and not _SAFE.fullmatch(value):
                e[name] = f"may hold letters, digits and . _ : - only, got {value!r}"
        return e


@dataclass
class Export:
    format: str
    text: str
    filename: str
    language: str  # for st.code
    mime: str
    notes: list[str]  # warnings a person should read before using the text


# ============================================================================ shared pieces
def powersgd_settings(cfg: RunConfig) -> dict:
    """PowerSGDState keywords to spell out: the tuned two, and every other non-default one."""
    return {k: getattr(cfg, k) for k in POWERSGD_FIELDS
            if k in ALWAYS_SPELLED or getattr(cfg, k) != TORCH_POWERSGD_DEFAULTS[k]}


def notes(cfg: RunConfig, target: Target) -> list[str]:
    """What a person must know before using any export of ``cfg`` on ``target``."""
    out = []
    warning = registry.stock_warning(dataclasses.replace(cfg, impl="stock"), target.backend)
    if warning:
        out.append(f"PyTorch's own hook on {target.backend}: {warning}")
    if cfg.hook == "noop":
        out.append("noop_hook sends nothing: gradients are never averaged and the replicas drift "
                   "apart. It is for headroom analysis, never for training.")
    link = config_link_label(cfg.to_dict())
    if link:
        out.append(f"The run used an {link} link, a lab setting: production uses its real network, "
                   "and the snippets leave it out.")
    return out


def _comment(lines: list[str], prefix: str = "# ") -> str:
    return "".join(textwrap.fill(line, 96, initial_indent=prefix, subsequent_indent=prefix) + "\n"
                   for line in lines)


def _hook_expr(cfg: RunConfig) -> str:
    module, attr = HOOKS[cfg.hook]
    expr = f"{module}.{attr}"
    if cfg.wrapper != "none":
        w_module, w_attr = WRAPPERS[cfg.wrapper]
        expr = f"{w_module}.{w_attr}({expr})"
    return expr


def _imports(cfg: RunConfig, extra: tuple[str, ...] = ()) -> str:
    aliases = [HOOKS[cfg.hook][0]] + ([WRAPPERS[cfg.wrapper][0]] if cfg.wrapper != "none" else [])
    lines = [f"import {MODULES[a]} as {a}" for a in dict.fromkeys(sorted(aliases))]
    return "\n".join(lines + list(extra)) + "\n"


def _state_expr(cfg: RunConfig, indent: str) -> str:
    args = [f"{indent}    process_group=None,"]
    args += [f"{indent}    {k}={v!r}," for k, v in powersgd_settings(cfg).items()]
    return "powerSGD.PowerSGDState(\n" + "\n".join(args) + f"\n{indent})"


def _header(cfg: RunConfig, target: Target, source: str | None) -> list[str]:
    head = [f"commlab export: {cfg.label()}" + (f" (from run {source})" if source else "")]
    return head + notes(cfg, target)


# ============================================================================ config files
def to_json(cfg: RunConfig) -> str:
    return cfg.to_json() + "\n"


def to_toml(cfg: RunConfig) -> str:
    return cfg.to_toml()


# ============================================================================ plain DDP
def ddp_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """Imports, the state, the hook, ``register_comm_hook``: to paste after the model is wrapped."""
    ddp_args = ["model"] + (["device_ids=[local_rank]"] if target.backend == "nccl" else [])
    if cfg.bucket_cap_mb != DDP_DEFAULT_BUCKET_CAP_MB:
        ddp_args.append(f"bucket_cap_mb={cfg.bucket_cap_mb:g}")
    text = _comment(_header(cfg, target, source) + [
        "Paste after the model is wrapped, with `ddp_model` your DistributedDataParallel:",
        f"  dist.init_process_group({target.backend!r})",
        f"  ddp_model = DistributedDataParallel({', '.join(ddp_args)})"])
    text += _imports(cfg) + "\n"
    if cfg.is_powersgd:
        text += f"state = {_state_expr(cfg, '')}\n"
        text += f"ddp_model.register_comm_hook(state, {_hook_expr(cfg)})\n"
    else:
        if cfg.hook == "allreduce" and cfg.wrapper == "none":
            text += "# allreduce_hook is what DDP does with no hook; registering it changes nothing.\n"
        text += f"ddp_model.register_comm_hook(None, {_hook_expr(cfg)})\n"
    return text


# ============================================================================ Lightning
def lightning_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """A ``DDPStrategy`` with the hook, its state and the wrapper, and the ``Trainer`` using it."""
    text = _comment(_header(cfg, target, source) + [f"Warning: {LIGHTNING_CUDA_ONLY}"])
    text += _imports(cfg, ("from lightning.pytorch import Trainer",
                           "from lightning.pytorch.strategies import DDPStrategy")) + "\n"
    args = []
    if cfg.is_powersgd:
        args.append(f"    ddp_comm_state={_state_expr(cfg, '    ')},")
    module, attr = HOOKS[cfg.hook]
    args.append(f"    ddp_comm_hook={module}.{attr},")
    if cfg.wrapper != "none":
        w_module, w_attr = WRAPPERS[cfg.wrapper]
        args.append(f"    ddp_comm_wrapper={w_module}.{w_attr},")
    if cfg.bucket_cap_mb != DDP_DEFAULT_BUCKET_CAP_MB:
        args.append(f"    bucket_cap_mb={cfg.bucket_cap_mb:g},  # passed on to DistributedDataParallel")
    text += "strategy = DDPStrategy(\n" + "\n".join(args) + "\n)\n"
    accelerator = "gpu" if target.backend == "nccl" else "cpu"
    text += (f"trainer = Trainer(accelerator={accelerator!r}, devices={target.procs(cfg)}, "
             f"num_nodes={target.nnodes}, strategy=strategy)\n")
    return text


# ============================================================================ Accelerate
def accelerate_members(cfg: RunConfig) -> tuple[str, str]:
    """(comm_hook, comm_wrapper) members of DDPCommunicationHookType; raises ExportRefused."""
    if cfg.hook not in ACCELERATE_HOOKS:
        raise ExportRefused(
            f"Accelerate cannot express the {cfg.hook} hook: DDPCommunicationHookType has only "
            f"{', '.join(dict.fromkeys(ACCELERATE_HOOKS.values()))}, and NO means DDP's own "
            "allreduce. Register it yourself on the prepared model: model.register_comm_hook(None, "
            f"{MODULES[HOOKS[cfg.hook][0]]}.{HOOKS[cfg.hook][1]}).")
    if cfg.hook == "allreduce" and cfg.wrapper != "none":
        # Accelerate applies a wrapper only to a hook it registers, and NO registers none; PyTorch
        # documents fp16_compress_hook as fp16_compress_wrapper(allreduce_hook) (bf16 alike).
        return ACCELERATE_WRAPPERS[cfg.wrapper], "NO"
    return ACCELERATE_HOOKS[cfg.hook], ACCELERATE_WRAPPERS[cfg.wrapper]


def accelerate_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """``DistributedDataParallelKwargs`` naming the hook, the wrapper and PowerSGD's state options."""
    hook, wrapper = accelerate_members(cfg)
    extra = []
    if cfg.hook == "allreduce" and cfg.wrapper != "none":
        extra.append(f"{cfg.wrapper}_compress_wrapper(allreduce_hook) is {cfg.wrapper}_compress_hook, "
                     f"so comm_hook={hook} says it.")
    text = _comment(_header(cfg, target, source) + extra)
    text += ("from accelerate import Accelerator\n"
             "from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs\n\n")
    args = [f"    comm_hook=DDPCommunicationHookType.{hook},"]
    if wrapper != "NO":
        args.append(f"    comm_wrapper=DDPCommunicationHookType.{wrapper},")
    if cfg.is_powersgd:
        options = ", ".join(f"{k!r}: {v!r}" for k, v in powersgd_settings(cfg).items())
        args.append(f"    comm_state_option={{{options}}},")
    if cfg.bucket_cap_mb != DDP_DEFAULT_BUCKET_CAP_MB:
        args.append(f"    bucket_cap_mb={cfg.bucket_cap_mb:g},")
    text += "ddp_kwargs = DistributedDataParallelKwargs(\n" + "\n".join(args) + "\n)\n"
    text += "accelerator = Accelerator(kwargs_handlers=[ddp_kwargs])\n"
    world = target.procs(cfg) * target.nnodes
    gpus = "--multi_gpu " if target.backend == "nccl" else ""
    text += (f"# launch: accelerate launch {gpus}--num_machines {target.nnodes} "
             f"--num_processes {world} {shlex.join([target.script, *target.script_args])}\n")
    return text


# ============================================================================ launch lines
# With no endpoint given, the several-nodes line reads the first node's address from the shell.
HEAD_NODE_ENDPOINT = '"$HEAD_NODE:29500"'
HEAD_NODE_CHECK = ': "${HEAD_NODE:?set HEAD_NODE to the address of the first node}"\n'


def torchrun_argv(cfg: RunConfig, target: Target, nnodes: int, endpoint: str | None = None) -> list[str]:
    """torchrun's argv: standalone on one node, a c10d rendezvous at ``endpoint`` on several."""
    script = [target.script, *target.script_args]
    procs = ["--nproc-per-node", str(target.procs(cfg))]
    if nnodes == 1:
        return ["torchrun", "--standalone", "--nnodes", "1", *procs, *script]
    return ["torchrun", "--nnodes", str(nnodes), *procs, "--rdzv-id", target.job_name,
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint or HEAD_NODE_ENDPOINT, *script]


def _shell(argv: list[str], script_len: int, ours: tuple[str, ...] = ()) -> str:
    """One command line, an option and its value per line, the script and its arguments last.

    Every argument is quoted except those in ``ours``, which are already written for the shell.
    """
    words = [a if a in ours else shlex.quote(a) for a in argv]
    groups: list[list[str]] = []
    for word in words[:len(words) - script_len]:
        if word.startswith("--") or not groups:
            groups.append([word])
        else:
            groups[-1].append(word)
    groups.append(words[len(words) - script_len:])
    return " \\\n    ".join(" ".join(g) for g in groups)


def torchrun_lines(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """The one-node line and the several-nodes line (run on every node) for the same job."""
    nodes, procs = max(target.nnodes, 2), target.procs(cfg)
    text = "#!/usr/bin/env bash\n" + _comment(_header(cfg, target, source))
    script_len = 1 + len(target.script_args)
    text += (f"\n# One node, {procs} process(es):\n"
             + _shell(torchrun_argv(cfg, target, 1), script_len) + "\n")
    text += "\n" + _comment([f"{nodes} nodes, {procs} process(es) each: run this same line on "
                             "every node; the endpoint is a host:port of the first node that every "
                             "node reaches."])
    if not target.rdzv_endpoint:
        text += HEAD_NODE_CHECK
    argv = torchrun_argv(cfg, target, nodes, target.rdzv_endpoint)
    ours = () if target.rdzv_endpoint else (HEAD_NODE_ENDPOINT,)
    return text + _shell(argv, script_len, ours) + "\n"


def slurm_script(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """An sbatch script: one task per node, each starting torchrun, rendezvous on the first node."""
    procs = target.procs(cfg)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={target.job_name}",
             f"#SBATCH --nodes={target.nnodes}", "#SBATCH --ntasks-per-node=1"]
    if target.backend == "nccl":
        lines.append(f"#SBATCH --gpus-per-node={procs}")
    lines.append(f"#SBATCH --time={target.time_limit}")
    if target.partition:
        lines.append(f"#SBATCH --partition={target.partition}")
    text = "\n".join(lines) + "\n" + _comment(_header(cfg, target, source))
    text += "set -euo pipefail\n"
    text += 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
    ours = ('"$SLURM_NNODES"', '"$SLURM_JOB_ID"', '"$head_node:29500"')
    argv = ["srun", "torchrun", "--nnodes", ours[0], "--nproc-per-node", str(procs),
            "--rdzv-id", ours[1], "--rdzv-backend", "c10d", "--rdzv-endpoint", ours[2],
            target.script, *target.script_args]
    return text + _shell(argv, 1 + len(target.script_args), ours) + "\n"


# ============================================================================ dispatch
FORMATS = {
    # format: (builder, filename, language for display, MIME type)
    "json": (lambda cfg, target, source: to_json(cfg), "commlab.json", "json", "application/json"),
    "toml": (lambda cfg, target, source: to_toml(cfg), "commlab.toml", "toml", "application/toml"),
    "ddp": (ddp_snippet, "ddp_comm_hook.py", "python", "text/x-python"),
    "lightning": (lightning_snippet, "lightning_strategy.py", "python", "text/x-python"),
    "accelerate": (accelerate_snippet, "accelerate_kwargs.py", "python", "text/x-python"),
    "torchrun": (torchrun_lines, "launch.sh", "bash", "text/x-shellscript"),
    "slurm": (slurm_script, "job.sbatch", "bash", "text/x-shellscript"),
}


def render(cfg: RunConfig, fmt: str, target: Target | None = None, source: str | None = None) -> Export:
    """One export of ``cfg``.  Raises ValueError for an unknown format or target, ExportRefused
    when the format cannot express the settings."""
    target = target or Target()
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; formats are: {', '.join(FORMATS)}")
    errs = target.errors()
    if errs:
        raise ValueError("; ".join(f"{k}: {v}" for k, v in errs.items()))
    build, filename, language, mime = FORMATS[fmt]
    text = build(cfg, target, source)
    extra = [f"Warning: {LIGHTNING_CUDA_ONLY}"] if fmt == "lightning" else []
    return Export(fmt, text, filename, language, mime, notes(cfg, target) + extra)
