"""A run's configuration for production: config files, code snippets, launch lines.

Every builder is pure (settings in, text out) and tested on its own, as Accelerate tests its
launch-command builder; none imports or runs the workload.  Each hook and wrapper is PyTorch's
where PyTorch's works on the target backend, and commlab's Gloo-safe variant (``commlab.hooks``,
the same algorithm and state) where PyTorch's fails there; which pieces fail where is read from
``commlab.hooks.registry``, and the snippet says which it chose and why in one comment line.

Text is safe whatever a person typed: a value in a comment is escaped onto one line, a value in
Python is a ``repr`` literal, a value for a shell is quoted (``$'...'`` when it holds a control
character); floats are written with ``repr``; no file names a path of the exporting machine.

Formats: json and toml (load back to the same ``RunConfig``, less the lab's runs folder), ddp
(plain ``register_comm_hook``), lightning (``DDPStrategy``), accelerate
(``DistributedDataParallelKwargs``), trainer (Hugging Face's ``Trainer``: a callback registers the
hook on the DDP model Accelerate prepared), torchrun (one node and several), slurm (a batch script).
Every hook is exported with its state built from the run's settings: PowerSGD's, the compressors'
(commlab's, PyTorch has none), post-local SGD's with its subgroups and its ``PeriodicModelAverager``
stepped after ``optimizer.step()`` as PyTorch's documentation shows.
"""
from __future__ import annotations

import dataclasses
import json
import re
import shlex
import textwrap
from dataclasses import dataclass, field

from commlab.config import RunConfig, is_plain_allreduce, link_of
from commlab.engine.launchers.slurm import sbatch_line_errors
from commlab.hook_specs import BASELINE, SPECS, STEP_COUNTS, WHOLE_STATE, WRAPPER_SPECS, Build, spec
from commlab.hooks import registry

DDP_DEFAULT_BUCKET_CAP_MB = 25.0
# Settings of the lab, not of the training: a config file leaves them out (the runs folder is a
# path of the exporting machine; the loading machine uses its own default).
LAB_ONLY = ("runs_dir",)
# torchrun's default rendezvous port: any TCP port free on the first node that every node reaches.
RDZV_PORT = 29500
COMMLAB_MODULE = "commlab.hooks"
COMMLAB_ALIAS = "commlab_hooks"
LOCALSGD_SUBGROUPS = ("PostLocalSGDState(subgroup=None) would make one subgroup per machine on the "
                      "first local step, which raises ValueError without CUDA and would not be the "
                      "run's localsgd_subgroup_size")
LIGHTNING_AVERAGER = ("Lightning's DDPStrategy builds the PeriodicModelAverager itself, with "
                      "warmup_steps=start_localSGD_iter (DDPStrategy._enable_model_averaging)")
# Accelerate's DDPCommunicationHookType members that name a hook, in the table's order.
ACCELERATE_MEMBERS = tuple(dict.fromkeys(s.accelerate for s in SPECS.values() if s.accelerate))
LIGHTNING_CUDA_ONLY = ("Lightning registers DDP communication hooks only when the strategy's root "
                       "device is CUDA (DDPStrategy._register_ddp_hooks): on CPU it silently trains "
                       "with DDP's plain allreduce.")
LIGHTNING_STRATEGY = ("commlab.hooks.lightning_ddp", "AnyDeviceDDPStrategy")
CHECKPOINT = "checkpoint.pt"


class ExportRefused(ValueError):
    """The target cannot express these settings; the message says why and what to do instead."""


@dataclass
class Target:
    """Where the job will run: the launch formats read it, the config formats ignore it."""

    nnodes: int = 1
    nproc_per_node: int | None = None  # None: the run's world size on one node
    backend: str = "nccl"  # what production runs on; decides which hooks and warnings
    script: str = "train.py"
    script_args: list[str] = field(default_factory=list)
    rdzv_endpoint: str | None = None  # host:port of the first node; None: $HEAD_NODE:29500
    job_name: str = "commlab"
    time_limit: str = "01:00:00"
    partition: str | None = None
    threads_per_process: int = 1  # OMP_NUM_THREADS; torchrun's own default is 1

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
        for name, lowest in (("nnodes", 1), ("nproc_per_node", 1), ("threads_per_process", 1)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < lowest):
                e[name] = f"must be a whole number of at least {lowest}, got {value!r}"
        if self.backend not in registry.BACKENDS:
            e["backend"] = f"must be one of {', '.join(registry.BACKENDS)}, got {self.backend!r}"
        if not self.script.strip():
            e["script"] = "name the training script torchrun starts"
        return e | sbatch_line_errors({n: getattr(self, n) for n in ("job_name", "time_limit", "partition")})


@dataclass
class Export:
    format: str
    text: str
    filename: str
    language: str  # for st.code
    mime: str
    notes: list[str]  # warnings a person should read before using the text


def export_errors(cfg: RunConfig) -> dict[str, str]:
    """What keeps ``cfg`` from being exported: its own errors, less those about this machine (its
    GPUs, its runs folder), which production does not run on."""
    return {k: v for k, v in cfg.errors(gpu_count=cfg.world_size).items() if k not in LAB_ONLY}


