"""Owns one run's torchrun process and records how the run ends (or a pool's, and each run it serves).

    python -m commlab.engine.supervisor RUN_DIR            (started detached by ``commlab.engine.launch.start``)
    python -m commlab.engine.supervisor --pool POOL_DIR    (a pool of warm ranks: ``serve_pool``)

It runs exactly the command recorded in launch.json, in the environment ``start`` gave it, writes
supervisor.json and says ``running`` once that command runs.  It ends the run when the user stops
it (SIGTERM), when a rank dies (the others are ended within seconds, and the first rank to fail
is named with its traceback), when no step completes for ``stall_timeout_s`` (status
``stalled``, naming the step and the hook), and when the process it belongs to ends (launch.json's
``owner``: the sweep that started it, killed or crashed).  Whatever goes wrong in the supervisor itself ends the
run too, recorded as ``failed`` with the supervisor's error; and if the supervisor is killed,
torchrun is killed with it (and each worker with torchrun), so no run trains on unsupervised.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import psutil

from commlab.devices import ranks_forkable
from commlab.engine import launchers, pool, procs, run_folder, status_file, store
from commlab.engine.commands import pool_argv
from commlab.engine.launchers.base import Launcher
from commlab.engine.run_state import FINAL, GOING, RunStatus
from commlab.engine.stop_request import stop_request

POLL_S = 0.2
# A run on warm ranks: the pool's next run waits until its supervisor has seen this one done.
POOLED_POLL_S = 0.05
# Listing the process tree reads every process on the machine (2.6 ms of CPU with 137 of them,
# taken from the ranks' cores every poll): once every rank is recorded, the tree is listed this
# seldom, for what the ranks start themselves (a data loader's workers).
RELIST_S = 5.0
# Before the first step the workers import torch and build DDP, which takes minutes on a busy
# machine: a short stall timeout applies from the first step on.
STARTUP_ALLOWANCE_S = 300.0
ENDED_GRACE_S = 2.0  # after a run's ranks have exited, time for torchrun to end by itself
CRASH_GRACE_S = 2.0  # after a rank's error file appears, time for torchrun to end the rest itself
# torchrun's log holds what the workload prints: past LOG_LIMIT it keeps its last LOG_KEEP bytes,
# cut while the run goes and once more as it ends (a workload printing 40 MB made an 80 MB log).
LOG_LIMIT, LOG_KEEP = 16 * 2**20, 4 * 2**20


def supervise(run_dir: Path) -> int:
    """``run_dir``: the run folder; on node K of a run on several nodes, its records there
    (``commlab.engine.launchers.nodes``), whose launch.json names the run folder."""
    folder = run_folder.RunFolder(run_dir)
    stop_requested = []
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.append(time.time()))
    if status_file.said(folder.path).get("status") in FINAL:
        return 0  # stopped while it was starting: run nothing

    def spawn() -> subprocess.Popen:
        return procs.spawn(folder.launch_info()["command"], log=folder.file("launcher.log"),
                           env={**os.environ, procs.TORCHRUN_RECORD_ENV: str(folder.file("torchrun.json"))},
                           die_with_caller=True)

    run = run_folder.RunFolder(folder.launch_info().get("run_dir") or run_dir)
    _supervised(folder, spawn, stop_requested, run=run)
    return 0


def _supervised(folder: run_folder.RunFolder, torchrun: Callable[[], subprocess.Popen], stop_requested: list,
                run: run_folder.RunFolder | None = None, done: Callable[[], bool] | None = None,
                up: Callable[[], None] = lambda: None, ended_badly: Callable[[], None] = lambda: None,
                records: run_folder.RunFolder | None = None) -> bool:
    """One run, supervised: its torchrun (``torchrun()``: spawned for it, or a pool's), ``running``
    once up (then ``up()``), watched until it must end, its ranks ended unless it ended well, and how
    it ended recorded; whether it ended well.  ``done``: the run is over while torchrun goes on (a
    pool's next run); ``ended_badly``: called before the ranks are ended."""
    launcher = launchers.of(folder.launch_info())
    child = watch = None
    try:
        child = torchrun()
        watch = Watch(folder, child, stop_requested, launcher, run, done)
        status_file.record(folder.path, RunStatus.RUNNING)  # up: supervisor.json is written, the command runs
        up()
        procs.wait_until(watch, interval=POLL_S if done is None else POOLED_POLL_S)
        ending = watch.ending
    except Exception as e:  # a run nobody watches must not go on: end it, and say why
        traceback.print_exc()
        ending = {"status": RunStatus.FAILED, "error": f"the supervisor failed, so it ended the run: "
                                                       f"{type(e).__name__}: {e}"}
    ended_well = ending is None and (done() if done else child is not None and child.returncode == 0)
    if not ended_well:
        ended_badly()
    if child is not None and not (ended_well and done):  # a pool's ranks that ended well go on
        _end_all(child, watch.workers if watch and not ended_well else {})
    # what the run's processes started, however it detached (``adopt_orphans``); a pool's torchrun
    # and ranks go on to the next run
    procs.end_adopted(keep=[child.pid] if child is not None else [])
    # what the ranks printed last, past the limit, was never cut while the run went
    store.keep_tail((records or folder).file("launcher.log"), LOG_LIMIT, LOG_KEEP)
    _record_end(folder, ending, child.returncode if child else None, launcher, run,
                started=bool(watch and watch.workers), records=records)
    return ended_well


def serve_pool(pool_dir: Path) -> int:
    """A pool of warm ranks (``commlab.engine.pool``): start its torchrun, then supervise each run
    handed to it, one at a time, as ``supervise`` does a cold run's, until the pool is closed (the
    ranks leave), a run does not end well (the ranks are ended inside it), or the process the pool
    dies with has ended.  A run handed but never taken ends as stopped, named why."""
    record = store.read_json(pool_dir / "pool.json")
    owner, records = record["owner"], run_folder.RunFolder(pool_dir)
    stop_requested = []
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.append(time.time()))
    child = procs.spawn(pool_argv(record["world_size"], pool_dir, fork=ranks_forkable()),
                        log=pool_dir / "launcher.log", die_with_caller=True,
                        env={**os.environ, procs.TORCHRUN_RECORD_ENV: str(records.file("torchrun.json"))})

    def closed() -> bool:
        return bool(stop_requested or child.poll() is not None or (pool_dir / "close").exists()
                    or not procs.alive(owner["pid"], owner["create_time"]))

    try:
        while (got := pool.take(pool_dir / "runs", closed)) is not None:
            if not _serve_one(pool_dir, *got, child, stop_requested, records):
                break
    except Exception:  # as a run's supervisor: the ranks never go on unsupervised
        traceback.print_exc()
    (pool_dir / pool.ENDED).touch()  # before the ranks' end: no run is handed to a pool that ends
    if not (pool_dir / "close").exists() or not procs.wait_until(lambda: child.poll() is not None, 60):
        _end_all(child, {})
    child.wait(timeout=10)
    store.keep_tail(pool_dir / "launcher.log", LOG_LIMIT, LOG_KEEP)
    for _, run_dir in iter(lambda: pool.take(pool_dir / "runs", lambda: True), None):
        folder = run_folder.RunFolder(run_dir)
        if folder.status() in GOING:
            status_file.record(folder.path, RunStatus.STOPPED, ended_at=time.time(),
                               error="its pool of warm ranks ended before the run started")
    return 0


def _serve_one(pool_dir: Path, name: str, run_dir: str, child: subprocess.Popen, stop_requested: list,
               records: run_folder.RunFolder) -> bool:
    """One run on the pool's ranks, supervised; whether the ranks are ready for the next."""
    done = pool_dir / "done" / name
    return _supervised(run_folder.RunFolder(run_dir), lambda: child, stop_requested, done=done.exists,
                       up=lambda: store.write_json(pool_dir / "queue" / name, {"run_dir": run_dir}),
                       ended_badly=(pool_dir / pool.ENDED).touch, records=records)


def _record_end(folder: run_folder.RunFolder, ending: dict | None, returncode: int | None,
                launcher: Launcher | None = None, run: run_folder.RunFolder | None = None, started: bool = True,
                records: run_folder.RunFolder | None = None) -> None:
    """How the run ended, into status.json: ``ending`` if one was decided, else what the workers
    left (``status_file`` keeps rank 0's own end: a Stop that came after the last step, its
    checkpoint written, does not make a finished run a stopped one).  Node K of a run on
    several nodes (``run`` the run folder, ``folder`` its records) whose agent ended well records
    the run's end; a node whose agent never started ranks names the nodes that never joined.
    ``records``: where torchrun's record and log are, when not ``folder`` (a pool's)."""
    run = run or folder
    if ending is None and returncode == 0 and run.path != folder.path:
        whole = run.status_record()
        ending = {"status": whole["status"] if whole["status"] in FINAL else RunStatus.FINISHED,
                  "error": whole.get("error")}
    if ending is None and not started and launcher is not None:
        ending = launcher.never_started(run.path)
    try:
        ending = {"step": _last_step(run), **(ending or _failure(run, returncode, records or folder))}
    except Exception as e:  # the folder cannot tell more: record what is known
        ending = ending or {"status": RunStatus.FAILED, "error": f"the workers exited with code "
                                                                 f"{returncode}; reading why failed: {e!r}"}
    status_file.record(folder.path, **ending, ended_at=time.time())


class Watch:
    """One look at the run per call: records new workers in supervisor.json, and returns True once
    the run must end (torchrun exited, ``done()`` says the run is, or ``ending`` was set: Stop, a
    stall, a crash).  ``child``: torchrun, whose children the ranks are (on warm ranks, a pool's:
    ``done`` is given, and the run's processes are the ones they fork for it)."""

    def __init__(self, folder: run_folder.RunFolder, child: subprocess.Popen, stop_requested: list,
                 launcher: Launcher, run: run_folder.RunFolder | None = None,
                 done: Callable[[], bool] | None = None):
        self.folder, self.child, self.stop_requested, self.done = folder, child, stop_requested, done
        self.launcher, self.run = launcher, run or folder  # how it runs; the run folder (node K's: the run's)
        torchrun = procs.identity(child.pid)
        self.me = {**procs.identity(os.getpid()), "torchrun_pid": torchrun["pid"],
                   "torchrun_create_time": torchrun["create_time"], "up_at": time.time()}
        self.cfg = folder.config()
        self.owner = folder.launch_info().get("owner")  # a process the run must not outlive
        self.workers: dict[int, float] = {}  # pid -> create time, so a reused PID is never taken for one
        self.last_progress, self.last_size, self.crash_seen = time.time(), 0, None
        self.ranks_ended_at: float | None = None
        self.next_listing = 0.0
        self.ending: dict | None = None
        self._record()

    def _record(self) -> None:
        store.write_json(self.folder.file("supervisor.json"), {
            **self.me, "worker_pids": sorted(self.workers),
            "worker_create_times": {str(k): v for k, v in self.workers.items()}})

    def _ranks_ended(self, now: float) -> bool:
        """Whether a cold run's end is recorded and its ranks (torchrun's children) have exited,
        for ENDED_GRACE_S: torchrun waits for every process that holds a rank's end of its pipes,
        a process the workload started and left running among them, which is the run's to end,
        not to wait for."""
        if self.done is not None or self.run.status_record().get("status") not in store.FINAL:
            return False
        with contextlib.suppress(psutil.Error):
            if any(p.status() != psutil.STATUS_ZOMBIE for p in psutil.Process(self.child.pid).children()):
                self.ranks_ended_at = None
                return False
        self.ranks_ended_at = self.ranks_ended_at or now
        return now - self.ranks_ended_at > ENDED_GRACE_S

    def _past_join_deadline(self, now: float) -> bool:
        """Whether the launcher's bound for the ranks to start has passed, counted from torchrun's
        imports done (``torchrun.json``'s up_at)."""
        if (deadline := self.launcher.join_deadline_s()) is None:
            return False
        up_at = store.read_json(self.folder.file("torchrun.json"), {}).get("up_at")
        return isinstance(up_at, (int, float)) and now - up_at > deadline

    def _processes(self) -> list[psutil.Process]:
        """The run's processes: torchrun's descendants; on a pool, less the pool's ranks
        (torchrun's children), which fork each run's processes and are none of them."""
        everyone = procs.tree(self.child.pid)[1:]
        if self.done is None:
            return everyone
        with contextlib.suppress(psutil.Error):
            ranks = {p.pid for p in psutil.Process(self.child.pid).children()}
            return [p for p in everyone if p.pid not in ranks]
        return []

    def __call__(self) -> bool:
        if self.child.poll() is not None or (self.done is not None and self.done()):
            return True
        now = time.time()
        if self._ranks_ended(now):
            return True
        if len(self.workers) < self.cfg.world_size or now >= self.next_listing:
            known = {p.pid: p.create_time() for p in self._processes()}
            if known.keys() - self.workers.keys():
                self.workers |= known
                self._record()
            if len(self.workers) >= self.cfg.world_size:
                self.next_listing = now + RELIST_S
            store.keep_tail(self.folder.file("launcher.log"), LOG_LIMIT, LOG_KEEP)
        metrics = self.run.file("metrics.jsonl")
        size = metrics.stat().st_size if metrics.exists() else 0
        if size != self.last_size:
            self.last_size, self.last_progress = size, now
        cfg = self.cfg
        if self.stop_requested:
            self.ending = self.launcher.terminated(self.run.path)  # a Stop, or (a Slurm job's) Slurm's end
        elif asked := stop_request(self.run.path):  # a Stop pressed on any node, or on a pool's run
            self.ending = {"status": RunStatus.STOPPED, "error": f"{asked.get('error')} (on {asked.get('host')})"}
        elif elsewhere := self.launcher.ended_elsewhere(self.run.path):
            self.ending = elsewhere  # another node's bad end
        elif (self.owner and not procs.elsewhere(self.owner)  # else the Slurm follower watches it
              and not procs.alive(self.owner["pid"], self.owner["create_time"])):
            self.ending = {"status": RunStatus.STOPPED, "error": (
                f"its {self.owner['what']} ended (process {self.owner['pid']}), so the run was "
                "stopped with it")}
        elif not self.workers and self._past_join_deadline(now):
            self.ending = self.launcher.never_started(self.run.path) or {  # the nodes did not meet in time
                "status": RunStatus.FAILED, "error": f"the ranks did not start within {self.launcher.join_deadline_s():g} s"}
        elif now - self.last_progress > (cfg.stall_timeout_s if self.last_size else
                                         max(cfg.stall_timeout_s, STARTUP_ALLOWANCE_S)):
            self.ending = _stalled(self.run, cfg, now - self.last_progress)
        elif self.crash_seen is None and any(self.run.path.glob("rank*.error.json")):
            self.crash_seen = now
        elif self.crash_seen is not None and now - self.crash_seen > CRASH_GRACE_S:
            self.ending = {}  # torchrun was slow to end the others: do it, then read the tracebacks
        return self.ending is not None


def _end_all(child: subprocess.Popen, workers: dict[int, float]) -> None:
    mine = [pid for pid, created in workers.items() if procs.alive(pid, created)]
    everyone = procs.tree(child.pid) + [p for pid in mine for p in procs.tree(pid)]
    procs.terminate({p.pid: p for p in everyone}.values(), grace_s=3.0)
    child.wait(timeout=10)


def _last_step(folder: run_folder.RunFolder) -> int | None:
    rows = folder.metrics_records()
    return rows[-1]["step"] if rows else None


def _stalled(folder: run_folder.RunFolder, cfg, idle_s: float) -> dict:
    launch = folder.launch_info()
    step = _last_step(folder)
    where = "before the first step" if step is None else f"after step {step}"
    hook = f"{cfg.label()} ({launch.get('hook_impl')} implementation)"
    msg = f"no step completed for {idle_s:.0f} s {where}; hook {hook}."
    if launch.get("warning"):
        msg += " " + launch["warning"]
    return {"status": RunStatus.STALLED, "step": step, "error": msg}


def _failure(folder: run_folder.RunFolder, returncode: int | None, records: run_folder.RunFolder | None = None) -> dict:
    """Who failed first.  A rank whose error is its own (no rank gone yet when it failed) comes
    first; a rank that failed because a peer was gone names that peer; with no report at all
    (ranks killed, none of them could write one), torchrun's record of the ranks it saw end
    (``records``: where this node's torchrun wrote, when not the run folder)."""
    records = records or folder
    reports = sorted((store.read_json(p, {}) for p in folder.path.glob("rank*.error.json")),
                     key=lambda r: r.get("time", 0))
    own = [r for r in reports if not r.get("ranks_gone")]
    if own or reports:
        first = (own or reports)[0]
        tail = "\n".join(first.get("traceback", "").strip().splitlines()[-12:])
        if own:
            return {"status": RunStatus.FAILED, "failed_rank": first.get("rank"), "traceback": tail,
                    "error": f"rank {first.get('rank')} failed: {first.get('error')}"}
        gone = first["ranks_gone"][0]
        return {"status": RunStatus.FAILED, "failed_rank": gone, "traceback": tail,
                "error": f"rank {gone} ended without an error report (killed, or it crashed "
                         f"outside Python); rank {first.get('rank')} then failed: {first.get('error')}"}
    # torchrun stamps a failure to the second, and ends the survivors of a failed rank with
    # SIGTERM: within one second, a rank killed otherwise (SIGKILL, a crash) failed first, then any
    # signal before an exit code.
    seen = sorted(store.read_json(records.file("torchrun.json"), {}).get("failures", []),
                  key=lambda f: (f.get("time", 0), f.get("signal") == "SIGTERM", f.get("exitcode", 0) >= 0))
    if seen:
        first = seen[0]
        how = f"signal {first['signal']}" if first.get("exitcode", 0) < 0 else f"code {first.get('exitcode')}"
        return {"status": RunStatus.FAILED, "failed_rank": first.get("rank"),
                "error": f"rank {first.get('rank')} ended by {how} without an error report",
                "traceback": _tail(records.file("launcher.log"), 25)}
    return {"status": RunStatus.FAILED, "failed_rank": None,
            "error": f"the workers exited with code {returncode} without an error report",
            "traceback": _tail(records.file("launcher.log"), 25)}


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


if __name__ == "__main__":
    # A run owns everything its ranks start: what detaches (a double fork, a session of its own, an
    # environment of its own) is adopted here, not by init, and ended with the run.
    procs.adopt_orphans()
    raise SystemExit(serve_pool(Path(sys.argv[2])) if sys.argv[1] == "--pool" else supervise(Path(sys.argv[1])))
