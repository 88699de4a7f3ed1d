"""Starting and stopping runs.

The commands are pure (``commlab.engine.commands``) and tested on their own;
``start`` is the one place that starts a run: it writes the run folder's first files (status
``starting``, launch.json with the exact command) and spawns a detached supervisor
(``commlab.engine.supervisor``), whose PID and create time it records at once; the supervisor
runs that command, says ``running`` once it is up, and records how the run ends.  Because the
supervisor is detached, a run outlives the app or shell that launched it, and any later process
can stop it through the PIDs recorded in the folder: only processes proven to be the run's
(``procs.belonging``) are ever signalled.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from commlab.config import ConfigError, RunConfig, default_runs_dir
from commlab.devices import pick_backend, ranks_forkable
from commlab.engine import claims, procs, run_folder, status_file, store
from commlab.engine.commands import run_argv, supervisor_argv
from commlab.engine.nodes import STOP_GRACE_S, Nodes, request_stop
from commlab.engine.pool import Pool, hand, supervisor_of, withdraw
from commlab.engine.ranks import loopback_interface
from commlab.engine.run_state import RunStatus
from commlab.engine.slurm import SlurmJob, cancel, submit
from commlab.engine.slurm import job_of as slurm_job_of

POOLS = ".pools"  # in the runs folder: the warm ranks of a comparison or a headroom measurement


def resolve_backend(cfg: RunConfig, gpus: int | None = None) -> tuple[str, str]:
    """(backend, why) for this machine."""
    return pick_backend(cfg.backend, cfg.world_size, gpus)


def torchrun_command(cfg: RunConfig, run_dir: str | os.PathLike, python: str = sys.executable,
                     node: Nodes | None = None) -> list[str]:
    """The exact argv that runs a run's workers (recorded in launch.json, run by the supervisor)."""
    return run_argv(cfg.world_size, run_dir, python, node, fork=ranks_forkable())


def worker_env(cfg: RunConfig, base: dict | None = None, node: Nodes | None = None) -> dict:
    """The environment of the supervisor, torchrun and the workers, computed once, by ``start``."""
    env = procs.package_env(base)
    # Share the cores out instead of letting each rank start a thread per core.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.world_size)))
    env["MASTER_ADDR"] = "127.0.0.1" if node is None else str(node.local_addr)
    # Set, not defaulted: an interface already named here (a cluster's eth0) would make Gloo listen
    # on the network.  On several nodes the interface is the one the person named, and this node's
    # stores listen on its address.
    env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = (
        loopback_interface() or "lo" if node is None else node.ifname)
    if node is not None:
        env[procs.STORE_ADDR_ENV] = str(node.local_addr)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def prepare(cfg: RunConfig, request_id: str | None = None,
            resume: str | os.PathLike | None = None, owner: str | None = None,
            pool: str | os.PathLike | None = None, node: Nodes | None = None) -> run_folder.RunFolder:
    """Validate, then create the run folder, status ``starting`` and owned by this process until
    ``start`` hands it to a supervisor; config.json, the marker, last.  ``resume``: the folder of
    a finished run this one continues from its checkpoint (``commlab.engine.checkpoint``).
    ``owner``: what this process is (``"sweep <id>"``), when the run must not outlive it.
    ``pool``: the folder of warm ranks (``commlab.engine.pool``) that runs it, in place of torchrun
    (no command of its own: the pool's supervisor supervises it).
    ``node``: this node of a run on several (``commlab.engine.nodes``): the run folder is the run
    id's in the runs folder, made by node 0; the folder returned holds this node's records.
    Raises ConfigError."""
    from commlab.engine import workload_probe
    from commlab.hooks import registry

    workload_probe.check(cfg.check())  # a user's workload runs in a child, never here
    if resume is not None:
        from commlab.engine import checkpoint  # torch: only to open a checkpoint's files

        if errors := checkpoint.resume_errors(cfg, resume):
            raise ConfigError(errors)
    backend, why = resolve_backend(cfg)
    impl, impl_reason = registry.plan(cfg, backend)
    if node is not None and (resume is not None or pool is not None):
        raise ConfigError({"nnodes": "a run on several nodes starts cold, from step 0 (no resume, no warm ranks)"})
    whole = Path(cfg.runs_dir, node.run_id).resolve() if node is not None else None  # the run's folder
    run_dir = store.new_run_dir(cfg.runs_dir, cfg.label()) if node is None else _node_dir(cfg, node, whole)
    status_file.record(run_dir, RunStatus.STARTING, step=None)
    store.write_json(run_dir / "launch.json", {
        "backend": backend, "backend_reason": why, "hook_impl": impl, "hook_reason": impl_reason,
        "warning": registry.stock_warning(cfg, backend), "request_id": request_id,
        "resumed_from": str(Path(resume).resolve()) if resume is not None else None,
        **({} if pool is not None else {"command": torchrun_command(cfg, whole or run_dir.resolve(), node=node)}),
        "nodes": node.as_dict() if node is not None else None,
        "run_dir": str(whole) if whole and whole != run_dir.resolve() else None,  # node K's: the run's folder
        "pool": str(Path(pool).resolve()) if pool is not None else None, "created_at": time.time(),
        "launcher": procs.identity(os.getpid()),
        "owner": {**procs.identity(os.getpid()), "what": owner} if owner else None})
    store.write_json(run_dir / "config.json", cfg.to_dict())
    return run_folder.RunFolder(run_dir)


