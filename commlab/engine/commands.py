"""The engine's command lines, pure (as Accelerate builds its launch command): what a run's
supervisor runs, recorded in launch.json, what starts a pool of warm ranks, and the supervisors."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from commlab.engine.nodes import Nodes


def torchrun_argv(nproc: int, program: list[str], python: str = sys.executable,
                  node: Nodes | None = None, fork: bool = False) -> list[str]:
    """torchrun (its stores kept on loopback, see ``commlab.engine.torchrun``) running
    ``program`` on ``nproc`` ranks: one node, rendezvous at 127.0.0.1 on a free port, no restarts.
    ``node``: this node's agent in a run on several nodes (``commlab.engine.nodes``): the c10d
    rendezvous at node 0's endpoint, which node 0 serves, waiting ``join_timeout_s`` for the rest.
    ``fork``: the ranks forked from torchrun with the program's imports done
    (``commlab.devices.ranks_forkable`` says when they may be)."""
    nnodes, endpoint, addr, joined = "1", "127.0.0.1:0", "127.0.0.1", []
    if node is not None:
        wait = f"{node.join_timeout_s:g}"
        nnodes, endpoint, addr = str(node.nnodes), node.rdzv_endpoint, str(node.local_addr)
        joined = ["--rdzv-id", node.run_id, "--rdzv-conf",
                  f"is_host={int(node.node_rank == 0)},join_timeout={wait},read_timeout={wait}"]
    return [python, "-m", "commlab.engine.torchrun", "--nnodes", nnodes, "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--local-addr", addr, *joined,
            "--max-restarts", "0", "--monitor-interval", "0.2", *(["--start-method", "fork"] if fork else []),
            *program]


def run_argv(world_size: int, run_dir: str | os.PathLike, python: str = sys.executable,
             node: Nodes | None = None, fork: bool = False) -> list[str]:
    """A cold run: torchrun starting ``world_size`` ranks of ``commlab.engine.worker`` (on this
    node, of a run on several: ``node``)."""
    return torchrun_argv(world_size, ["-m", "commlab.engine.worker", str(run_dir)], python, node, fork)


def pool_argv(world_size: int, pool_dir: str | os.PathLike, fork: bool = False) -> list[str]:
    """A pool of warm ranks serving ``pool_dir`` (``commlab.engine.pool``)."""
    return torchrun_argv(world_size, ["-m", "commlab.engine.pool", "serve", str(Path(pool_dir).resolve())],
                         fork=fork)


def supervisor_argv(folder: str | os.PathLike, pool: bool = False) -> list[str]:
    """A run's supervisor (``commlab.engine.supervisor``); with ``pool``, the supervisor of a pool
    of warm ranks, which supervises each run the pool serves."""
    return [sys.executable, "-m", "commlab.engine.supervisor", *(["--pool"] if pool else []),
            str(Path(folder).resolve())]
