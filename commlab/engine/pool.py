"""Warm ranks: one torchrun job that runs many runs, one after another, under one supervisor, each
run in fresh processes forked from ranks that have imported what every run needs.

    python -m commlab.engine.supervisor --pool POOL_DIR                           (``Pool.start``)
      python -m commlab.engine.torchrun ... -m commlab.engine.pool serve POOL_DIR   (its child)

A cold run pays, before its first step, for torchrun importing torch to start the ranks, each rank
importing torch, the rendezvous, and DDP's constructor importing all of ``torch._dynamo``: about
3 s on an idle 2-core machine, for runs of a second or two.  A sweep starts a pool once and hands
it its runs: every run is still an ordinary run (its own folder, status, Stop, metrics and
numbers), in processes forked for it from the pool's ranks (``serve``), which have imported torch,
the lab and DDP's ``torch._dynamo`` and never run a run themselves: a user's module is imported
afresh in each run, as in a cold one.

The pool's supervisor (``commlab.engine.supervisor.serve_pool``) takes the runs handed to it
(``hand``) one at a time and supervises each as a cold run's supervisor does (status, the stall
rule, a failing rank, the process it must not outlive); only a Stop is asked in the run's folder
(``nodes.request_stop``), because the same supervisor goes on to the next run.  A run that does
not end well (a failure, a stall, a Stop) ends the ranks with it, since they are in the middle of
that run, and the pool with them: ``launch.Batch`` starts a new pool for the runs after it.

    POOL_DIR/pool.json    its world size, backend, the process it dies with, its supervisor
    POOL_DIR/runs/        runs handed to the pool        queue/  the run its ranks are given
    POOL_DIR/done/        one file per run done          close   the ranks leave after the run in hand
    POOL_DIR/ended        the pool takes no more runs (it is ending or has ended)
    POOL_DIR/turns/       the run of each turn, as rank 0 posts it to the other ranks
    POOL_DIR/stores/      the file store each run's ranks meet in
"""
from __future__ import annotations

import gc
import itertools
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from commlab.engine import procs, store
from commlab.engine.commands import pool_supervisor_argv

POLL_S = 0.02  # the ranks and the supervisor, between runs: how soon they see the next
ENDED = "ended"


class Pool:
    """A folder and the supervisor (and torchrun job) that serves it; ``start`` (again after it ended)."""

    def __init__(self, path: str | os.PathLike, world_size: int, backend: str):
        self.path, self.world_size, self.backend = Path(path), world_size, backend
        self._child: subprocess.Popen | None = None  # the supervisor this object started

    def alive(self) -> bool:
        """Whether it takes runs (its supervisor runs, and is not ending)."""
        return _alive(self.path)

    def start(self, env: dict) -> None:
        """A new pool serving this folder, ending with this process; the old queue cleared (and
        the old pool, ended, reaped)."""
        self.close()
        for sub in ("runs", "queue", "done", "turns", "stores"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)
            for f in (self.path / sub).iterdir():
                f.unlink()
        for f in ("close", ENDED):
            (self.path / f).unlink(missing_ok=True)
        record = {"world_size": self.world_size, "backend": self.backend, "owner": procs.identity(os.getpid())}
        store.write_json(self.path / "pool.json", record)
        # Detached like a run's supervisor (a Ctrl-C here is this process's to handle); it watches
        # ``owner`` and ends the pool, and records the run in hand as stopped, once it is gone.
        child = procs.spawn(pool_supervisor_argv(self.path), log=self.path / "supervisor.log",
                            env=env, detached=True)
        store.write_json(self.path / "pool.json", {**record, "supervisor": procs.identity(child.pid)})
        self._child = child

    def release(self) -> None:
        """Ask the ranks to leave after the run in hand, without waiting (``close`` waits)."""
        if self.alive():
            (self.path / "close").touch()

    def close(self, timeout: float = 60) -> None:
        """Ask the ranks to leave after the run in hand; end the pool if it has not ended within
        ``timeout`` (its supervisor gone, which waits for its torchrun); reap it."""
        sup = supervisor_of(self.path)
        if procs.alive(sup.get("pid"), sup.get("create_time")):
            self.release()
            if not procs.wait_until(lambda: not procs.alive(sup["pid"], sup["create_time"]), timeout):
                procs.kill_tree(sup["pid"])
        if self._child is not None:
            self._child.wait(timeout=10)
            self._child = None


def supervisor_of(pool_dir: str | os.PathLike) -> dict:
    """The identity (pid, create_time) of the supervisor serving ``pool_dir``; {} before one."""
    return store.read_json(Path(pool_dir) / "pool.json", {}).get("supervisor", {})


def _alive(pool_dir: Path) -> bool:
    sup = supervisor_of(pool_dir)
    return not (pool_dir / ENDED).exists() and procs.alive(sup.get("pid"), sup.get("create_time"))


