"""The one rank harness (``run_ranks``: N real ranks on loopback, their reports, every process
ended) and the one loopback listener, which it shares with ``commlab.engine.torchrun``.

How ranks start: one launcher process is started as a fresh interpreter (safe from any threaded
parent such as Streamlit or Jupyter); it imports torch once, binds the rendezvous socket to
127.0.0.1 and *forks* the ranks, so N ranks cost one torch import instead of N.  Rank 0 serves
the rendezvous store on that socket.  Ranks send their reports straight to the caller through a
pipe.  Whatever happens -- success, an exception in a rank, a timeout, an interrupt -- every
process started is ended through ``commlab.engine.procs`` before ``run_ranks`` returns.
"""
from __future__ import annotations

import datetime
import importlib
import os
import pickle
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from commlab.config import Bounds, ConfigError
from commlab.engine import procs

# A guard against hangs, not an expected duration: importing torch in a fresh process takes
# seconds, and on a shared 2-core machine under load it has taken over a minute.
DEFAULT_TIMEOUT_S = 300.0
TIMEOUT_BOUNDS = Bounds(0, 86400, "seconds before the ranks are given up; torch's process group "
                        "takes its timeout as a timedelta, and a day is more than any job here",
                        lo_open=True)


def loopback_listener(port: int = 0, host: str = "127.0.0.1") -> socket.socket:
    """A socket listening on 127.0.0.1 only (port 0: a free one), for a TCPStore server; on
    ``host`` only, when a run on several nodes names this node's address.

    Given a host and a port, ``torch.distributed.TCPStore`` listens on every interface whatever
    the host (pytorch/pytorch#173909); given this socket (``master_listen_fd``), it serves on it.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, port))
    sock.listen()
    return sock


def loopback_interface() -> str | None:
    """The name of the interface that holds 127.0.0.1 ('lo' on Linux), if psutil finds it."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addrs):
            return name
    return None


# The launcher is a fresh interpreter started with an argv list, not multiprocessing's spawn:
# it needs no ``if __name__ == "__main__"`` guard in the caller's script, does not re-run the
# caller's main module, and leaves no multiprocessing helper process (resource tracker) behind.
# The job is pickled twice so that it is unpickled only once sys.path matches the caller's.
_LAUNCHER_CODE = ("import pickle, sys; d = pickle.load(sys.stdin.buffer); sys.path[:] = d['path']; "
                  "from commlab.engine.ranks import _launcher_main; "
                  "_launcher_main(d['fd'], pickle.loads(d['job']))")


def run_ranks(target: Callable[..., None], world_size: int, args: tuple = (), *,
              backend: str = "gloo", timeout_s: float = DEFAULT_TIMEOUT_S,
              collective_timeout_s: float | None = None, preload: tuple[str, ...] = (),
              on_message: Callable[[Any], None] | None = None) -> list[Any]:
    """Run ``target(rank, world_size, report, *args)`` on ``world_size`` real ranks.

    ``target`` must be a module-level function (it is pickled by name).  Each rank has joined the
    default process group before ``target`` runs; ``report(obj)`` sends ``obj`` back here.
    Returns every report in the order received (``on_message`` sees each as it comes).
    ``collective_timeout_s`` (default ``timeout_s``) bounds each collective, so a deadlock fails
    sooner than the whole job would; ``preload`` names modules the launcher imports before it
    forks (``torch._dynamo``, which DDP's constructor imports: seconds per rank otherwise).
    Raises RuntimeError when a rank fails, TimeoutError after ``timeout_s``; either way, and on
    success, no process started here is left running.
    """
    from multiprocessing.connection import Connection

    msg = TIMEOUT_BOUNDS.error(timeout_s)
    if msg:  # before anything starts (a classroom's or a bench's --timeout)
        raise ConfigError({"timeout": msg})
    read_fd, write_fd = os.pipe()
    # Always an interface: one already named in the environment (a cluster's eth0) would make
    # Gloo listen on the network.
    job = (target, world_size, backend, loopback_interface() or "lo", args,
           collective_timeout_s or timeout_s, tuple(preload))
    try:
        launcher = procs.spawn([sys.executable, "-c", _LAUNCHER_CODE], stdin=subprocess.PIPE,
                               pass_fds=(write_fd,))
    finally:
        os.close(write_fd)  # the launcher and ranks hold the only writers: EOF means all gone
    started = procs.tree(launcher.pid)
    inbox = Connection(read_fd)
    finished = False
    try:
        launcher.stdin.write(pickle.dumps({"path": sys.path, "fd": write_fd,
                                           "job": pickle.dumps(job)}))
        launcher.stdin.close()
        received = _collect(inbox, launcher, started, timeout_s, on_message)
        finished = True
        return received
    finally:
        _end(launcher, started, grace_s=5.0 if finished else 0.0)
        inbox.close()