# ============================================================================ which hooks
@dataclass(frozen=True)
class Choice:
    """One piece as the export writes it: PyTorch's, or commlab's where PyTorch's fails or where
    PyTorch has none."""

    piece: registry.Piece
    commlab: bool

    @property
    def alias(self) -> str:
        return COMMLAB_ALIAS if self.commlab else _alias(self.piece.module)

    @property
    def module(self) -> str:
        return COMMLAB_MODULE if self.commlab else self.piece.module

    @property
    def expr(self) -> str:
        return f"{self.alias}.{self.piece.attr}"

    def why(self, backend: str) -> str:
        if self.piece.module is None:
            return f"commlab's {self.piece.attr} (PyTorch has none)"
        if self.commlab:
            return f"commlab's {self.piece.attr} (PyTorch's fails on {backend}: see above)"
        return f"PyTorch's {self.piece.attr} (works on {backend})"


def _alias(module: str) -> str:
    # default_hooks -> default, powerSGD_hook -> powerSGD, debugging_hooks -> debugging
    return re.sub(r"_hooks?$", "", module.rsplit(".", 1)[1])


def choices(cfg: RunConfig, backend: str) -> list[Choice]:
    """The hook, then the wrapper if any: commlab's where PyTorch's fails on ``backend`` and where
    PyTorch has none.

    PyTorch's PowerSGD works on Gloo with one bucket, but how many buckets DDP makes depends on the
    model, which an export never loads: commlab's is used on Gloo whatever the bucket cap."""
    found = registry.pieces(cfg.hook, cfg.wrapper, backend)
    # commlab.hooks offers every variant the hook table names (its __all__ is read off the table).
    return [Choice(p, p.module is None or (bool(p.fails) and p.has_variant)) for p in found]


def choice_line(cfg: RunConfig, backend: str) -> str:
    """The one comment line that says which implementation each piece is and why."""
    chosen = choices(cfg, backend)
    ours = ""
    if any(c.commlab and c.piece.module for c in chosen):
        ours = (" commlab's are PyTorch's algorithm and state with every collective issued from the "
                "hook body, in bucket order.")
    elif any(c.commlab for c in chosen) and spec(cfg.hook).outer_loop:
        ours = " commlab's hook averages nothing; the outer step runs after optimizer.step()."
    elif any(c.commlab for c in chosen):
        ours = " commlab's issues every collective from the hook body, in bucket order."
    return "# Hooks: " + ", ".join(c.why(backend) for c in chosen) + "." + ours + "\n"


def world_refusal(cfg: RunConfig, target: Target) -> str | None:
    """Why ``cfg`` cannot run on ``target``'s ranks, or None: post-local SGD's subgroups must cut
    the target's world into equal parts, whatever world the lab's run had."""
    world = target.procs(cfg) * target.nnodes
    if spec(cfg.hook).subgroup and world % cfg.localsgd_subgroup_size:
        return (f"localsgd_subgroup_size={cfg.localsgd_subgroup_size} does not divide the target's "
                f"{world} ranks ({target.nnodes} node(s) × {target.procs(cfg)} process(es)): "
                "dist.new_subgroups cuts the ranks into subgroups of equal size, and raises "
                "ValueError otherwise. Choose a subgroup size that divides the ranks, or other "
                "nodes or processes per node")
    return None


# ============================================================================ shared pieces
def notes(cfg: RunConfig, target: Target) -> list[str]:
    """What a person must know before using any export of ``cfg`` on ``target``."""
    out = []
    for c in choices(cfg, target.backend):
        if c.commlab and c.piece.module is None:
            out.append(f"PyTorch has no {c.piece.attr}: the Python exports use commlab's "
                       "(commlab.hooks, which needs only torch: pip install commlab, without the "
                       "lab extra).")
        elif c.commlab:
            out.append(f"PyTorch's {c.piece.attr} fails on {target.backend}: {c.piece.fails}. The "
                       f"Python exports use commlab's {c.piece.attr} (commlab.hooks, which needs only "
                       "torch: pip install commlab, without the lab extra), the same algorithm "
                       "and state.")
    if spec(cfg.hook).sends_nothing:
        out.append(f"{spec(cfg.hook).attr} sends nothing: gradients are never averaged and the "
                   "replicas drift apart. It is for headroom analysis, never for training.")
    link = link_of(cfg.to_dict())
    if link:
        out.append(f"The run used an {link} link, a lab setting: production uses its real network, "
                   "and the snippets leave it out.")
    return out


