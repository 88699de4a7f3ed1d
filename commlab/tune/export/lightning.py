"""The lightning export: a training script that runs as pasted, for the backend it is exported for
(a ``DDPStrategy`` with the hook, its state and the wrapper, the ``Trainer`` on the matching
accelerator for the run's steps, a stand-in model and data, ``trainer.fit``, and its launch line)."""
from __future__ import annotations

from commlab.config import RunConfig
from commlab.devices import pick_backend
from commlab.tune.export.checkpoint import checkpoint_lines
from commlab.tune.export.hook_code import LOCALSGD_SUBGROUPS, HookCode, bucket_cap, describe
from commlab.tune.export.preamble import header
from commlab.tune.export.target import ExportRefused, Target
from commlab.tune.export.text import comment, words
from commlab.tune.export.torchrun import torchrun_comment_lines

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


# A stand-in for the person's LightningModule and data, so that the snippet runs as pasted: a
# small MLP learning which of its first 8 inputs is largest (every rank the same start: DDP
# broadcasts rank 0's parameters; Lightning gives each rank its own shard of the data).
STAND_IN = '''

class Model(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                       torch.nn.ReLU(), torch.nn.Linear(64, 8))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return torch.nn.functional.cross_entropy(self.net(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.{optimizer}(self.parameters(), lr={lr!r})


def stand_in_data():
    inputs = torch.randn(4096, 32, generator=torch.Generator().manual_seed({seed!r}))
    return DataLoader(TensorDataset(inputs, inputs[:, :8].argmax(1)), batch_size={batch_size!r})


if __name__ == "__main__":
    trainer.fit(Model(), stand_in_data())
'''
# config.OPTIMIZERS as torch.optim names them (engine.worker.make_optimizer builds the same)
OPTIMIZER_CLASSES = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}


def default_backend(cfg: RunConfig) -> str:
    """The backend a Lightning export is for unless one is named: the one the run's settings
    resolve to on this machine (``devices.pick_backend``: the run's own, or for "auto" Gloo
    without a GPU for every rank), so that the export runs where it was made."""
    return pick_backend(cfg.backend, cfg.world_size)[0]


def _accelerator_note(cpu: bool) -> str:
    if cpu:
        return ("accelerator='cpu': exported for gloo, the default on a machine without a GPU for "
                "every rank or for a run on gloo; --target-backend nccl (the Export page's "
                "production backend) exports for GPUs: accelerator='gpu' and Lightning's own "
                "DDPStrategy.")
    return ("accelerator='gpu': exported for nccl; --target-backend gloo (the Export page's "
            "production backend) exports for CPU: accelerator='cpu' and a strategy that registers "
            "the hook there.")


def _strategy(cfg: RunConfig, code: HookCode, cpu: bool, localsgd: bool) -> tuple[list[str], str, str]:
    """Why the strategy is the one it is, its import, and the lines that build it."""
    if cpu or localsgd:
        why = []
        if cpu:
            why.append(f"{LIGHTNING_CUDA_ONLY} AnyDeviceDDPStrategy (commlab.hooks.lightning_ddp) is "
                       "DDPStrategy without that check.")
        if localsgd:
            why.append("AnyDeviceDDPStrategy makes the state's subgroups once the process group exists "
                       f"(localsgd_subgroup_size): {LOCALSGD_SUBGROUPS}. {LIGHTNING_AVERAGER}, "
                       "stepped after every optimizer step, from model_averaging_period.")
        strategy, imported = LIGHTNING_STRATEGY[1], f"from {LIGHTNING_STRATEGY[0]} import {LIGHTNING_STRATEGY[1]}"
    else:
        why = [f"On CUDA Lightning's DDPStrategy registers the hook. {LIGHTNING_CUDA_ONLY}"]
        strategy, imported = "DDPStrategy", "from lightning.pytorch.strategies import DDPStrategy"
    args = [] if code.state == "None" else ["    ddp_comm_state=state,"]
    args.append(f"    ddp_comm_hook={code.hook},")
    if code.wrapper:
        args.append(f"    ddp_comm_wrapper={code.wrapper},")
    if localsgd:
        args.append(f"    model_averaging_period={cfg.averager_period!r},")
        args.append(f"    localsgd_subgroup_size={cfg.localsgd_subgroup_size!r},")
    if bucket_cap(cfg):
        args.append(f"    {bucket_cap(cfg)},  # passed on to DistributedDataParallel")
    return why, imported, f"strategy = {strategy}(\n" + "\n".join(args) + "\n)\n"


def _stand_in_and_run(cfg: RunConfig, target: Target) -> str:
    """The stand-in model and data with ``trainer.fit``, and the lines that launch the script."""
    text = "\n" + comment([
        f"Model and stand_in_data stand in for your LightningModule and data (the run trained the "
        f"workload {cfg.workload}, with {cfg.optimizer} at lr {cfg.lr!r}, {cfg.batch_size!r} examples "
        "a rank a step): replace them, and keep trainer.fit under __main__."])
    text += STAND_IN.format(optimizer=OPTIMIZER_CLASSES[cfg.optimizer], lr=cfg.lr, seed=cfg.seed,
                            batch_size=cfg.batch_size)
    python = [] if target.nnodes > 1 else [
        "On one node python starts it too, and Lightning the other processes:",
        "  " + words(["python", target.script, *target.script_args])]
    return text + "\n" + comment([
        f"Run it, saved as {target.script}: torchrun starts {target.procs(cfg)} process(es) a node, "
        "as devices says, and Lightning joins them:", *torchrun_comment_lines(cfg, target), *python])


def lightning_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """A training script: a ``DDPStrategy`` with the hook, its state and the wrapper, the
    ``Trainer`` using it for the run's steps, a stand-in model and data, ``trainer.fit`` and the
    torchrun line that runs it.

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
    why, imported, strategy = _strategy(cfg, code, cpu, localsgd)
    callback = ("from lightning.pytorch.callbacks import Callback",) if outer else ()
    text = comment(header(cfg, target, source) + why + [_accelerator_note(cpu)])
    text += code.imports(("import torch", "from lightning.pytorch import LightningModule, Trainer", imported,
                          *callback, "from torch.utils.data import DataLoader, TensorDataset"))
    text += code.choice_line() + code.setup() + strategy
    if outer:
        text += OUTER_STEP_CALLBACK
    text += (f"trainer = Trainer(accelerator={'cpu' if cpu else 'gpu'!r}, devices={target.procs(cfg)}, "
             f"num_nodes={target.nnodes}, strategy=strategy, max_steps={cfg.steps!r}"
             f"{', callbacks=[OuterStep()]' if outer else ''})  # the run's steps\n")
    text += checkpoint_lines(
        code.facts, "", "on resume, before the strategy is built; a Lightning checkpoint path works too",
        lightning=True)
    return text + _stand_in_and_run(cfg, target)
