"""Processes: the one place commlab starts one (``spawn``), waits on one (``wait_until``), and
ends a tree of them for good.

torchrun starts every worker in its own session, so a signal to the launcher's process group
never reaches them: collect the whole tree first, then SIGTERM, wait, and SIGKILL survivors.
Nothing here ever signals PID 1, this process or one of its ancestors (``protected``), and what a
run folder names is signalled only once proven to be that run's (``belonging``).
"""
from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import psutil

# The folder a process works for, set in the environment of a run's supervisor (so of torchrun and
# the workers too): with the folder in the command line, what proves a process is a run's.
OWNER_ENV = "COMMLAB_RUN_DIR"
# torchrun's PID, set by ``commlab.engine.torchrun`` for its workers (see ``die_with_parent``).
LAUNCHER_ENV = "COMMLAB_LAUNCHER_PID"
# Where ``commlab.engine.torchrun`` writes torchrun's record of failed workers.
TORCHRUN_RECORD_ENV = "COMMLAB_TORCHRUN_RECORD"
# The address ``commlab.engine.torchrun``'s stores listen on: 127.0.0.1 unless a run on several
# nodes names this node's (``commlab.engine.launchers.nodes``).
STORE_ADDR_ENV = "COMMLAB_STORE_ADDR"
# How long a process just started may show no command line (see ``owned_by``).
EXEC_SETTLE_S = 2.0
_PR_SET_PDEATHSIG, _PR_SET_NAME, _PR_SET_CHILD_SUBREAPER = 1, 15, 36


def _prctl():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _prctl()  # looked up before any fork: a forked child must not load libraries


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent`` (its parent) ends, and end now if it
    already has (Linux; elsewhere nothing)."""
    if _PRCTL is None:
        return
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it ended before the request: the kernel will never send it
        os.kill(os.getpid(), signal.SIGKILL)


def set_name(name: str) -> None:
    """This process's name as ``ps`` and psutil's ``name()`` show it (at most 15 bytes; Linux)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_NAME, name.encode()[:15])


def exit_now(code: int = 0) -> None:
    """End this process at once, its output flushed, without the interpreter's teardown: after
    ``import torch`` (and DDP's import of torch._dynamo) that teardown takes a second, which a
    rank or torchrun with nothing left to do would spend before its run counts as ended."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def spawn(argv: Sequence[str], *, log: str | os.PathLike | None = None, env: dict | None = None,
          detached: bool = False, die_with_caller: bool = False, stdin: int = subprocess.DEVNULL,
          pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start ``argv``: stdin closed (unless a pipe is asked for), stdout and stderr appended to
    ``log`` (inherited when None), no file descriptor inherited but ``pass_fds``.  ``detached``
    gives it a session of its own, so that it outlives the caller and the caller's Ctrl-C;
    ``die_with_caller`` has it SIGKILLed when the caller ends, however it ends (a caller with one
    thread only: the request is made between fork and exec)."""
    out = open(log, "ab") if log is not None else None
    guard = functools.partial(die_with_parent, os.getpid()) if die_with_caller else None
    try:
        return subprocess.Popen(list(argv), stdin=stdin, stdout=out,
                                stderr=subprocess.STDOUT if out else None, env=env,
                                start_new_session=detached, close_fds=True, pass_fds=tuple(pass_fds),
                                preexec_fn=guard)
    finally:
        if out:
            out.close()  # the child holds its own copy


def package_env(base: dict | None = None) -> dict:
    """``base`` (this process's environment) with the package and a user's workload module
    importable in a child as they are here; applying it twice changes nothing."""
    env = dict(os.environ if base is None else base)
    roots = [str(Path(__file__).resolve().parents[2]), os.getcwd(),
             *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(roots))
    return env


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
    """The process and all its descendants (those still alive), none of them ``protected``."""
    try:
        root = psutil.Process(pid)
        everyone = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    spared = protected()
    return [p for p in everyone if p.pid not in spared]


def protected() -> set[int]:
    """PIDs never signalled: init (in a PID namespace, everything), this process, its ancestors."""
    me = psutil.Process()
    return {1, me.pid, *(p.pid for p in me.parents())}


def belonging(records: Iterable[dict], owner: str) -> list[psutil.Process]:
    """The live processes among ``records`` (``identity`` dicts, as a run folder keeps them)
    proven to work for the folder ``owner``: the same PID and create time, and ``owner`` in the
    command line or as ``OWNER_ENV``; never a ``protected`` one.  A record without a create
    time proves nothing."""
    spared, found = protected(), []
    for rec in records:
        pid, created = rec.get("pid"), rec.get("create_time")
        if not pid or created is None or pid in spared or not alive(pid, created):
            continue
        try:
            p = psutil.Process(pid)
            if owned_by(p, owner):
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def owned_by(p: psutil.Process, owner: str) -> bool:
    """Whether ``owner`` (a folder) is in the process's command line or environment."""
    try:
        # A process that Popen has just returned is past exec's point of no return, but its new
        # arguments and environment may not be set yet: both read empty for a moment (1 of 750
        # fresh reads at load 4).  A Stop right after a launch would take its supervisor for a stranger.
        # Only a young process is waited for (a kernel thread has no command line ever); a create
        # time is off by up to a second.
        young = EXEC_SETTLE_S + 1.0 - (time.time() - p.create_time())
        if young > 0:
            wait_until(lambda: p.cmdline() or p.status() == psutil.STATUS_ZOMBIE, young, 0.005)
        return owner in p.cmdline() or p.environ().get(OWNER_ENV) == owner
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def terminate(procs: Iterable[psutil.Process], grace_s: float = 3.0) -> list[int]:
    """SIGTERM every process, wait up to ``grace_s``, SIGKILL the rest; returns the killed PIDs.
    ``protected`` ones are left alone."""
    spared = protected()
    procs = [p for p in procs if p.pid not in spared]
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


def adopt_orphans() -> None:
    """Have the kernel give this process, not init, every process orphaned below it: what code run
    under it starts (a double fork, a child in a session of its own, with an environment of its own)
    stays in its tree, however it detached, for ``end_adopted`` to end (Linux; elsewhere nothing)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_CHILD_SUBREAPER, 1)


def end_adopted(keep: Iterable[int] = (), grace_s: float = 1.0) -> list[int]:
    """End (and reap) this process's children but ``keep``, with their descendants: after
    ``adopt_orphans``, what the code it ran left behind.  Returns the PIDs that needed SIGKILL."""
    try:
        children = psutil.Process().children()
    except psutil.NoSuchProcess:
        return []
    kept = set(keep)
    return terminate([p for c in children if c.pid not in kept for p in tree(c.pid)], grace_s)


def end_as(code: int) -> None:
    """End this process as a child it waited for ended (``os.waitstatus_to_exitcode``: an exit
    code, or minus the signal that killed it), so that whoever waits for this one reads the same."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    exit_now(code)


HOST = socket.gethostname()


def identity(pid: int) -> dict:
    """``{"pid", "create_time", "host"}``: what a run folder records of a process, so that ``alive``
    can tell it from a later process given the same PID; ``host``, because a run folder on a shared
    file system is read on other machines, where the PID means nothing (``elsewhere``)."""
    try:
        created = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        created = 0.0  # gone already: no live process matches this record
    return {"pid": pid, "create_time": created, "host": HOST}


def elsewhere(record: dict) -> bool:
    """Whether an ``identity`` record names a process of another machine (a compute node's, read
    from a login node): its liveness cannot be told here."""
    return record.get("host", HOST) != HOST


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
