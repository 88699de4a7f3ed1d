"""The way the API's and the CLI's arguments name (``resume``, ``node``, ``slurm``, ``owner``)."""
from __future__ import annotations

import os

from commlab.engine.launchers.base import Launcher
from commlab.engine.launchers.local import Local
from commlab.engine.launchers.nodes import OnNodes
from commlab.engine.launchers.slurm import OnSlurm


def chosen(resume: str | os.PathLike | None = None, node=None, slurm=None, owner: str | None = None) -> Launcher:
    """The way the API's and the CLI's arguments name: Slurm's job (``slurm``), this node of a run
    on several (``node``), else this machine."""
    if slurm is not None:
        return OnSlurm(slurm, owner, resume)
    if node is not None:
        return OnNodes(node, owner, resume)
    return Local(owner, resume)
