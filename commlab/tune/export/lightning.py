"""The lightning export: a ``DDPStrategy`` with the hook, its state and the wrapper, and the
``Trainer`` using it."""
from __future__ import annotations

from commlab.config import RunConfig
from commlab.tune.export.checkpoint import checkpoint_lines
from commlab.tune.export.hook_code import LOCALSGD_SUBGROUPS, bucket_cap, describe
from commlab.tune.export.preamble import header
from commlab.tune.export.target import ExportRefused, Target
from commlab.tune.export.text import comment

LIGHTNING_AVERAGER = ("Lightning's DDPStrategy builds the PeriodicModelAverager itself, with "
                      "warmup_steps=start_localSGD_iter (DDPStrategy._enable_model_averaging)")
LIGHTNING_CUDA_ONLY = ("Lightning registers DDP communication hooks only when the strategy's root "
                       "device is CUDA (DDPStrategy._register_ddp_hooks): on CPU it silently trains "
                       "with DDP's plain allreduce.")
LIGHTNING_STRATEGY = ("commlab.hooks.lightning_ddp", "AnyDeviceDDPStrategy")
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
    code = describe(cfg, target.backend, subgroups_here=False)
    outer = code.facts.outer_loop  # DiLoCo's state steps after the optimizer, from the module
    localsgd = code.facts.averages_parameters and not outer  # Lightning's own model averaging
    if localsgd and cfg.averager_warmup_steps != cfg.start_localSGD_iter:
        raise ExportRefused(
            f"Lightning cannot express averager_warmup_steps={cfg.averager_warmup_steps} with "
            f"start_localSGD_iter={cfg.start_localSGD_iter}: {LIGHTNING_AVERAGER}. Set both to the "
            "same step, as PyTorch advises, or export ddp, which builds the averager itself.")
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
    text = comment(header(cfg, target, source) + why)
    text += code.imports(("from lightning.pytorch import Trainer", *extra))
    text += code.choice_line()
    text += code.setup()
    args = [] if code.state == "None" else ["    ddp_comm_state=state,"]
    args.append(f"    ddp_comm_hook={code.hook},")
    if code.wrapper:
        args.append(f"    ddp_comm_wrapper={code.wrapper},")
    if localsgd:
        args.append(f"    model_averaging_period={cfg.averager_period!r},")
        args.append(f"    localsgd_subgroup_size={cfg.localsgd_subgroup_size!r},")
    if bucket_cap(cfg):
        args.append(f"    {bucket_cap(cfg)},  # passed on to DistributedDataParallel")
    text += f"strategy = {strategy}(\n" + "\n".join(args) + "\n)\n"
    accelerator = "cpu" if cpu else "gpu"
    if outer:
        text += OUTER_STEP_CALLBACK
    text += (f"trainer = Trainer(accelerator={accelerator!r}, devices={target.procs(cfg)}, "
             f"num_nodes={target.nnodes}, strategy=strategy"
             f"{', callbacks=[OuterStep()]' if outer else ''})\n")
    return text + checkpoint_lines(
        code.facts, "", "on resume, before the strategy is built; a Lightning checkpoint path works too",
        lightning=True)
