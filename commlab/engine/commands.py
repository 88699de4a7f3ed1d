"""The engine's command lines, pure (as Accelerate builds its launch command): what a run's
supervisor runs, recorded in launch.json, and what starts a pool of warm ranks."""
from __future__ import annotations

import os
import sys
from pathlib import Path


def torchrun_argv(nproc: int, program: list[str], python: str = sys.executable) -> list[str]:
    """torchrun (its stores kept on loopback, see ``commlab.engine.torchrun``) running
    ``program`` on ``nproc`` ranks: one node, rendezvous at 127.0.0.1 on a free port, no restarts."""
    return [python, "-m", "commlab.engine.torchrun",
            "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1",
            "--max-restarts", "0", "--monitor-interval", "0.2", *program]


def run_argv(world_size: int, run_dir: str | os.PathLike, python: str = sys.executable) -> list[str]:
    """A cold run: torchrun starting ``world_size`` ranks of ``commlab.engine.worker``."""
    return torchrun_argv(world_size, ["-m", "commlab.engine.worker", str(run_dir)], python)


def pool_argv(world_size: int, pool_dir: str | os.PathLike) -> list[str]:
    """A pool of warm ranks serving ``pool_dir`` (``commlab.engine.pool``)."""
    return torchrun_argv(world_size, ["-m", "commlab.engine.pool", "serve", str(Path(pool_dir).resolve())])


def submit_argv(pool_dir: str | os.PathLike, run_dir: str | os.PathLike) -> list[str]:
    """A run on warm ranks: what its supervisor runs in place of torchrun."""
    return [sys.executable, "-m", "commlab.engine.pool", "submit", str(Path(pool_dir).resolve()), str(run_dir)]
