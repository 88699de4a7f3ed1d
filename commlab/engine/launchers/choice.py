"""The way the API's and the CLI's arguments name (``resume``, ``node``, ``slurm``, ``owner``)."""
from __future__ import annotations

import os

from commlab.config import ConfigError
from commlab.engine.launchers.base import Launcher
from commlab.engine.launchers.local import Local
from commlab.engine.launchers.nodes import OnNodes
from commlab.engine.launchers.reallink import RealLink
from commlab.engine.launchers.slurm import OnSlurm


def chosen(resume: str | os.PathLike | None = None, node=None, slurm=None, owner: str | None = None,
           cfg=None) -> Launcher:
    """The way the API's and the CLI's arguments name: Slurm's job (``slurm``), this node of a run
    on several (``node``), a real link on this machine (``cfg.real_link_mbps``), else this machine."""
    if cfg is not None and cfg.real_link_mbps:
        if slurm is not None or node is not None:
            raise ConfigError({"real_link_mbps": "a real link puts every rank in a network namespace on "
                                                 "this machine: not with several nodes or Slurm"})
        return RealLink(owner, resume)
    if slurm is not None:
        return OnSlurm(slurm, owner, resume)
    if node is not None:
        return OnNodes(node, owner, resume)
    return Local(owner, resume)