def _end(launcher: subprocess.Popen, started: list, grace_s: float) -> None:
    """Let a launcher that reported success exit by itself; then end whatever still runs."""
    try:
        launcher.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    # Once reaped, the launcher's PID may be someone else's: only look it up while it runs.
    running = procs.tree(launcher.pid) if launcher.poll() is None else []
    procs.terminate(started + running, grace_s=2.0)
    launcher.wait(5)


def _collect(inbox, launcher, started: list, timeout_s: float,
             on_message: Callable[[Any], None] | None) -> list[Any]:
    import psutil

    received: list[Any] = []

    def receive() -> bool:
        """Take one message if one comes within 0.1 s; True once the ranks are done."""
        if not inbox.poll(0.1):
            return False
        try:
            kind, payload = inbox.recv()
        except EOFError:
            raise RuntimeError(f"the rank launcher exited (code {launcher.poll()}) before the "
                               "ranks finished") from None
        if kind == "pids":  # recorded so that ranks are ended even if the launcher dies first
            started.extend(psutil.Process(pid) for pid in payload if psutil.pid_exists(pid))
        elif kind == "error":
            raise RuntimeError(payload)
        elif kind == "done":
            return True
        else:
            received.append(payload)
            if on_message:
                on_message(payload)
        return False

    if not procs.wait_until(receive, timeout_s, interval=0):  # the pipe's poll is the wait
        raise TimeoutError(f"the ranks did not finish within {timeout_s:g} s")
    return received


def _launcher_main(fd: int, job: tuple) -> None:
    """The launcher: fork the ranks, wait for them, say how it went."""
    procs.die_with_parent(os.getppid())  # the caller's thread waits in run_ranks all along
    import traceback
    from multiprocessing.connection import Connection

    import torch.distributed  # noqa: F401  imported once here, so the forked ranks need not
    import torch.multiprocessing as tmp
    import torch.nn.parallel  # noqa: F401  (DDP)
    from torch.multiprocessing.spawn import ProcessException

    target, world_size, backend, iface, args, timeout_s, preload = job
    for name in preload:
        importlib.import_module(name)
    # Nothing in this fresh interpreter has started a thread yet, so forking is safe, and each
    # rank starts with torch imported.  CUDA, though, must not be started in a parent that
    # forks, so NCCL ranks are spawned (and import torch themselves).
    method = "spawn" if backend == "nccl" else "fork"
    outbox = _Outbox(Connection(fd, readable=False), tmp.get_context(method).Lock())
    try:
        # Bound before the ranks fork, so that none can race for it.
        listener = loopback_listener()
        ctx = tmp.start_processes(_rank_entry, nprocs=world_size, join=False, daemon=True,
                                  start_method=method,
                                  args=(target, world_size, listener, backend, iface, outbox,
                                        args, timeout_s))
        listener.close()
        outbox.send("pids", ctx.pids())
        while not ctx.join():  # join() blocks until a rank ends; it is not a poll
            pass
    except Exception as e:  # a rank raised or died; its traceback is the useful part
        outbox.send("error", str(e) if isinstance(e, ProcessException) else traceback.format_exc())
        return
    outbox.send("done", None)


class _Outbox:
    """One pipe shared by the launcher and its ranks; the lock keeps messages whole."""

    def __init__(self, conn, lock):
        self.conn, self.lock = conn, lock

    def send(self, kind: str, payload: Any) -> None:
        with self.lock:
            self.conn.send((kind, payload))

    def report(self, payload: Any) -> None:
        self.send("report", payload)


def _rank_entry(rank, target, world_size, listener, backend, iface, outbox, args,
                timeout_s) -> None:
    import torch
    import torch.distributed as dist

    from commlab.engine.teardown import end_process_group

    procs.die_with_parent(os.getppid())
    # Set, not defaulted: Gloo and NCCL would otherwise take the environment's interface, or an
    # address from the host name.
    os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = iface
    torch.set_num_threads(1)  # ranks share the machine's few cores
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    port = listener.getsockname()[1]
    if rank == 0:  # rank 0 serves the store on the socket it inherited, and owns it from now
        store = dist.TCPStore("127.0.0.1", port, world_size, True, timeout=timeout,
                              master_listen_fd=listener.detach())
    else:
        listener.close()
        store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timeout)
    try:
        target(rank, world_size, outbox.report, *args)
    finally:
        end_process_group()