def one_line(text: str) -> str:
    """``text`` with every character that is not printable (a newline, a carriage return, any
    control or line-separator character) written as its escape: a comment cannot be left."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in str(text))


def _comment(lines: list[str], prefix: str = "# ") -> str:
    """Each line a comment, prose wrapped at 96 columns; a line that starts with two spaces is
    code to copy and stays whole."""
    return "".join((prefix + one_line(line) if line.startswith("  ") else
                    textwrap.fill(one_line(line), 96, initial_indent=prefix, subsequent_indent=prefix))
                   + "\n" for line in lines)


def _imports(chosen: list[Choice], extra: tuple[str, ...] = ()) -> str:
    modules = dict.fromkeys(sorted((c.module, c.alias) for c in chosen))
    return "\n".join([f"import {m} as {a}" for m, a in modules] + list(extra)) + "\n"


def _call(func: str, first: list[str], kwargs: dict) -> str:
    """``func(first..., key=value, ...)``, one argument a line; values as ``repr`` literals."""
    args = first + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{func}(\n" + "".join(f"    {a},\n" for a in args) + ")"


@dataclass
class HookCode:
    """What a Python export writes for ``cfg``'s hook, each part empty where the hook needs none."""

    imports: tuple[str, ...]  # beyond the hooks' modules
    define: str  # a function binding the hook's own arguments (quantization_perchannel_hook's)
    subgroups: str  # post-local SGD's, made once the process group exists
    state: str  # the state's expression; "None" for the process group
    hook: str  # the expression naming the hook (wrapped)
    averager: str  # post-local SGD's averager, built after the hook is registered

    def setup(self) -> str:
        """Every line before ``register_comm_hook``, the state named ``state``."""
        return self.define + self.subgroups + (f"state = {self.state}\n" if self.state != "None" else "")

    def register(self, model: str) -> str:
        state = "None" if self.state == "None" else "state"
        return f"{model}.register_comm_hook({state}, {self.hook})\n"

    def after(self, model: str) -> str:
        """The averager and its step in the training loop, as PyTorch's post-local SGD example."""
        if not self.averager:
            return ""
        return (f"averager = {self.averager}\n"
                + _comment(["In the training loop, right after every optimizer.step() (where PyTorch's "
                            "post-local SGD example steps its averager), step the averager:",
                            f"  averager.average_parameters({model}.parameters())"]))


def hook_code(cfg: RunConfig, chosen: list[Choice], subgroups_here: bool = True) -> HookCode:
    """The state, built with the run's settings as its spec says (``hook_specs.Build``: the
    registry builds the live one from the same row), and the hook.  ``subgroups_here`` False: the
    snippet runs before the process group exists (Lightning), so the state gets none."""
    hook, *wrapper = chosen
    s = spec(cfg.hook)
    expr = f"{wrapper[0].expr}({hook.expr})" if wrapper else hook.expr
    define, subgroups, state, averager, imports = "", "", "None", "", []
    if registry.hook_args(cfg):
        args = ", ".join(f"{k}={v!r}" for k, v in registry.hook_args(cfg).items())
        define = (f"def {hook.piece.attr}(process_group, bucket):  # with the run's {args}\n"
                  f"    return {hook.expr}(process_group, bucket, {args})\n\n\n")
        expr = hook.piece.attr
    if s.state:
        first = ["process_group=None"]
        if s.state.subgroup:
            if subgroups_here:
                subgroups = (_comment([f"Subgroups made here, as the run made them: {LOCALSGD_SUBGROUPS}."])
                             + f"subgroup, _ = dist.new_subgroups(group_size={cfg.localsgd_subgroup_size!r})\n")
                imports.append("import torch.distributed as dist")
            first.append(f"subgroup={'subgroup' if subgroups_here else None}")
        state = _call(f"{hook.alias}.{s.state.attr}", first, s.state.spelled(cfg))
    if s.outer_loop:  # DiLoCo's state steps itself after the optimizer
        averager = "state"
    elif s.averager:
        alias = _module_alias(s.averager)
        if subgroups_here:
            imports.append(f"import {s.averager.module} as {alias}")
        averager = _call(f"{alias}.{s.averager.attr}", [], s.averager.spelled(cfg))
    return HookCode(tuple(imports), define, subgroups, state, expr, averager)


def _module_alias(made: Build) -> str:
    return made.module.rsplit(".", 1)[1]


def _checkpoint(cfg: RunConfig, model: str, load_when: str, lightning: bool = False) -> str:
    """The lines that save and load the hook's state with the model's checkpoint, as its spec says
    the state keeps (``HookSpec.checkpoint``): the state itself where it pickles, the step counts
    where it holds process groups."""
    s = spec(cfg.hook)
    if s.checkpoint == STEP_COUNTS:
        if lightning:
            return _comment([
                f"Checkpoint the step count with the model's: {s.state.attr} holds process "
                "groups, which do not pickle. Lightning's averager is its own and counts again from "
                f"0 on resume (no averaging for {s.starts} steps).",
                '  in your LightningModule: def on_save_checkpoint(self, checkpoint): '
                'checkpoint["localsgd_iter"] = state.iter',
                f'  state.iter = torch.load({CHECKPOINT!r}, weights_only=False)["localsgd_iter"]  '
                "# on resume, before the strategy is built"])
        return _comment([
            f"Checkpoint the step counts with the model's: {s.state.attr} holds process groups, "
            "which do not pickle; the hook and the averager need only their steps back.",
            f'  torch.save({{"model": {model}, "localsgd_steps": (state.iter, averager.step)}}, '
            f"{CHECKPOINT!r})",
            f'  state.iter, averager.step = torch.load({CHECKPOINT!r}, weights_only=False)'
            '["localsgd_steps"]  # on resume, before training'])
    if s.checkpoint != WHOLE_STATE:
        return (_comment([f"Checkpoint: {s.checkpoint_why}"]) if s.checkpoint_why else
                f"# Checkpoint: {registry.hook_name(cfg.hook)} keeps no state; the model's "
                "checkpoint is all there is to save.\n")
    save = ('in your LightningModule: def on_save_checkpoint(self, checkpoint): '
            'checkpoint["comm_hook_state"] = state' if lightning else
            f'torch.save({{"model": {model}, "comm_hook_state": state}}, {CHECKPOINT!r})')
    return _comment([f"Checkpoint the hook's state with the model's: {s.checkpoint_why}"]) + (
        f"#   {save}\n"
        f"#   state = torch.load({CHECKPOINT!r}, weights_only=False)[\"comm_hook_state\"]  "
        f"# {load_when}\n")


