"""The runs folder's exclusive names and locks: the one way processes that share a runs folder
(browser tabs, a sweep and its executor, the nodes of a run) keep out of each other's way.

The lab's own folders (``LAB_FOLDERS``) are names no run takes.  Two kinds of claim, as the cases need:
  ``take(path)``     a name only one process ever creates (O_EXCL): a node's claim of its records
                     (``.node``), a request id's claim of its run (``Request``)
  ``locked(path)``   a lock held for a block (flock, released when the block or the process ends):
                     the Launch form's check-and-start (``.launch.lock``), a sweep's claim of the
                     sweeps folder (``sweeps/.claim.lock``) and its state's read-change-write
                     (``.state.lock``)
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from commlab.engine import procs, store

# The lab's own folders in the runs folder: no run id may name one (a run written into sweeps/ was
# deleted with every sweep), and no deletion of a run removes one.
SWEEPS = "sweeps"  # a sweep's folder each (``commlab.tune.sweep``)
POOLS = ".pools"  # the warm ranks of a comparison or a headroom measurement (``launchers.warm``)
LAB_FOLDERS = {SWEEPS: "the lab's folder of sweeps", POOLS: "the lab's folder of warm ranks"}
LAUNCH_LOCK = ".launch.lock"  # in the runs folder: the Launch form's check for a twin run, then its start
NODE_CLAIM = ".node"  # in a node's records folder: the run id is this node's
SWEEP_CLAIM = ".claim.lock"  # in the sweeps folder: no sweep running, and the next one's claim, as one step
STATE_LOCK = ".state.lock"  # in a sweep's folder: its state.json's read-change-write


def take(path: str | os.PathLike) -> bool:
    """Create ``path`` if no process has: True for the one that did, False for every other."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except FileExistsError:
        return False


@contextlib.contextmanager
def locked(path: str | os.PathLike) -> Iterator[None]:
    """Hold the lock on ``path`` (made with its folder if absent) for the block; other processes
    asking for it wait their turn."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield  # closing the file releases it


class Request:
    """A request id's claim in the runs folder (``.request-<hash>.json``): the first process to take
    it starts the run and names it there; any other, at the same moment or later, is given that run."""

    def __init__(self, runs_dir: str | os.PathLike, request_id: str):
        digest = hashlib.sha256(request_id.encode()).hexdigest()[:32]
        self.path = Path(runs_dir) / f".request-{digest}.json"

    def take(self, wait_s: float = 60) -> Path | None:
        """None: the id is this process's to start; else the folder of the run the process holding
        it started, once it has named it (RuntimeError when it has not within ``wait_s``)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if take(self.path):
            return None
        named = lambda: store.read_json(self.path, {}).get("run")  # noqa: E731
        if not procs.wait_until(named, wait_s, 0.05):
            raise RuntimeError(f"another process claimed request id {self.path.name} and has not started "
                               f"its run after {wait_s:.0f} s")
        return self.path.parent / named()

    def name(self, run_dir: str | os.PathLike) -> None:
        store.write_json(self.path, {"run": Path(run_dir).name})

    def release(self) -> None:
        """Nothing was started: the id is free again."""
        self.path.unlink(missing_ok=True)
