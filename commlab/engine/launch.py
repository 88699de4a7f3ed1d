"""Starting and stopping runs, whatever the way of running (``commlab.engine.launchers``).

The commands are pure (``commlab.engine.commands``) and tested on their own; ``start`` is the one
place that starts a run: it writes the run folder's first files (status ``starting``, launch.json
with what its launcher records: the exact command, the pool, the node, the job) and hands the run
to its launcher, which starts what runs it (a detached supervisor, a pool's supervisor, sbatch) and
records its PID and create time at once; the supervisor says ``running`` once it is up, and records
how the run ends.  Because the supervisor is detached, a run outlives the app or shell that launched
it, and any later process can stop it through the PIDs recorded in the folder: only processes
proven to be the run's (``procs.belonging``) are ever signalled.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from commlab.config import ConfigError, RunConfig, default_runs_dir
from commlab.devices import pick_backend, ranks_forkable
from commlab.engine import claims, launchers, procs, run_folder, status_file, store
from commlab.engine.commands import LOOPBACK, run_argv
from commlab.engine.launchers.base import Launcher
from commlab.engine.launchers.choice import chosen
from commlab.engine.run_state import GOING, STOPPABLE, RunStatus


def resolve_backend(cfg: RunConfig, gpus: int | None = None) -> tuple[str, str]:
    """(backend, why) for this machine."""
    return pick_backend(cfg.backend, cfg.world_size, gpus)


def torchrun_command(cfg: RunConfig, run_dir: str | os.PathLike, python: str = sys.executable,
                     place=LOOPBACK) -> list[str]:
    """The exact argv that runs a run's workers (recorded in launch.json, run by the supervisor)."""
    return run_argv(cfg.world_size, run_dir, python, place, fork=ranks_forkable())


def prepare(cfg: RunConfig, launcher: Launcher | None = None, request_id: str | None = None) -> run_folder.RunFolder:
    """Validate, then create the run folder (``launcher.make_folder``), status ``starting`` and
    owned by this process until ``start`` hands it to its launcher; config.json, the marker, last.
    The launcher's ``resume``: the folder of a finished run this one continues from its checkpoint
    (``commlab.engine.checkpoint``); its ``owner``: what this process is (``"sweep <id>"``), when
    the run must not outlive it.  Raises ConfigError."""
    from commlab.engine import workload_probe
    from commlab.hooks import registry

    launcher = launcher or chosen(cfg=cfg)
    workload_probe.check(cfg.check())  # a user's workload runs in a child, never here
    resume, owner = launcher.resume, launcher.owner
    if resume is not None:
        from commlab.engine import checkpoint  # torch: only to open a checkpoint's files

        if errors := checkpoint.resume_errors(cfg, resume):
            raise ConfigError(errors)
    backend, why = resolve_backend(cfg)
    impl, impl_reason = registry.plan(cfg, backend)
    if errors := launcher.errors(cfg):
        raise ConfigError(errors)
    run_dir = launcher.make_folder(cfg)
    status_file.record(run_dir, RunStatus.STARTING, step=None)
    store.write_json(run_dir / "launch.json", {
        "backend": backend, "backend_reason": why, "hook_impl": impl, "hook_reason": impl_reason,
        "warning": registry.stock_warning(cfg, backend), "request_id": request_id,
        "resumed_from": str(Path(resume).resolve()) if resume is not None else None,
        "nodes": None, "run_dir": None, "pool": None,  # what the ways other than this machine's fill in
        **launcher.records(cfg, run_dir), "created_at": time.time(),
        "launcher": procs.identity(os.getpid()),
        "owner": {**procs.identity(os.getpid()), "what": owner} if owner else None})
    store.write_json(run_dir / "config.json", cfg.to_dict())
    return run_folder.RunFolder(run_dir)


