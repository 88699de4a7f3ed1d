"""Processes: the one place commlab starts one (``spawn``), waits on one (``wait_until``), and
ends a tree of them for good.

torchrun starts every worker in its own session, so a signal to the launcher's process group
never reaches them: collect the whole tree first, then SIGTERM, wait, and SIGKILL survivors.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence

import psutil


def spawn(argv: Sequence[str], *, log: str | os.PathLike | None = None, env: dict | None = None,
          detached: bool = False, stdin: int = subprocess.DEVNULL,
          pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start ``argv``: stdin closed (unless a pipe is asked for), stdout and stderr appended to
    ``log`` (inherited when None), no file descriptor inherited but ``pass_fds``.  ``detached``
    gives it a session of its own, so that it outlives the caller and the caller's Ctrl-C."""
    out = open(log, "ab") if log is not None else None
    try:
        return subprocess.Popen(list(argv), stdin=stdin, stdout=out,
                                stderr=subprocess.STDOUT if out else None, env=env,
                                start_new_session=detached, close_fds=True, pass_fds=tuple(pass_fds))
    finally:
        if out:
            out.close()  # the child holds its own copy


def wait_until(predicate: Callable[[], object], timeout: float | None = None,
               interval: float = 0.05) -> bool:
    """Ask ``predicate`` every ``interval`` seconds until it is true (True) or ``timeout`` seconds
    have passed (its last answer); None waits as long as it takes."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not predicate():
        if deadline is not None and time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(interval)
    return True


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


def identity(pid: int) -> dict:
    """``{"pid", "create_time"}``: what a run folder records of a process, so that ``alive`` can
    tell it from a later process given the same PID."""
    try:
        created = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        created = 0.0  # gone already: no live process matches this record
    return {"pid": pid, "create_time": created}


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