def _header(cfg: RunConfig, target: Target, source: str | None) -> list[str]:
    head = [f"commlab export: {cfg.label()}" + (f" (from run {source})" if source else "")]
    return head + notes(cfg, target)


def _bucket_cap(cfg: RunConfig) -> str | None:
    return None if cfg.bucket_cap_mb == DDP_DEFAULT_BUCKET_CAP_MB else f"bucket_cap_mb={cfg.bucket_cap_mb!r}"


# ============================================================================ config files
def config_dict(cfg: RunConfig) -> dict:
    """The settings a config file carries: all but the lab's own (``LAB_ONLY``)."""
    return {k: v for k, v in cfg.to_dict().items() if k not in LAB_ONLY}


def to_json(cfg: RunConfig) -> str:
    return json.dumps(config_dict(cfg), indent=2) + "\n"


def to_toml(cfg: RunConfig) -> str:
    import tomli_w

    return tomli_w.dumps(config_dict(cfg))


# ============================================================================ plain DDP
def ddp_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """Imports, the state, the hook, ``register_comm_hook``: to paste after the model is wrapped;
    for post-local SGD the subgroups first and the averager with its line for the training loop."""
    chosen = choices(cfg, target.backend)
    code = hook_code(cfg, chosen)
    ddp_args = ["model"] + (["device_ids=[local_rank]"] if target.backend == "nccl" else [])
    ddp_args += [a for a in [_bucket_cap(cfg)] if a]
    text = _comment(_header(cfg, target, source) + [
        "Paste after the model is wrapped, with `ddp_model` your DistributedDataParallel:",
        f"  dist.init_process_group({target.backend!r})",
        f"  ddp_model = DistributedDataParallel({', '.join(ddp_args)})"])
    text += _imports(chosen, code.imports) + choice_line(cfg, target.backend)
    if is_plain_allreduce(cfg.to_dict()):
        text += f"# {registry.hook_name(cfg.hook)} is what DDP does with no hook; registering it changes nothing.\n"
    text += code.setup() + code.register("ddp_model") + code.after("ddp_model")
    return text + _checkpoint(cfg, "ddp_model.state_dict()", "on resume, before register_comm_hook")


# ============================================================================ Lightning
# DiLoCo's outer step in Lightning, after every optimizer step as the ddp export's loop line is:
# on_train_batch_end comes after the step, and global_step counts steps, not batches (with
# accumulate_grad_batches a batch that only accumulates takes none).
OUTER_STEP_CALLBACK = '''

class OuterStep(Callback):
    """The state's outer step after every optimizer step."""

    def __init__(self):
        self.steps = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step > self.steps:
            self.steps = trainer.global_step
            state.average_parameters(pl_module.parameters())


'''