def hand(pool_dir: str | os.PathLike, run_dir: str | os.PathLike) -> None:
    """Queue a prepared run for the pool's supervisor (launch.json names it the run's already)."""
    pool_dir = Path(pool_dir)
    if not _alive(pool_dir):
        raise RuntimeError(f"the pool of warm ranks in {pool_dir} has ended")
    store.write_json(pool_dir / "runs" / f"{time.time_ns()}-{Path(run_dir).name}.json", {"run_dir": str(run_dir)})


def withdraw(pool_dir: str | os.PathLike, run_dir: str | os.PathLike) -> bool:
    """Take back a run handed to the pool that its supervisor has not taken yet; whether it was."""
    for f in (Path(pool_dir) / "runs").glob(f"*-{Path(run_dir).name}.json"):
        try:
            f.unlink()
            return True
        except FileNotFoundError:
            pass
    return False


def take(folder: Path, closed) -> tuple[str, str] | None:
    """The next run queued in ``folder`` (its queue file's name and run folder), taken; None once
    ``closed()`` says no more will be taken (asked only while the queue is empty)."""
    while True:
        for f in sorted(folder.glob("*.json")):
            run_dir = store.read_json(f, {}).get("run_dir")
            try:
                f.unlink()  # taken by whoever removes it: here, or a Stop (``withdraw``)
            except FileNotFoundError:
                continue
            if run_dir:
                return f.name, run_dir
        if closed():
            return None
        time.sleep(POLL_S)


# ---------------------------------------------------------------------------- the ranks
POOL_RANK_NAME = "commlab-pool"  # a pool's rank, which forks the run's rank: this, then its rank


def serve(pool_dir: Path) -> None:
    """A fork server: this rank imports torch, the lab and DDP's ``torch._dynamo`` once (torchrun
    did, when it forked it), and runs each run in a child forked for it, a fresh process that joins
    a process group of the run's own.  So a run starts from what a cold run starts from whatever
    its workload keeps in its module (a stream made at first use, a draw at import, a cached
    model): the workload is imported in the child, and nothing of one run's processes is seen by
    the next.  This process never joins a process group: a fork copies no thread, so a child must
    not inherit one (Gloo's)."""
    from commlab.engine import worker

    worker.become_rank(name=POOL_RANK_NAME)
    import torch._dynamo  # noqa: F401  DDP's constructor imports it: here, once, not in every run

    # What exists now lives as long as the pool: collected once, then left out of every run's
    # collections (a run's closing ``gc.collect`` would scan torch's imports again: 0.13-0.20 s).
    gc.collect()
    gc.freeze()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for turn in itertools.count():
        said = _next_turn(pool_dir, rank, turn)
        if said is None:
            return
        name, run_dir = said["name"], Path(said["run_dir"])
        if code := _run_forked(worker, run_dir, pool_dir / "stores" / name, world):
            procs.end_as(code)  # the run failed on this rank: the pool ends with it
        if rank == 0:
            store.write_json(pool_dir / "done" / name, {"run_dir": str(run_dir), "at": time.time()})


def _next_turn(pool_dir: Path, rank: int, turn: int) -> dict | None:
    """The run of this turn, the same on every rank: rank 0 takes it from the queue and posts it
    in ``turns/`` (an empty post: no more runs), the others wait for the post."""
    post = pool_dir / "turns" / f"{turn}.json"
    if rank == 0:
        taken = take(pool_dir / "queue", (pool_dir / "close").exists)
        said = {"name": taken[0], "run_dir": taken[1]} if taken else {}
        (pool_dir / "stores").mkdir(exist_ok=True)
        store.write_json(post, said)
    else:
        procs.wait_until(post.exists, interval=POLL_S)
        said = store.read_json(post)
    return said or None


def _run_forked(worker, run_dir: Path, rendezvous: Path, world: int) -> int:
    """Run ``run_dir`` in a child of this process, through ``rendezvous`` (a file store the run's
    ranks meet in); the child's exit code."""
    import torch.distributed as dist

    me = os.getpid()
    sys.stdout.flush()  # what is buffered here would be written again by the child
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            worker.become_rank(parent=me)
            worker.PHASES.clear()
            worker.PHASES["imported"] = time.time()  # forked: torch and the lab imported already
            worker.train(run_dir, dist.FileStore(str(rendezvous), world))
            code = 0
        except BaseException as e:
            worker.report_failure(run_dir, e)
            traceback.print_exc()
        finally:
            procs.exit_now(code)
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    assert argv[0] == "serve", argv
    serve(Path(argv[1]))
    return 0


if __name__ == "__main__":
    procs.exit_now(main())  # a failure raises out of main: Python reports it and exits 1
