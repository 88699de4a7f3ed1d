"""Warm ranks: one torchrun job that runs many runs, one after another, in the same processes.

    python -m commlab.engine.torchrun ... -m commlab.engine.pool serve POOL_DIR     (``Pool.start``)
    python -m commlab.engine.pool submit POOL_DIR RUN_DIR                         (a run's command)

A cold run pays, before its first step, for torchrun importing torch to start the ranks, each rank
importing torch, the rendezvous, and DDP's constructor importing all of ``torch._dynamo``: about
6 s on an idle 2-core machine, for runs of a second or two.  A sweep starts a pool once and hands
it its runs: every run is still an ordinary run (its own folder, supervisor, status, Stop, metrics
and numbers: ``worker.run`` sets up a fresh model, optimizer, DDP, hook state and instrumentation
and reseeds every generator), only its ranks are already there.

The run's supervisor runs ``submit`` as its command instead of torchrun: it queues the run folder
in the pool's folder and waits until the pool says the run is done (exit 0) or the pool has ended
(exit 1: a rank failed, and wrote why into the run folder as a cold rank does).  Anything that
ends ``submit`` (Stop, a stall, the supervisor's end) ends the pool with it, since its ranks are
in the middle of that run: the sweep starts a new pool for the runs after it.  The pool dies with
the process that started it (the sweep).

    POOL_DIR/pool.json   its world size, backend, and torchrun's identity    queue/  runs to do
    POOL_DIR/done/       one file per run done                                close  ends the pool
"""
from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from commlab.devices import ranks_forkable
from commlab.engine import procs, store
from commlab.engine.commands import pool_argv

POLL_S = 0.02  # rank 0, between runs: how soon it sees the next
SUBMIT_POLL_S = 0.1  # a run's command, while the run trains: how soon it sees the run done
# The pool's group waits between runs for as long as a sweep may take to start the next one.
GROUP_TIMEOUT = datetime.timedelta(days=1)


class Pool:
    """A folder and the torchrun job that serves it; ``start`` (again after it ended)."""

    def __init__(self, path: str | os.PathLike, world_size: int, backend: str):
        self.path, self.world_size, self.backend = Path(path), world_size, backend
        self._child: subprocess.Popen | None = None  # the torchrun this object started

    def alive(self) -> bool:
        return _alive(self.path)

    def start(self, env: dict) -> None:
        """A new torchrun job serving this folder, dying with this process; the old queue cleared
        (and the old job, ended, reaped)."""
        self.close()
        for sub in ("queue", "done"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)
            for f in (self.path / sub).iterdir():
                f.unlink()
        (self.path / "close").unlink(missing_ok=True)
        child = procs.spawn(pool_argv(self.world_size, self.path, fork=ranks_forkable()),
                            log=self.path / "launcher.log", die_with_caller=True,
                            env={**env, procs.TORCHRUN_RECORD_ENV: str(self.path / "torchrun.json")})
        store.write_json(self.path / "pool.json", {"world_size": self.world_size, "backend": self.backend,
                                                   "torchrun": procs.identity(child.pid)})
        self._child = child

    def release(self) -> None:
        """Ask the ranks to leave after the run in hand, without waiting (``close`` waits)."""
        if self.alive():
            (self.path / "close").touch()

    def close(self, timeout: float = 60) -> None:
        """Ask the ranks to leave after the run in hand; end them if they do not; reap torchrun."""
        if self.alive():
            self.release()
            pid = torchrun_of(self.path)["pid"]
            if not procs.wait_until(lambda: not self.alive(), timeout):
                procs.kill_tree(pid)
        if self._child is not None:
            self._child.wait(timeout=10)
            self._child = None


def torchrun_of(pool_dir: Path) -> dict:
    """The identity (pid, create_time) of the torchrun serving ``pool_dir``; {} before one."""
    return store.read_json(pool_dir / "pool.json", {}).get("torchrun", {})


def _alive(pool_dir: Path) -> bool:
    torchrun = torchrun_of(pool_dir)
    return procs.alive(torchrun.get("pid"), torchrun.get("create_time"))


# ---------------------------------------------------------------------------- a run's command
def submit(pool_dir: Path, run_dir: Path) -> int:
    name = f"{time.time_ns()}-{Path(run_dir).name}.json"

    def end_the_pool(*_) -> None:  # its ranks are inside this run: nothing else ends it
        if _alive(pool_dir):
            procs.kill_tree(torchrun_of(pool_dir)["pid"], grace_s=2)
        raise SystemExit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, end_the_pool)
    store.write_json(pool_dir / "queue" / name, {"run_dir": str(run_dir)})
    done = pool_dir / "done" / name
    procs.wait_until(lambda: done.exists() or not _alive(pool_dir), interval=SUBMIT_POLL_S)
    return 0 if done.exists() else 1


# ---------------------------------------------------------------------------- the ranks
def serve(pool_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    from commlab.engine import worker
    from commlab.engine.teardown import end_process_group

    worker.become_rank()
    record = store.read_json(pool_dir / "pool.json", {})
    dist.init_process_group(record.get("backend", "gloo"), timeout=GROUP_TIMEOUT)
    # DDP's constructor imports torch._dynamo (seconds): once here, not in the first run.
    warm = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    del warm
    while True:
        said = [_next(pool_dir) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(said)
        if said[0] is None:
            break
        name, run_dir = said[0]
        worker.PHASES.clear()
        worker.PHASES["imported"] = worker.PHASES["process_group"] = time.time()  # warm already
        try:
            worker.run(Path(run_dir))
        except BaseException as e:
            worker.report_failure(Path(run_dir), e)
            raise
        if dist.get_rank() == 0:
            store.write_json(pool_dir / "done" / name, {"run_dir": run_dir, "at": time.time()})
    end_process_group()


def _next(pool_dir: Path) -> tuple[str, str] | None:
    """The next queued run (its queue file's name and folder), taken; None once asked to close."""
    queue = pool_dir / "queue"
    while True:
        for f in sorted(queue.glob("*.json")):
            run_dir = store.read_json(f, {}).get("run_dir")
            f.unlink()
            if run_dir:
                return f.name, run_dir
        if (pool_dir / "close").exists():
            return None
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[0] == "serve":
        serve(Path(argv[1]))
        return 0
    return submit(Path(argv[1]), Path(argv[2]))


if __name__ == "__main__":
    procs.exit_now(main())  # a failure raises out of main: Python reports it and exits 1