def lightning_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """A ``DDPStrategy`` with the hook, its state and the wrapper, and the ``Trainer`` using it.

    On CPU Lightning's own ``DDPStrategy`` would never register the hook (``LIGHTNING_CUDA_ONLY``),
    so CPU exports use commlab's ``AnyDeviceDDPStrategy``, which does; post-local SGD uses it on
    every backend, for its subgroups, with Lightning's own ``model_averaging_period``."""
    chosen = choices(cfg, target.backend)
    outer = spec(cfg.hook).outer_loop  # DiLoCo's state steps after the optimizer, from the module
    localsgd = spec(cfg.hook).averages_parameters and not outer  # Lightning's own model averaging
    if localsgd and cfg.averager_warmup_steps != cfg.start_localSGD_iter:
        raise ExportRefused(
            f"Lightning cannot express averager_warmup_steps={cfg.averager_warmup_steps} with "
            f"start_localSGD_iter={cfg.start_localSGD_iter}: {LIGHTNING_AVERAGER}. Set both to the "
            "same step, as PyTorch advises, or export ddp, which builds the averager itself.")
    code = hook_code(cfg, chosen, subgroups_here=False)
    cpu = target.backend != "nccl"
    why = []
    if cpu or localsgd:
        strategy = "AnyDeviceDDPStrategy"
        if cpu:
            why.append(f"{LIGHTNING_CUDA_ONLY} AnyDeviceDDPStrategy (commlab.hooks.lightning_ddp) is "
                       "DDPStrategy without that check.")
        if localsgd:
            why.append("AnyDeviceDDPStrategy makes the state's subgroups once the process group exists "
                       f"(localsgd_subgroup_size): {LOCALSGD_SUBGROUPS}. {LIGHTNING_AVERAGER}, "
                       "stepped after every optimizer step, from model_averaging_period.")
        extra = (f"from {LIGHTNING_STRATEGY[0]} import {LIGHTNING_STRATEGY[1]}",)
    else:
        strategy = "DDPStrategy"
        why.append(f"On CUDA Lightning's DDPStrategy registers the hook. {LIGHTNING_CUDA_ONLY} "
                   "Export for gloo to get a strategy that registers it on CPU.")
        extra = ("from lightning.pytorch.strategies import DDPStrategy",)
    if outer:
        extra += ("from lightning.pytorch.callbacks import Callback",)
    text = _comment(_header(cfg, target, source) + why)
    text += _imports(chosen, ("from lightning.pytorch import Trainer", *extra))
    text += choice_line(cfg, target.backend)
    text += code.setup()
    args = [] if code.state == "None" else ["    ddp_comm_state=state,"]
    hook, *wrapper = chosen
    args.append(f"    ddp_comm_hook={hook.piece.attr if code.define else hook.expr},")
    if wrapper:
        args.append(f"    ddp_comm_wrapper={wrapper[0].expr},")
    if localsgd:
        args.append(f"    model_averaging_period={cfg.averager_period!r},")
        args.append(f"    localsgd_subgroup_size={cfg.localsgd_subgroup_size!r},")
    if _bucket_cap(cfg):
        args.append(f"    {_bucket_cap(cfg)},  # passed on to DistributedDataParallel")
    text += f"strategy = {strategy}(\n" + "\n".join(args) + "\n)\n"
    accelerator = "cpu" if cpu else "gpu"
    if outer:
        text += OUTER_STEP_CALLBACK
    text += (f"trainer = Trainer(accelerator={accelerator!r}, devices={target.procs(cfg)}, "
             f"num_nodes={target.nnodes}, strategy=strategy"
             f"{', callbacks=[OuterStep()]' if outer else ''})\n")
    return text + _checkpoint(
        cfg, "", "on resume, before the strategy is built; a Lightning checkpoint path works too",
        lightning=True)


# ============================================================================ Accelerate
def accelerate_members(cfg: RunConfig) -> tuple[str, str] | None:
    """(comm_hook, comm_wrapper) members of DDPCommunicationHookType naming ``cfg``'s hook, or
    None where it has none (the snippet then registers the hook on the prepared model)."""
    member = spec(cfg.hook).accelerate
    if member is None:
        return None
    wrapper = WRAPPER_SPECS[cfg.wrapper].accelerate if cfg.wrapper != "none" else "NO"
    if cfg.hook == BASELINE and cfg.wrapper != "none":
        # Accelerate applies a wrapper only to a hook it registers, and NO registers none; PyTorch
        # documents fp16_compress_hook as fp16_compress_wrapper(allreduce_hook) (bf16 alike).
        return wrapper, "NO"
    return member, wrapper


def accelerate_launch(cfg: RunConfig, target: Target) -> list[str]:
    """The launch comment lines.  ``accelerate launch --cpu`` starts one process (its simple
    launcher, without mpirun), so on CPU torchrun starts the processes and ``Accelerator(cpu=True)``
    joins them (MULTI_CPU); on GPUs ``accelerate launch --multi_gpu``, with every argument that
    several machines need."""
    script = [target.script, *target.script_args]
    if target.backend != "nccl":
        lines = ["launch (accelerate launch --cpu would start one process; torchrun starts "
                 f"{target.procs(cfg)} per node):",
                 "  " + _words(torchrun_argv(cfg, target, 1))]
        if target.nnodes > 1:
            lines += [f"  {target.nnodes} nodes, the same line on every node:",
                      "  " + _words(torchrun_argv(cfg, target, target.nnodes, target.rdzv_endpoint),
                                    () if target.rdzv_endpoint else (HEAD_NODE_ENDPOINT,))]
        return lines
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
    return lines + ["  " + _words(argv + script, ours)]


