"""The trainer export: Hugging Face's ``Trainer``, with a callback that registers the hook on the
DDP model Accelerate prepared."""
from __future__ import annotations

import textwrap

from commlab.config import RunConfig
from commlab.tune.export.accelerate import accelerate_launch
from commlab.tune.export.checkpoint import checkpoint_lines
from commlab.tune.export.hook_code import bucket_cap, describe
from commlab.tune.export.preamble import header
from commlab.tune.export.target import Target
from commlab.tune.export.text import comment

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
    code = describe(cfg, target.backend)
    text = comment(header(cfg, target, source) + [TRAINER_WHY])
    imports = ("from torch.nn.parallel import DistributedDataParallel",
               "from transformers import Trainer, TrainerCallback, TrainingArguments")
    text += code.imports(imports) + code.choice_line()
    ddp_args = ['output_dir="out"'] + (["use_cpu=True"] if target.backend != "nccl" else [])
    if bucket_cap(cfg):
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
    text += comment(accelerate_launch(cfg, target))
    return text + checkpoint_lines(code.facts, "trainer.model.state_dict()", "on resume, before trainer.train()")
