"""torchrun with every store it serves bound to 127.0.0.1.

    python -m commlab.engine.torchrun [torchrun's own arguments]

``torch.distributed.TCPStore`` listens on every interface whatever host it is given
(pytorch/pytorch#173909): torchrun's rendezvous at 127.0.0.1:0 still opened two stores reachable
from the network.  A TCPStore server accepts a socket that is already listening
(``master_listen_fd``), so here each server gets the engine's loopback listener
(``commlab.engine.ranks.loopback_listener``) first; then this is ``torch.distributed.run.main``,
unchanged.  Clients (the workers) are untouched.

Three additions for the engine: the workers learn this process's PID (``procs.LAUNCHER_ENV``), so
that each can die with it; the file ``procs.TORCHRUN_RECORD_ENV`` names, if it is set, records when
this process's imports were done (a join timeout counts from there) and, when the workers fail,
torchrun's own record of how each one ended (exit code or signal, when it saw it).
And one repair: torchrun's log folder, which it would leave in /tmp after every job, goes as it ends.

``--start-method fork`` (torchrun's own option, which it applies to a Python function only) with
the engine's own program (``-m commlab.engine.worker`` or ``-m commlab.engine.pool``): torchrun
imports that program, torch and DDP's ``torch._dynamo`` once, then forks the ranks (its function
entrypoint) instead of starting an interpreter for each that imports them all again (measured on
two cores, ``benchmarks/startup.py``: command to first step 4.70 s against 6.21 s, DDP's set-up
0.06 s against 1.72 s).  Only where no GPU driver is (``commlab.devices.ranks_forkable``): CUDA
does not survive a fork.
"""
import importlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch.distributed as dist
from torch.distributed import run
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend
from torch.distributed.launcher.api import elastic_launch

from commlab.engine import procs, store
from commlab.engine.ranks import loopback_listener


class LoopbackTCPStore(dist.TCPStore):
    """A TCPStore whose server, if it is one, listens on 127.0.0.1 only (on a run of several
    nodes, on this node's address only: ``procs.STORE_ADDR_ENV``)."""

    def __init__(self, host_name, port=0, world_size=None, is_master=False, **kwargs):
        if is_master and kwargs.get("master_listen_fd") is None:
            sock = loopback_listener(port, os.environ.get(procs.STORE_ADDR_ENV, "127.0.0.1"))
            port = sock.getsockname()[1]  # port 0 asks for a free one
            kwargs["master_listen_fd"] = sock.detach()  # the store owns it from here
        super().__init__(host_name, port, world_size, is_master, **kwargs)


# The engine's programs that may be forked from here: each has ``main(argv) -> int``.
FORKABLE = ("commlab.engine.worker", "commlab.engine.pool")


def _module_main(module: str, *argv: str) -> int:
    """A forked rank: the program as ``python -m module argv`` would run it, its imports done."""
    return sys.modules[module].main(list(argv))


def _launch(config, entrypoint):
    """``torch.distributed.launcher.api.elastic_launch``, which torchrun calls with the program as
    a command line; the engine's own program, asked to be forked, becomes a function entrypoint."""
    launch = elastic_launch(config=config, entrypoint=entrypoint)
    if config.start_method != "fork":
        return launch

    def call(*cmd_args: str):
        args = list(cmd_args)
        at = args.index("-m") + 1 if "-m" in args else None
        if at is None or args[at] not in FORKABLE:
            return launch(*args)
        module, argv = args[at], args[at + 1:]
        importlib.import_module(module)
        import torch._dynamo  # noqa: F401  DDP's constructor imports it: once here, not in every rank

        sys.stdout.flush()  # what is buffered here would be written again by every rank
        sys.stderr.flush()
        return elastic_launch(config=config, entrypoint=_module_main)(module, *argv)

    return call


def main() -> int:
    # The two places torchrun's c10d rendezvous builds its stores: the rendezvous backend's
    # (imported by name) and the workers' bootstrap store (looked up on torch.distributed).
    dist.TCPStore = c10d_rendezvous_backend.TCPStore = LoopbackTCPStore
    run.elastic_launch = _launch  # the name torchrun's ``run`` calls
    os.environ[procs.LAUNCHER_ENV] = str(os.getpid())
    # Without --log-dir torchrun makes a folder in /tmp for each job and never removes it (955 of
    # them in a day of tests here): it gets one that goes as torchrun ends.
    logs = None
    if not any(a.startswith(("--log-dir", "--log_dir")) for a in sys.argv[1:]):
        logs = tempfile.mkdtemp(prefix="torchelastic_")
        sys.argv[1:1] = ["--log-dir", logs]
    if os.environ.get(procs.TORCHRUN_RECORD_ENV):  # its imports done: a join timeout counts from here
        store.write_json(Path(os.environ[procs.TORCHRUN_RECORD_ENV]), {"up_at": time.time()})
    try:
        run.main()
    except ChildFailedError as e:
        if os.environ.get(procs.TORCHRUN_RECORD_ENV):
            _write_record(os.environ[procs.TORCHRUN_RECORD_ENV], e)
        raise
    finally:
        if logs:
            shutil.rmtree(logs, ignore_errors=True)
    return 0


def _write_record(path: str, e: ChildFailedError) -> None:
    failures = [{"rank": rank, "exitcode": f.exitcode, "signal": f.signal_name(), "pid": f.pid,
                 "time": f.timestamp} for rank, f in sorted(e.failures.items())]
    store.write_json(Path(path), {**store.read_json(Path(path), {}), "failures": failures})


if __name__ == "__main__":
    procs.exit_now(main())  # a failure raises out of main: Python reports it and exits 1