def accelerate_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """``DistributedDataParallelKwargs`` and ``Accelerator``, then ``prepare``; the hook by name in
    the kwargs where Accelerate can register it, else registered on the prepared model (its
    DistributedDataParallel) with ``model.register_comm_hook``.

    Every state is built here and registered on the prepared model: Accelerate would build
    PowerSGD's inside ``prepare`` where no checkpoint can reach it, and ``DDPCommunicationHookType``
    names only PyTorch's default and PowerSGD hooks.  commlab's pieces are always registered on the
    prepared model: Accelerate's names mean PyTorch's hooks."""
    chosen = choices(cfg, target.backend)
    members = accelerate_members(cfg)
    # A state is built here, where a checkpoint reaches it: never by Accelerate, inside prepare.
    by_name = members is not None and spec(cfg.hook).state is None and not any(c.commlab for c in chosen)
    code = hook_code(cfg, chosen)
    extra = []
    if by_name and cfg.hook == BASELINE and cfg.wrapper != "none":
        extra.append(f"{cfg.wrapper}_compress_wrapper(allreduce_hook) is {cfg.wrapper}_compress_hook, "
                     f"so comm_hook={members[0]} says it.")
    if members is None:
        extra.append(f"Accelerate's DDPCommunicationHookType cannot name {registry.hook_name(cfg.hook)} "
                     f"(it has {', '.join(ACCELERATE_MEMBERS)}, and NO means "
                     "DDP's own allreduce): the snippet registers it on the prepared model.")
    text = _comment(_header(cfg, target, source) + extra)
    names = "DDPCommunicationHookType, DistributedDataParallelKwargs" if by_name else "DistributedDataParallelKwargs"
    imports = ("from accelerate import Accelerator", f"from accelerate.utils import {names}")
    text += _imports([] if by_name else chosen, imports + (() if by_name else code.imports))
    text += choice_line(cfg, target.backend)
    args = []
    if by_name:
        hook_member, wrapper_member = members
        args.append(f"    comm_hook=DDPCommunicationHookType.{hook_member},")
        if wrapper_member != "NO":
            args.append(f"    comm_wrapper=DDPCommunicationHookType.{wrapper_member},")
    if _bucket_cap(cfg):
        args.append(f"    {_bucket_cap(cfg)},")
    text += "ddp_kwargs = DistributedDataParallelKwargs(" + "".join(f"\n{a}" for a in args) + ("\n" if args else "") + ")\n"
    cpu = "cpu=True, " if target.backend != "nccl" else ""
    text += f"accelerator = Accelerator({cpu}kwargs_handlers=[ddp_kwargs])\n"
    text += "model, optimizer = accelerator.prepare(model, optimizer)  # your model and optimizer\n"
    if not by_name:
        text += code.setup() + code.register("model") + code.after("model")
    text += _comment(accelerate_launch(cfg, target))
    return text + _checkpoint(cfg, "accelerator.get_state_dict(model)",
                              "on resume, before register_comm_hook")


# ============================================================================ Hugging Face Trainer
TRAINER_WHY = ("Hugging Face's Trainer builds DDP through Accelerate with a "
               "DistributedDataParallelKwargs of its own (Trainer._build_accelerator_args, from "
               "TrainingArguments' ddp_* fields): TrainingArguments has no comm hook and Trainer "
               "takes no kwargs handler of yours, so the callback below registers the hook on the "
               "DDP model Accelerate prepared, when training begins (before the first backward).")


def trainer_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """``TrainingArguments`` (its ddp_* fields), the hook's state, and a ``TrainerCallback`` that
    registers the hook on ``trainer.model_wrapped`` (the prepared DistributedDataParallel) at
    ``on_train_begin``; post-local SGD's averager steps at ``on_optimizer_step``.  The state is
    built beside the Trainer, where a checkpoint reaches it: ``TrainingArguments`` has started the
    process group by then (Accelerate's PartialState), so subgroups can be made."""
    chosen = choices(cfg, target.backend)
    code = hook_code(cfg, chosen)
    text = _comment(_header(cfg, target, source) + [TRAINER_WHY])
    imports = ("from torch.nn.parallel import DistributedDataParallel",
               "from transformers import Trainer, TrainerCallback, TrainingArguments")
    text += _imports(chosen, imports + code.imports) + choice_line(cfg, target.backend)
    ddp_args = ['output_dir="out"'] + (["use_cpu=True"] if target.backend != "nccl" else [])
    if _bucket_cap(cfg):
        ddp_args.append(f"ddp_bucket_cap_mb={cfg.bucket_cap_mb!r}")
    text += (f"training_args = TrainingArguments({', '.join(ddp_args)})  # and your other arguments\n"
             + code.setup() + "\n\n"
             "class RegisterCommHook(TrainerCallback):\n"
             "    def __init__(self, trainer):\n"
             "        self.trainer = trainer\n\n"
             "    def on_train_begin(self, args, trainer_state, control, **kwargs):\n"
             "        model = self.trainer.model_wrapped  # DistributedDataParallel once Accelerate prepared it\n"
             "        if isinstance(model, DistributedDataParallel):\n"
             + textwrap.indent(code.register("model"), " " * 12)
             + "        elif args.world_size > 1:  # FSDP or DeepSpeed: DDP's comm hooks do not apply there\n"
             "            raise RuntimeError(f\"the comm hook needs DistributedDataParallel, and this run \"\n"
             "                               f\"wrapped the model in {type(model).__name__}\")\n")
    if code.averager:
        text += ("\n    def on_optimizer_step(self, args, trainer_state, control, **kwargs):\n"
                 "        averager.average_parameters(self.trainer.model_wrapped.parameters())\n")
    text += "\n\n"
    text += "trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset)  # your model and data\n"
    text += "trainer.add_callback(RegisterCommHook(trainer))\n"
    if code.averager:
        text += f"averager = {code.averager}\n"
    text += "trainer.train()\n"
    text += _comment(accelerate_launch(cfg, target))
    return text + _checkpoint(cfg, "trainer.model.state_dict()", "on resume, before trainer.train()")


# ============================================================================ launch lines
# With no endpoint given, the several-nodes line reads the first node's address from the shell.
HEAD_NODE_ENDPOINT = f'"$HEAD_NODE:{RDZV_PORT}"'
HEAD_NODE_CHECK = ': "${HEAD_NODE:?set HEAD_NODE to the address of the first node}"\n'
PORT_NOTE = (f"Port {RDZV_PORT} is torchrun's default: any TCP port free on the first node that every "
             "node reaches.")


