"""Ending process trees for good.

torchrun starts every worker in its own session, so a signal to the launcher's process group
never reaches them: collect the whole tree first, then SIGTERM, wait, and SIGKILL survivors.
"""
from __future__ import annotations

import signal
from collections.abc import Iterable

import psutil


def tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (those still alive)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def terminate(procs: Iterable[psutil.Process], grace_s: float = 3.0) -> list[int]:
    """SIGTERM every process, wait up to ``grace_s``, SIGKILL the rest; returns the killed PIDs."""
    procs = list(procs)
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in alive]


def kill_tree(pid: int, grace_s: float = 3.0) -> list[int]:
    return terminate(tree(pid), grace_s)


def alive(pid: int | None, create_time: float | None = None) -> bool:
    """Whether this PID still runs the process we started (not a reused PID)."""
    if not pid:
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(p.create_time() - create_time) < 1.0
    except psutil.NoSuchProcess:
        return False