class Run(run_folder.RunFolder):
    """A run folder plus control: wait for it, stop it, ask whether it still goes."""

    def whole(self) -> Run:
        """The run this folder is part of: itself, or for node K's records of a run on several
        nodes, the run folder (node 0's, where the metrics are)."""
        return Run(self.launch_info().get("run_dir") or self.path)

    def is_running(self) -> bool:
        """Still going: pending (a Slurm job in the queue), starting, running or orphaned."""
        return self.status() in GOING

    def wait(self, timeout: float | None = None, poll_s: float = 0.2, processes: bool = True) -> str:
        """Block until the run ends (or ``timeout`` seconds pass); returns its status.  An
        orphaned run is stopped: with no supervisor, nothing would ever end it or record its end.
        ``processes`` False returns once the end is recorded, while the run's processes exit (a
        second or more: their teardown; the supervisor sees them all gone)."""
        def ended() -> bool:
            status = self.status()
            if status == RunStatus.ORPHANED:
                self.stop()
            return status not in GOING

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


def start(cfg: RunConfig, launcher: Launcher | None = None, request_id: str | None = None) -> Run:
    """Start a run in the background the way ``launcher`` runs it (``commlab.engine.launchers``; by
    default on this machine, under its own supervisor) and return its folder at once, status
    ``starting``.  The run outlives this process, unless the launcher's ``owner`` names what this
    process is (``"sweep <id>"``): then its supervisor stops it once this process has ended.  On
    several nodes the folder returned holds this node's records (``Run.whole`` is the run's).

    ``request_id`` makes starting idempotent: a second call with the same id (a double click,
    a second browser tab, another process at the same moment) returns the run the first one
    started.
    """
    launcher = launcher or chosen(cfg=cfg)
    claim = None
    if request_id:
        cfg.check()  # bad settings are refused even when the id was seen before
        claim = claims.Request(cfg.runs_dir, request_id)
        if first := claim.take():
            return Run(first)  # started (or being started) by the first call: never a second supervisor
    try:
        folder = prepare(cfg, launcher, request_id)
    except BaseException:
        if claim:
            claim.release()
        raise
    if claim:
        claim.name(folder.path)
    try:
        launcher.start(folder, cfg)
    except ConfigError:  # its launcher refused it (sbatch did): nothing was started, so nothing is left
        shutil.rmtree(folder.path, ignore_errors=True)
        if claim:
            claim.release()
        raise
    except BaseException as e:  # this process owns the starting run: it must not stay starting
        status_file.record(folder.path, RunStatus.FAILED, step=None, error=launcher.start_failure(e))
        raise
    return Run(folder.path)


def open_run(path: str | os.PathLike) -> Run:
    r = Run(path)
    if not r.exists():
        raise FileNotFoundError(f"{path} is not a commlab run folder (no config.json)")
    return r


def list_runs(runs_dir: str | os.PathLike | None = None) -> list[Run]:
    return [Run(f.path) for f in run_folder.list_runs(runs_dir or default_runs_dir())]


def stop(folder: run_folder.RunFolder, grace_s: float = 5.0) -> str:
    """Stop a run and every process it started, starting, running or orphaned; returns the status
    it ends with.  Its launcher asks first, its own way (a pool's run is taken back or asked in the
    folder, every node is asked through the folder, Slurm cancels the job); then only processes
    proven to be the run's are signalled (``procs.belonging``): a forged or stale supervisor.json
    makes it kill nothing else."""
    launcher = launchers.of(folder.launch_info())
    launcher.ask_to_stop(folder, grace_s)
    if signalled := launcher.signalled(folder):
        supervisor, owner = signalled  # while starting, the launcher's record of it
        if head := procs.belonging([supervisor], owner):
            # collected first: the workers live in their own sessions
            everyone = [p for p in procs.tree(head[0].pid)[1:] if procs.owned_by(p, owner)]
            procs.terminate(head, grace_s=grace_s + 5)  # the supervisor stops its own tree
            procs.terminate([p for p in everyone if p.is_running()], grace_s=1)
    procs.terminate(folder.processes(), grace_s=1)  # torchrun or workers that outlived it
    if folder.status() in STOPPABLE:
        status_file.record(folder.path, RunStatus.STOPPED, error="stopped by the user")
    return folder.status()


def workers_alive(sup: dict) -> list[int]:
    """The run's worker PIDs (from its supervisor.json) that still run those very workers."""
    created = sup.get("worker_create_times", {})
    return [pid for pid in sup.get("worker_pids", []) if procs.alive(pid, created.get(str(pid)))]