def quote(word: str) -> str:
    """``word`` for bash on one line: ``shlex.quote``, or ``$'...'`` with escapes when it holds a
    character that is not printable (a newline would end a comment or split a command)."""
    if all(ch.isprintable() for ch in word):
        return shlex.quote(word)
    body = "".join(ch if ch.isprintable() and ch not in "\\'" else
                   ("\\" + ch if ch in "\\'" else _escape(ch)) for ch in word)
    return f"$'{body}'"


def _escape(ch: str) -> str:
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x80 else f"\\U{ord(ch):08x}"


def _words(argv: list[str], ours: tuple[str, ...] = ()) -> str:
    return " ".join(a if a in ours else quote(a) for a in argv)


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
    words = [a if a in ours else quote(a) for a in argv]
    groups: list[list[str]] = []
    for word in words[:len(words) - script_len]:
        if word.startswith("--") or not groups:
            groups.append([word])
        else:
            groups[-1].append(word)
    groups.append(words[len(words) - script_len:])
    return " \\\n    ".join(" ".join(g) for g in groups)


def _threads(target: Target) -> str:
    return (_comment(["Compute threads per process (torchrun sets 1 when OMP_NUM_THREADS is unset); "
                      "processes × threads should not exceed a node's cores."])
            + f"export OMP_NUM_THREADS={target.threads_per_process}\n")


