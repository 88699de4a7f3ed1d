"""The engine's command lines and their environment, pure (as Accelerate builds its launch command):
what a run's supervisor runs, recorded in launch.json, what starts a pool of warm ranks, and the
supervisors.

Where a run's agent meets the others and its ranks talk is a *place*: ``LOOPBACK`` on one machine
(the default), or this node of a run on several (``commlab.engine.launchers.nodes.Nodes``), each
giving its torchrun arguments and its environment, so that a command is built the same way for both.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from commlab.engine import procs
from commlab.engine.ranks import loopback_interface


class Loopback:
    """One machine: the c10d rendezvous at 127.0.0.1 on a free port, every store on loopback."""

    nnodes = 1

    def rendezvous_args(self) -> list[str]:
        return ["--rdzv-endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1"]

    def env(self) -> dict:
        return {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": loopback_interface() or "lo"}


LOOPBACK = Loopback()


def torchrun_argv(nproc: int, program: list[str], python: str = sys.executable, place=LOOPBACK,
                  fork: bool = False) -> list[str]:
    """torchrun (its stores kept on loopback, see ``commlab.engine.torchrun``) running
    ``program`` on ``nproc`` ranks at ``place`` (its nodes, rendezvous and addresses), no restarts.
    ``fork``: the ranks forked from torchrun with the program's imports done
    (``commlab.devices.ranks_forkable`` says when they may be)."""
    return [python, "-m", "commlab.engine.torchrun", "--nnodes", str(place.nnodes), "--nproc-per-node",
            str(nproc), "--rdzv-backend", "c10d", *place.rendezvous_args(),
            "--max-restarts", "0", "--monitor-interval", "0.2", *(["--start-method", "fork"] if fork else []),
            *program]


def run_argv(world_size: int, run_dir: str | os.PathLike, python: str = sys.executable, place=LOOPBACK,
             fork: bool = False) -> list[str]:
    """A cold run: torchrun starting ``world_size`` ranks of ``commlab.engine.worker`` at ``place``."""
    return torchrun_argv(world_size, ["-m", "commlab.engine.worker", str(run_dir)], python, place, fork)


def pool_argv(world_size: int, pool_dir: str | os.PathLike, fork: bool = False) -> list[str]:
    """A pool of warm ranks serving ``pool_dir`` (``commlab.engine.pool``)."""
    return torchrun_argv(world_size, ["-m", "commlab.engine.pool", "serve", str(Path(pool_dir).resolve())],
                         fork=fork)


def supervisor_argv(folder: str | os.PathLike) -> list[str]:
    """A run's supervisor (``commlab.engine.supervisor``)."""
    return [sys.executable, "-m", "commlab.engine.supervisor", str(Path(folder).resolve())]


def pool_supervisor_argv(pool_dir: str | os.PathLike) -> list[str]:
    """The supervisor of a pool of warm ranks, which supervises each run the pool serves."""
    return [sys.executable, "-m", "commlab.engine.supervisor", "--pool", str(Path(pool_dir).resolve())]


def worker_env(cfg, base: dict | None = None, place=LOOPBACK) -> dict:
    """The environment of the supervisor, torchrun and the workers (``cfg``: the RunConfig)."""
    env = procs.package_env(base)
    # Share the cores out instead of letting each rank start a thread per core.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.world_size)))
    # Set, not defaulted: an interface already named here (a cluster's eth0) would make Gloo listen
    # on the network.  On several nodes the interface is the one the person named, and this node's
    # stores listen on its address.
    env.update(place.env())
    env["NCCL_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"]
    env["PYTHONUNBUFFERED"] = "1"
    return env
