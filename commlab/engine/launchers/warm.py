"""A run on warm ranks (``commlab.engine.pool``): handed to a pool's supervisor, which is there
already and goes on to the pool's next run, so a Stop is asked in the folder, not signalled.
``Batch``: the runs one process starts one after another on such ranks (a sweep, a comparison)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from commlab.config import RunConfig
from commlab.engine import procs, run_folder, store
from commlab.engine.claims import POOLS
from commlab.engine.commands import worker_env
from commlab.engine.launch import Run, resolve_backend, start
from commlab.engine.launchers.base import Launcher
from commlab.engine.launchers.choice import chosen
from commlab.engine.pool import Pool, hand, supervisor_of, withdraw
from commlab.engine.run_state import GOING, RunStatus
from commlab.engine.status_file import record
from commlab.engine.stop_request import STOP_GRACE_S, request_stop


class Warm(Launcher):
    name = "warm"

    def __init__(self, pool: str | os.PathLike, owner: str | None = None, resume: str | os.PathLike | None = None):
        super().__init__(owner, resume)
        self.pool = Path(pool).resolve()

    @classmethod
    def owns(cls, info: dict) -> bool:
        return bool(info.get("pool"))

    @classmethod
    def of_record(cls, info: dict) -> Warm:
        return cls(info["pool"])

    def records(self, cfg, records: Path) -> dict:
        return {"pool": str(self.pool)}  # no command of its own: the pool's supervisor supervises it

    def start(self, folder: run_folder.RunFolder, cfg) -> None:
        # Its supervisor is the pool's, there already: named, then handed the run.
        store.write_json(folder.file("launch.json"), {**folder.launch_info(), "supervisor": supervisor_of(self.pool)})
        hand(self.pool, folder.path.resolve())

    def start_failure(self, e: BaseException) -> str:
        return str(e)

    def ask_to_stop(self, folder: run_folder.RunFolder, grace_s: float) -> None:
        """A run not taken yet is taken back; else the Stop is asked in the folder, and the
        supervisor is signalled (which ends the pool) only if it does not answer."""
        if folder.status() not in GOING:
            return
        if withdraw(self.pool, folder.path):
            record(folder.path, RunStatus.STOPPED, error="stopped by the user")
        else:
            request_stop(folder.path)
            procs.wait_until(lambda: folder.status() not in GOING, grace_s + STOP_GRACE_S)

    def signalled(self, folder: run_folder.RunFolder) -> tuple[dict, str] | None:
        return (folder.supervisor(), str(self.pool)) if folder.status() in GOING else None


class Batch:
    """Runs that one process starts one after another (a sweep, a comparison, a headroom
    measurement), each an ordinary run (``start``) but on warm ranks (``commlab.engine.pool``):
    the pool for its world size and backend is started at the first run that needs it and again
    after a run that ended it (a failure, a stall, a Stop); one pool at a time, so that idle ranks
    never hold memory beside a run's.  Every run dies with this process (``owner``), as its pool
    does.  ``warm`` False starts every run cold (one run gains nothing from a pool).  ``folder``
    keeps the pools' folders (a sweep's); by default a folder under the runs folder, removed by
    ``close``.  ``slurm``: every run a Slurm job of its own (``commlab.engine.launchers.slurm``),
    cold.  A context manager: ``close`` ends the pool and waits for it."""

    def __init__(self, owner: str, folder: str | os.PathLike | None = None, warm: bool = True,
                 slurm=None):
        self.owner, self.folder, self.slurm = owner, folder, slurm
        self.cold = chosen(slurm=slurm, owner=owner)  # the way a run goes when not on warm ranks
        self.on_pool = warm and slurm is None  # a Slurm job's ranks are Slurm's
        self.pool: Pool | None = None
        self._made: Path | None = None  # a folder of its own, removed by close

    def start(self, cfg: RunConfig, request_id: str | None = None) -> Run:
        if cfg.real_link_mbps:  # its ranks live in network namespaces of their own, never on a pool's
            return start(cfg, chosen(slurm=self.slurm, owner=self.owner, cfg=cfg), request_id)
        launcher = Warm(self._pool(cfg).path, self.owner) if self.on_pool else self.cold
        return start(cfg, launcher, request_id)

    def _pool(self, cfg: RunConfig) -> Pool:
        world, backend = cfg.world_size, resolve_backend(cfg)[0]
        if self.pool is not None and (self.pool.world_size, self.pool.backend) != (world, backend):
            self.pool.close()
            self.pool = None
        if self.pool is None:
            if self.folder is None:
                (Path(cfg.runs_dir) / POOLS).mkdir(parents=True, exist_ok=True)
                self.folder = self._made = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-",
                                                                 dir=Path(cfg.runs_dir) / POOLS))
            self.pool = Pool(Path(self.folder) / f"{world}-{backend}", world, backend)
        if not self.pool.alive():
            self.pool.start(worker_env(cfg))
        return self.pool

    def release(self) -> None:
        """Let the pool's ranks leave (no more runs) while this process does something else;
        ``close`` still waits for them."""
        if self.pool is not None:
            self.pool.release()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        if self._made is not None:
            shutil.rmtree(self._made, ignore_errors=True)
            self.folder = self._made = None

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