def torchrun_lines(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """The one-node line and the several-nodes line (run on every node) for the same job."""
    nodes, procs = max(target.nnodes, 2), target.procs(cfg)
    text = "#!/usr/bin/env bash\n" + _comment(_header(cfg, target, source)) + _threads(target)
    script_len = 1 + len(target.script_args)
    text += (f"\n# One node, {procs} process(es):\n"
             + _shell(torchrun_argv(cfg, target, 1), script_len) + "\n")
    text += "\n" + _comment([f"{nodes} nodes, {procs} process(es) each: run this same line on "
                             "every node; the endpoint is a host:port of the first node that every "
                             "node reaches."] + ([] if target.rdzv_endpoint else [PORT_NOTE]))
    if not target.rdzv_endpoint:
        text += HEAD_NODE_CHECK
    argv = torchrun_argv(cfg, target, nodes, target.rdzv_endpoint)
    ours = () if target.rdzv_endpoint else (HEAD_NODE_ENDPOINT,)
    return text + _shell(argv, script_len, ours) + "\n"


def slurm_script(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """An sbatch script: one task per node, each starting torchrun, rendezvous on the first node."""
    procs = target.procs(cfg)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={target.job_name}",
             f"#SBATCH --nodes={target.nnodes}", "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --cpus-per-task={procs * target.threads_per_process}"]
    if target.backend == "nccl":
        lines.append(f"#SBATCH --gpus-per-node={procs}")
    lines.append(f"#SBATCH --time={target.time_limit}")
    if target.partition:
        lines.append(f"#SBATCH --partition={target.partition}")
    text = "\n".join(lines) + "\n" + _comment(_header(cfg, target, source)
                                              + [f"One task per node runs torchrun, which starts "
                                                 f"{procs} process(es) there. {PORT_NOTE}"])
    text += "set -euo pipefail\n" + _threads(target)
    text += 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
    ours = ('"$SLURM_NNODES"', '"$SLURM_JOB_ID"', f'"$head_node:{RDZV_PORT}"')
    argv = ["srun", "torchrun", "--nnodes", ours[0], "--nproc-per-node", str(procs),
            "--rdzv-id", ours[1], "--rdzv-backend", "c10d", "--rdzv-endpoint", ours[2],
            target.script, *target.script_args]
    return text + _shell(argv, 1 + len(target.script_args), ours) + "\n"


# ============================================================================ DiLoCo without DDP
DILOCO_WHAT = ("DiLoCo (Douillard et al., 2023): no DDP and no comm hook. Each replica steps with "
               "its own gradients and `optimizer` (the inner one); every {h} steps the "
               "pseudo-gradients (the parameters at the last sync minus the replica's) are averaged "
               "over the ranks in {precision} and an outer SGD (lr {lr!r}, momentum {momentum!r}, "
               "Nesterov {nesterov}) steps the last sync's parameters, which every replica then "
               "copies.")
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


def _outer_loop(cfg: RunConfig, fmt: str) -> None:
    if not spec(cfg.hook).outer_loop:
        raise ExportRefused(f"the {fmt} export is DiLoCo's (an outer optimizer over local steps, no "
                            f"comm hook); {cfg.hook} is a comm hook: export ddp, lightning, "
                            "accelerate or trainer")


def _diloco_what(cfg: RunConfig) -> str:
    return DILOCO_WHAT.format(h=cfg.sync_every, precision=cfg.outer_precision, lr=cfg.outer_lr,
                              momentum=cfg.outer_momentum, nesterov="on" if cfg.outer_nesterov else "off")


def loop_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """DiLoCo in plain PyTorch: the outer optimizer over the parameters at the last sync, the
    pseudo-gradient averaged as commlab's ``DiLoCoState`` averages it (the same operations: a run
    of both gives the same parameters), and the one line for the training loop."""
    _outer_loop(cfg, "loop")
    text = _comment(_header(cfg, target, source)[:1] + [
        _diloco_what(cfg) + " commlab.hooks.DiLoCoState runs the same steps in the lab.",
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
    text += _comment(["In the training loop, right after optimizer.step(), with `step` counting the "
                      "steps from 0:", "  diloco_step(step)",
                      "Checkpoint at a sync step (the model is then the last sync's parameters) with "
                      "outer_optimizer.state_dict() beside the model's."])
    return text


TORCHFT_WHY = ("torchft (pip install torchft; 0.2.0 has this API) runs each replica group as a job of "
               "its own (its own torchrun line, ranks within it sharded or replicated as you like) "
               "and joins the groups through a lighthouse: start `torchft_lighthouse --min_replicas "
               "1 --quorum_tick_ms 100 --join_timeout_ms 10000` on one machine and set "
               "TORCHFT_LIGHTHOUSE=http://<that machine>:29510, and REPLICA_GROUP_ID to each group's "
               "index, in every job's environment.")
# init_sync=False: torchft's default heals every group but replica 0 at its first quorum, which
# DiLoCo holds at the first sync, after H local steps; the lab's DiLoCo has no such step, and
# with it off torchft's DiLoCo is the lab's bit for bit on 2 groups (docs/hooks.md, "DiLoCo's
# torchft export"; tests/test_diloco.py).
TORCHFT_SAME_START = ("init_sync=False: every group must build `model` with the same parameters "
                      "(torch.manual_seed(...) before it, or the same checkpoint loaded), as the "
                      "loop export's broadcast from rank 0 does; torchft's init_sync=True would "
                      "instead heal every group but replica 0 at the first sync, after its first "
                      "{h} steps: they would take replica 0's parameters and inner optimizer state, "
                      "and the first outer step would be replica 0's pseudo-gradient alone. A "
                      "group that joins later (a restart) still heals from the others.")


def torchft_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """torchft's ``DiLoCo(manager, model_fragments, inner_optimizer, outer_optimizer, sync_every)``
    with the run's outer SGD: the outer step runs from the inner optimizer's step hook."""
    _outer_loop(cfg, "torchft")
    notes_ = [_diloco_what(cfg), TORCHFT_WHY, TORCHFT_SAME_START.format(h=cfg.sync_every)]
    if cfg.outer_precision != "fp32":
        notes_.append(f"torchft cannot send the pseudo-gradient in {cfg.outer_precision}: its "
                      "allreduce sends float32, or with should_quantize=True fp8 through Triton "
                      "kernels on CUDA; this snippet sends float32 (the loop export sends "
                      f"{cfg.outer_precision}).")
    pg = "ProcessGroupBabyNCCL" if target.backend == "nccl" else "ProcessGroupGloo"
    text = _comment(_header(cfg, target, source)[:1] + notes_ + [
        "Paste after `model` (not wrapped in DistributedDataParallel) and its `optimizer` are made."])
    text += ("import os\nfrom datetime import timedelta\n\nimport torch\n"
             f"from torchft import Manager, {pg}\nfrom torchft.local_sgd import DiLoCo\n\n")
    text += (f"outer_optimizer = torch.optim.SGD(model.parameters(), lr={cfg.outer_lr!r}, "
             f"momentum={cfg.outer_momentum!r}, nesterov={cfg.outer_nesterov!r})\n")
    text += ("manager = Manager(\n"
             f"    pg={pg}(timeout=timedelta(seconds=60)),\n"
             "    min_replica_size=1,\n"
             "    load_state_dict=lambda sd: (model.load_state_dict(sd[\"model\"]), "
             "optimizer.load_state_dict(sd[\"optimizer\"])),\n"
             "    state_dict=lambda: {\"model\": model.state_dict(), \"optimizer\": optimizer.state_dict()},\n"
             "    replica_id=f\"replica_{os.environ['REPLICA_GROUP_ID']}\",\n"
             "    use_async_quorum=False,  # DiLoCo needs a synchronous quorum\n"
             "    init_sync=False,  # every group starts from the same parameters: see above\n"
             ")\n")
    text += (f"diloco = DiLoCo(manager, [model], optimizer, outer_optimizer, sync_every={cfg.sync_every!r}, "
             "should_quantize=False)\n")
    text += _comment(["Train inside it: the outer step runs after every sync_every-th optimizer.step().",
                      "  with diloco:",
                      "      for x, y in batches:",
                      "          optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()"])
    return text


# ============================================================================ dispatch
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
ALL_FORMATS = {**FORMATS, **OUTER_LOOP_FORMATS}


def formats_for(cfg: RunConfig) -> tuple[str, ...]:
    """The formats that can express ``cfg``'s hook: every one, and DiLoCo's own for DiLoCo."""
    return tuple(FORMATS) + (tuple(OUTER_LOOP_FORMATS) if spec(cfg.hook).outer_loop else ())


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
    if fmt not in ("json", "toml") and (why := world_refusal(cfg, target)):
        raise ExportRefused(why)
    text = build(cfg, target, source)
    extra = [f"Warning: {LIGHTNING_CUDA_ONLY}"] if fmt == "lightning" and target.backend == "nccl" else []
    return Export(fmt, text, filename, language, mime, notes(cfg, target) + extra)
