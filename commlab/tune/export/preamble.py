"""What a person must read before using any export: the notes, and the header every file opens with."""
from __future__ import annotations

from commlab.config import RunConfig, link_of
from commlab.tune.export.hook_code import choices, facts
from commlab.tune.export.target import Target


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
    f = facts(cfg)
    if f.sends_nothing:
        out.append(f"{f.attr} sends nothing: gradients are never averaged and the "
                   "replicas drift apart. It is for headroom analysis, never for training.")
    link = link_of(cfg.to_dict())
    if link:
        out.append(f"The run used an {link} link, a lab setting: production uses its real network, "
                   "and the snippets leave it out.")
    return out


def header(cfg: RunConfig, target: Target, source: str | None) -> list[str]:
    """The first comment lines of every export: the run's label and source, then the notes."""
    head = [f"commlab export: {cfg.label()}" + (f" (from run {source})" if source else "")]
    return head + notes(cfg, target)
