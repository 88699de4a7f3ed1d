"""Owns one run's torchrun process and records how the run ends.

    python -m commlab.engine.supervisor RUN_DIR     (started detached by ``commlab.engine.launch.start``)

It ends the run when the user stops it (SIGTERM), when a rank dies (the others are ended within
seconds, and the first rank to fail is named with its traceback), and when no step completes
for ``stall_timeout_s`` (status ``stalled``, naming the step and the hook).
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from commlab.engine import procs, store
from commlab.engine.launch import torchrun_command, worker_env

POLL_S = 0.2
# Before the first step the workers import torch and build DDP, which takes minutes on a busy
# machine: a short stall timeout applies from the first step on.
STARTUP_ALLOWANCE_S = 300.0
CRASH_GRACE_S = 2.0  # after a rank's error file appears, time for torchrun to end the rest itself


def supervise(run_dir: Path) -> int:
    folder = store.RunFolder(run_dir)
    cfg = folder.config()
    stop_requested = []
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.append(time.time()))

    log = open(folder.file("launcher.log"), "ab")
    child = subprocess.Popen(torchrun_command(cfg, run_dir), stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, env=worker_env(cfg))
    me = psutil.Process()
    store.write_json(folder.file("supervisor.json"), {
        "pid": me.pid, "create_time": me.create_time(), "torchrun_pid": child.pid, "worker_pids": [],
        "worker_create_times": {}})

    metrics = folder.file("metrics.jsonl")
    last_progress, last_size, crash_seen = time.time(), 0, None
    workers: dict[int, float] = {}  # pid -> create time, so that a reused PID is never taken for one
    ending = None
    while child.poll() is None:
        time.sleep(POLL_S)
        now = time.time()
        known = {p.pid: p.create_time() for p in procs.tree(child.pid)[1:]}
        if known.keys() - workers.keys():
            workers |= known
            store.write_json(folder.file("supervisor.json"), {
                "pid": me.pid, "create_time": me.create_time(), "torchrun_pid": child.pid,
                "worker_pids": sorted(workers), "worker_create_times": {str(k): v for k, v in workers.items()}})
        size = metrics.stat().st_size if metrics.exists() else 0
        if size != last_size:
            last_size, last_progress = size, now
        if stop_requested:
            ending = {"status": "stopped", "error": "stopped by the user"}
        elif now - last_progress > (cfg.stall_timeout_s if last_size else
                                    max(cfg.stall_timeout_s, STARTUP_ALLOWANCE_S)):
            ending = _stalled(folder, cfg, now - last_progress)
        elif crash_seen is None and any(run_dir.glob("rank*.error.json")):
            crash_seen = now
        elif crash_seen is not None and now - crash_seen > CRASH_GRACE_S:
            ending = {}  # torchrun was slow to end the others: do it, then read the tracebacks
        if ending is not None:
            break
    _end_all(child, workers)
    log.close()

    final = folder.status_record()
    if final.get("status") in ("finished", "diverged") and not ending:
        return 0
    if not ending:
        ending = _failure(folder, child.returncode)
    store.write_json(folder.file("status.json"), {**final, **ending, "ended_at": time.time()})
    return 0


def _end_all(child: subprocess.Popen, workers: dict[int, float]) -> None:
    mine = [pid for pid, created in workers.items() if procs.alive(pid, created)]
    everyone = procs.tree(child.pid) + [p for pid in mine for p in procs.tree(pid)]
    procs.terminate({p.pid: p for p in everyone}.values(), grace_s=3.0)
    child.wait(timeout=10)


def _last_step(folder: store.RunFolder) -> int | None:
    rows = folder.metrics_records()
    return rows[-1]["step"] if rows else None


def _stalled(folder: store.RunFolder, cfg, idle_s: float) -> dict:
    launch = folder.launch_info()
    step = _last_step(folder)
    where = "before the first step" if step is None else f"after step {step}"
    hook = f"{cfg.label()} ({launch.get('hook_impl')} implementation)"
    msg = f"no step completed for {idle_s:.0f} s {where}; hook {hook}."
    if launch.get("warning"):
        msg += " " + launch["warning"]
    return {"status": "stalled", "step": step, "error": msg}


def _failure(folder: store.RunFolder, returncode: int | None) -> dict:
    reports = sorted((store.read_json(p, {}) for p in folder.path.glob("rank*.error.json")),
                     key=lambda r: r.get("time", 0))
    if reports:
        first = reports[0]
        tail = "\n".join(first.get("traceback", "").strip().splitlines()[-12:])
        return {"status": "failed", "failed_rank": first.get("rank"), "step": _last_step(folder),
                "error": f"rank {first.get('rank')} failed: {first.get('error')}", "traceback": tail}
    log_tail = _tail(folder.file("launcher.log"), 25)
    return {"status": "failed", "step": _last_step(folder), "failed_rank": None,
            "error": f"the workers exited with code {returncode} without an error report",
            "traceback": log_tail}


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


if __name__ == "__main__":
    raise SystemExit(supervise(Path(sys.argv[1])))