def _node_dir(cfg: RunConfig, node: Nodes, run_dir: Path) -> Path:
    """This node's records folder in ``run_dir``, the run folder named by the run id (made here if
    this node is first); ConfigError when this node's records are there already (an id used
    before), or when node 0's settings differ."""
    path = node.records(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    # Of two commands given one id at the same moment, one is refused; a run from before the claim
    # file has its config.json.
    taken = not claims.take(path / claims.NODE_CLAIM) or (path / "config.json").exists()
    if taken:
        raise ConfigError({"run_id": f"{node.run_id!r} is taken: {run_dir} already holds node "
                                     f"{node.node_rank}'s records (give each run an id of its own)"})
    theirs = store.read_json(run_dir / "config.json") if node.node_rank else None
    if theirs and (differ := sorted(k for k, v in cfg.to_dict().items() if k != "runs_dir" and theirs.get(k) != v)):
        raise ConfigError({"run_id": f"node 0 started {node.run_id!r} with other settings: "
                                     f"{', '.join(differ)} differ (every node gives the same)"})
    if node.node_rank == 0:
        store.make_reserve(path)
    return path


class Run(run_folder.RunFolder):
    """A run folder plus control: wait for it, stop it, ask whether it still goes."""

    def whole(self) -> Run:
        """The run this folder is part of: itself, or for node K's records of a run on several
        nodes, the run folder (node 0's, where the metrics are)."""
        return Run(self.launch_info().get("run_dir") or self.path)

    def is_running(self) -> bool:
        """Still going: pending (a Slurm job in the queue), starting, running or orphaned."""
        return self.status() in store.GOING

    def wait(self, timeout: float | None = None, poll_s: float = 0.2, processes: bool = True) -> str:
        """Block until the run ends (or ``timeout`` seconds pass); returns its status.  An
        orphaned run is stopped: with no supervisor, nothing would ever end it or record its end.
        ``processes`` False returns once the end is recorded, while the run's processes exit (a
        second or more: their teardown; the supervisor sees them all gone)."""
        def ended() -> bool:
            status = self.status()
            if status == RunStatus.ORPHANED:
                self.stop()
            return status not in store.GOING

        if procs.wait_until(ended, timeout, poll_s) and processes:
            self._wait_for_supervisor()
        return self.status()

    def _wait_for_supervisor(self, timeout: float = 120) -> None:
        # The worker writes "finished" a moment before its processes are gone (longer on a busy
        # machine); callers that go on to count processes, or start the next run (whose step
        # times the leftovers would spoil), want them gone.
        # (a Slurm job's follower, too, which records Slurm's word on the job once it has left)
        sups, me = [self.supervisor(), self.launch_info().get("supervisor", {})], str(self.path.resolve())
        procs.wait_until(lambda: not procs.belonging(sups, me), timeout)

    def stop(self) -> str:
        return stop(self)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, status={self.status()!r})"


def start(cfg: RunConfig, request_id: str | None = None,
          resume: str | os.PathLike | None = None, owner: str | None = None,
          pool: str | os.PathLike | None = None, node: Nodes | None = None,
          slurm: SlurmJob | None = None) -> Run:
    """Start a run in the background and return its folder at once, status ``starting``;
    ``resume``: continue the finished run in that folder (see ``prepare``).  The run outlives
    this process, unless ``owner`` names what this process is (``"sweep <id>"``): then its
    supervisor stops it once this process has ended.  ``pool``: run it on warm ranks
    (``commlab.engine.pool``).  ``node``: this node of a run on several (``commlab.engine.nodes``);
    the folder returned holds this node's records (``Run.whole`` is the run's).  ``slurm``: submit
    it as a Slurm job instead (``commlab.engine.slurm``), followed from here.

    ``request_id`` makes starting idempotent: a second call with the same id (a double click,
    a second browser tab, another process at the same moment) returns the run the first one
    started.
    """
    claim = None
    if request_id:
        cfg.check()  # bad settings are refused even when the id was seen before
        claim = claims.Request(cfg.runs_dir, request_id)
        if first := claim.take():
            return Run(first)  # started (or being started) by the first call: never a second supervisor
    try:
        folder = prepare(cfg, request_id, resume, owner, pool, node)
    except BaseException:
        if claim:
            claim.release()
        raise
    if claim:
        claim.name(folder.path)
    me = str(folder.path.resolve())
    try:
        if slurm is not None:
            submit(folder, cfg, slurm, procs.package_env())
            return Run(folder.path)
        if pool is not None:  # its supervisor is the pool's, there already: named, then handed the run
            store.write_json(folder.file("launch.json"), {**folder.launch_info(), "supervisor": supervisor_of(pool)})
            hand(pool, folder.path.resolve())
            return Run(folder.path)
        child = procs.spawn(supervisor_argv(me), log=folder.file("supervisor.log"),
                            env={**worker_env(cfg, node=node), procs.OWNER_ENV: me}, detached=True)
        store.write_json(folder.file("launch.json"),
                         {**folder.launch_info(), "supervisor": procs.identity(child.pid)})
    except BaseException as e:  # this process owns the starting run: it must not stay starting
        status_file.record(folder.path, RunStatus.FAILED, step=None, error=(
            str(e) if slurm is not None or pool is not None else f"the supervisor could not be started: {e!r}"))
        raise
    return Run(folder.path)


