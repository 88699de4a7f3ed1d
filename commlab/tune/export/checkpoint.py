"""The lines that save and load the hook's state with the model's checkpoint."""
from __future__ import annotations

from commlab.hook_specs import STEP_COUNTS, WHOLE_STATE
from commlab.tune.export.hook_code import HookFacts
from commlab.tune.export.text import comment

CHECKPOINT = "checkpoint.pt"


def checkpoint_lines(f: HookFacts, model: str, load_when: str, lightning: bool = False) -> str:
    """As the hook's row says the state keeps: the state itself where it pickles, the step counts
    where it holds process groups."""
    if f.checkpoint == STEP_COUNTS:
        if lightning:
            return comment([
                f"Checkpoint the step count with the model's: {f.state.attr} holds process "
                "groups, which do not pickle. Lightning's averager is its own and counts again from "
                f"0 on resume (no averaging for {f.starts} steps).",
                '  in your LightningModule: def on_save_checkpoint(self, checkpoint): '
                'checkpoint["localsgd_iter"] = state.iter',
                f'  state.iter = torch.load({CHECKPOINT!r}, weights_only=False)["localsgd_iter"]  '
                "# on resume, before the strategy is built"])
        return comment([
            f"Checkpoint the step counts with the model's: {f.state.attr} holds process groups, "
            "which do not pickle; the hook and the averager need only their steps back.",
            f'  torch.save({{"model": {model}, "localsgd_steps": (state.iter, averager.step)}}, '
            f"{CHECKPOINT!r})",
            f'  state.iter, averager.step = torch.load({CHECKPOINT!r}, weights_only=False)'
            '["localsgd_steps"]  # on resume, before training'])
    if f.checkpoint != WHOLE_STATE:
        return (comment([f"Checkpoint: {f.checkpoint_why}"]) if f.checkpoint_why else
                f"# Checkpoint: {f.name} keeps no state; the model's "
                "checkpoint is all there is to save.\n")
    save = ('in your LightningModule: def on_save_checkpoint(self, checkpoint): '
            'checkpoint["comm_hook_state"] = state' if lightning else
            f'torch.save({{"model": {model}, "comm_hook_state": state}}, {CHECKPOINT!r})')
    return comment([f"Checkpoint the hook's state with the model's: {f.checkpoint_why}"]) + (
        f"#   {save}\n"
        f"#   state = torch.load({CHECKPOINT!r}, weights_only=False)[\"comm_hook_state\"]  "
        f"# {load_when}\n")
