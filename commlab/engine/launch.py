"""Starting and stopping runs.

``torchrun_command`` is pure and tested on its own, as Accelerate builds its launch command;
``start`` is the one place that spawns a run: it writes the run folder's first files and starts a
detached supervisor (``commlab.engine.supervisor``), which owns torchrun and records how the run ends.
Because the supervisor is detached, a run outlives the app or shell that launched it, and any
later process can stop it through the PID recorded in the folder.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from commlab.config import RunConfig, default_runs_dir
from commlab.devices import gpu_count
from commlab.engine import store


def resolve_backend(cfg: RunConfig, gpus: int | None = None) -> tuple[str, str]:
    """(backend, why) for this machine."""
    gpus = gpu_count() if gpus is None else gpus
    if cfg.backend != "auto":
        return cfg.backend, f"backend {cfg.backend} was asked for"
    if gpus >= cfg.world_size:
        return "nccl", f"auto: {gpus} CUDA GPU(s) seen, enough for {cfg.world_size} rank(s), so NCCL"
    if gpus:
        return "gloo", (f"auto: {gpus} CUDA GPU(s) seen, fewer than {cfg.world_size} ranks, so Gloo "
                        "on the CPU")
    return "gloo", "auto: no CUDA GPU seen, so Gloo on the CPU"


def torchrun_command(cfg: RunConfig, run_dir: str | os.PathLike, python: str = sys.executable) -> list[str]:
    """The exact argv that runs the workers: torchrun (its stores kept on loopback, see
    ``commlab.engine.torchrun``), one node, rendezvous at 127.0.0.1 on a free port, no restarts."""
    return [python, "-m", "commlab.engine.torchrun",
            "--nnodes", "1", "--nproc-per-node", str(cfg.world_size),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1",
            "--max-restarts", "0", "--monitor-interval", "0.5",
            "-m", "commlab.engine.worker", str(run_dir)]


def worker_env(cfg: RunConfig, base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    # The package and a user's workload module must import in the workers as they do here.
    roots = [str(Path(__file__).resolve().parent.parent), os.getcwd()]
    env["PYTHONPATH"] = os.pathsep.join(roots + [p for p in [env.get("PYTHONPATH")] if p])
    # Share the cores out instead of letting each rank start a thread per core.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.world_size)))
    env["MASTER_ADDR"] = "127.0.0.1"
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def prepare(cfg: RunConfig, request_id: str | None = None) -> store.RunFolder:
    """Validate, then create the run folder with config.json and launch.json. Raises ConfigError."""
    from commlab.hooks import registry

    cfg.check()
    backend, why = resolve_backend(cfg)
    impl, impl_reason = registry.plan(cfg, backend)
    run_dir = store.new_run_dir(cfg.runs_dir, cfg.label())
    store.write_json(run_dir / "config.json", cfg.to_dict())
    store.write_json(run_dir / "launch.json", {
        "backend": backend, "backend_reason": why, "hook_impl": impl, "hook_reason": impl_reason,
        "warning": registry.stock_warning(cfg, backend), "request_id": request_id,
        "command": torchrun_command(cfg, run_dir.resolve()), "created_at": time.time()})
    store.write_json(run_dir / "status.json", {"status": "running", "step": None})
    return store.RunFolder(run_dir)


class Run(store.RunFolder):
    """A run folder plus control: wait for it, stop it, ask whether it still goes."""

    def is_running(self) -> bool:
        return self.status() == "running"

    def wait(self, timeout: float | None = None, poll_s: float = 0.2) -> str:
        """Block until the run ends (or ``timeout`` seconds pass); returns its status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_running():
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(poll_s)
        self._wait_for_supervisor()
        return self.status()

    def _wait_for_supervisor(self, timeout: float = 120) -> None:
        # The worker writes "finished" a moment before its processes are gone (longer on a busy
        # machine); callers that go on to count processes, or start the next run (whose step
        # times the leftovers would spoil), want them gone.
        from commlab.engine.procs import alive

        sup = store.read_json(self.file("supervisor.json"), {})
        deadline = time.monotonic() + timeout
        while alive(sup.get("pid"), sup.get("create_time")) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> str:
        return stop(self)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, status={self.status()!r})"


def start(cfg: RunConfig, request_id: str | None = None) -> Run:
    """Start a run in the background and return its folder at once.

    ``request_id`` makes starting idempotent: a second call with the same id (a double click,
    a second browser tab) returns the run the first one started.
    """
    if request_id:
        cfg.check()  # bad settings are refused even when the id was seen before
        for run in store.list_runs(cfg.runs_dir):
            if run.launch_info().get("request_id") == request_id:
                return Run(run.path)  # started (or being started) by the first call: never a second supervisor
    folder = prepare(cfg, request_id)
    log = open(folder.file("supervisor.log"), "ab")
    subprocess.Popen([sys.executable, "-m", "commlab.engine.supervisor", str(folder.path.resolve())],
                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                     env=worker_env(cfg), start_new_session=True, close_fds=True)
    log.close()
    _wait_for(lambda: folder.file("supervisor.json").exists(), timeout=15)
    return Run(folder.path)


def open_run(path: str | os.PathLike) -> Run:
    r = Run(path)
    if not r.exists():
        raise FileNotFoundError(f"{path} is not a commlab run folder (no config.json)")
    return r


def list_runs(runs_dir: str | os.PathLike | None = None) -> list[Run]:
    return [Run(f.path) for f in store.list_runs(runs_dir or default_runs_dir())]


def stop(folder: store.RunFolder, grace_s: float = 5.0) -> str:
    """Stop a run and every process it started; returns the status it ends with."""
    from commlab.engine import procs

    sup = store.read_json(folder.file("supervisor.json"), {})
    pid = sup.get("pid")
    if procs.alive(pid, sup.get("create_time")):
        everyone = procs.tree(pid)  # collected first: workers live in their own sessions
        procs.terminate(everyone[:1], grace_s=grace_s + 5)  # the supervisor stops its own tree
        procs.terminate([p for p in everyone[1:] if p.is_running()], grace_s=1)
    for pid in workers_alive(sup):
        procs.kill_tree(pid, grace_s=1)
    if folder.status() in ("running", "lost"):
        store.write_json(folder.file("status.json"), {
            **folder.status_record(), "status": "stopped", "error": "stopped by the user"})
    return folder.status()


def workers_alive(sup: dict) -> list[int]:
    """The run's worker PIDs (from its supervisor.json) that still run those very workers."""
    from commlab.engine import procs

    created = sup.get("worker_create_times", {})
    return [pid for pid in sup.get("worker_pids", []) if procs.alive(pid, created.get(str(pid)))]


def _wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
