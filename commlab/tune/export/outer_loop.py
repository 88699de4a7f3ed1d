"""What DiLoCo's own exports (loop, torchft: no DDP and no comm hook) share: the refusal of a comm
hook, and what DiLoCo is in the run's settings."""
from __future__ import annotations

from commlab.config import RunConfig
from commlab.tune.export.hook_code import facts
from commlab.tune.export.target import ExportRefused

DILOCO_WHAT = ("DiLoCo (Douillard et al., 2023): no DDP and no comm hook. Each replica steps with "
               "its own gradients and `optimizer` (the inner one); every {h} steps the "
               "pseudo-gradients (the parameters at the last sync minus the replica's) are averaged "
               "over the ranks in {precision} and an outer SGD (lr {lr!r}, momentum {momentum!r}, "
               "Nesterov {nesterov}) steps the last sync's parameters, which every replica then "
               "copies.")

def require_outer_loop(cfg: RunConfig, fmt: str) -> None:
    """Refuse a comm hook: ``fmt`` is an export of DiLoCo's outer loop."""
    if not facts(cfg).outer_loop:
        raise ExportRefused(f"the {fmt} export is DiLoCo's (an outer optimizer over local steps, no "
                            f"comm hook); {cfg.hook} is a comm hook: export ddp, lightning, "
                            "accelerate or trainer")


def diloco_what(cfg: RunConfig) -> str:
    return DILOCO_WHAT.format(h=cfg.sync_every, precision=cfg.outer_precision, lr=cfg.outer_lr,
                              momentum=cfg.outer_momentum, nesterov="on" if cfg.outer_nesterov else "off")