class Batch:
    """Runs that one process starts one after another (a sweep, a comparison, a headroom
    measurement), each an ordinary run (``start``) but on warm ranks (``commlab.engine.pool``):
    the pool for its world size and backend is started at the first run that needs it and again
    after a run that ended it (a failure, a stall, a Stop); one pool at a time, so that idle ranks
    never hold memory beside a run's.  Every run dies with this process (``owner``), as its pool
    does.  ``warm`` False starts every run cold (one run gains nothing from a pool).  ``folder``
    keeps the pools' folders (a sweep's); by default a folder under the runs folder, removed by
    ``close``.  ``slurm``: every run a Slurm job of its own (``commlab.engine.slurm``), cold.  A
    context manager: ``close`` ends the pool and waits for it."""

    def __init__(self, owner: str, folder: str | os.PathLike | None = None, warm: bool = True,
                 slurm: SlurmJob | None = None):
        self.owner, self.folder, self.warm, self.slurm = owner, folder, warm and slurm is None, slurm
        self.pool: Pool | None = None
        self._made: Path | None = None  # a folder of its own, removed by close

    def start(self, cfg: RunConfig, request_id: str | None = None) -> Run:
        pool = self._pool(cfg) if self.warm else None
        return start(cfg, request_id=request_id, owner=self.owner, pool=pool.path if pool else None,
                     slurm=self.slurm)

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


def open_run(path: str | os.PathLike) -> Run:
    r = Run(path)
    if not r.exists():
        raise FileNotFoundError(f"{path} is not a commlab run folder (no config.json)")
    return r


def list_runs(runs_dir: str | os.PathLike | None = None) -> list[Run]:
    return [Run(f.path) for f in run_folder.list_runs(runs_dir or default_runs_dir())]


def stop(folder: run_folder.RunFolder, grace_s: float = 5.0) -> str:
    """Stop a run and every process it started, starting, running or orphaned; returns the status
    it ends with.  Only processes proven to be the run's are signalled (``procs.belonging``): a
    forged or stale supervisor.json makes it kill nothing else."""
    launch = folder.launch_info()
    pool = launch.get("pool")
    if job := slurm_job_of(folder):
        request_stop(folder.path)  # every node's supervisor ends its agent; then Slurm ends the job
        cancel(job)
        procs.wait_until(lambda: folder.status() not in store.GOING, grace_s + STOP_GRACE_S)
    elif launch.get("nodes"):
        # Every node's supervisor ends its own agent on the request; a PID is local, the folder shared.
        whole = Path(launch.get("run_dir") or folder.path)
        request_stop(whole)
        node0 = Run(whole)
        procs.wait_until(lambda: node0.status() not in store.GOING and folder.status() not in store.GOING,
                         grace_s + STOP_GRACE_S)
    elif pool and folder.status() in store.GOING:
        # Its supervisor is the pool's, which goes on to the next run: a run not taken yet is
        # taken back; else the Stop is asked in the folder, and the supervisor is signalled (which
        # ends the pool) only if it does not answer.
        if withdraw(pool, folder.path):
            _record_stopped(folder)
        else:
            request_stop(folder.path)
            procs.wait_until(lambda: folder.status() not in store.GOING, grace_s + STOP_GRACE_S)
    owner = pool or str(folder.path.resolve())  # the folder its supervisor works for
    head = (procs.belonging([folder.supervisor()], owner)  # while starting, the launcher's record of it
            if not pool or folder.status() in store.GOING else [])
    if head:
        # collected first: the workers live in their own sessions
        everyone = [p for p in procs.tree(head[0].pid)[1:] if procs.owned_by(p, owner)]
        procs.terminate(head, grace_s=grace_s + 5)  # the supervisor stops its own tree
        procs.terminate([p for p in everyone if p.is_running()], grace_s=1)
    procs.terminate(folder.processes(), grace_s=1)  # torchrun or workers that outlived it
    if folder.status() in store.STOPPABLE:
        _record_stopped(folder)
    return folder.status()


def _record_stopped(folder: run_folder.RunFolder) -> None:
    status_file.record(folder.path, RunStatus.STOPPED, error="stopped by the user")


def workers_alive(sup: dict) -> list[int]:
    """The run's worker PIDs (from its supervisor.json) that still run those very workers."""
    created = sup.get("worker_create_times", {})
    return [pid for pid in sup.get("worker_pids", []) if procs.alive(pid, created.get(str(pid)))]
