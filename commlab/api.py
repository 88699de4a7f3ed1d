"""The Python API, for notebooks and scripts.

    from commlab.api import RunConfig, launch, open_run, list_runs
    run = launch(RunConfig(hook="powersgd", steps=100))   # returns at once
    run.wait(); run.metrics()                              # a pandas DataFrame
"""
from __future__ import annotations

import os
import time

from commlab.config import RunConfig, default_runs_dir
from commlab.engine import launch as _launch
from commlab.engine import store

__all__ = ["RunConfig", "Run", "launch", "run", "open_run", "list_runs"]


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
        return _launch.stop(self)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, status={self.status()!r})"


def launch(cfg: RunConfig | None = None, request_id: str | None = None, **overrides) -> Run:
    """Validate and start a run in the background; raises ConfigError before starting anything."""
    cfg = (cfg or RunConfig()).with_overrides(**overrides) if overrides else (cfg or RunConfig())
    return Run(_launch.start(cfg, request_id).path)


def run(cfg: RunConfig | None = None, timeout: float | None = None, **overrides) -> Run:
    """Launch and wait for the end."""
    r = launch(cfg, **overrides)
    r.wait(timeout)
    return r


def open_run(path: str | os.PathLike) -> Run:
    r = Run(path)
    if not r.exists():
        raise FileNotFoundError(f"{path} is not a commlab run folder (no config.json)")
    return r


def list_runs(runs_dir: str | os.PathLike | None = None) -> list[Run]:
    return [Run(f.path) for f in store.list_runs(runs_dir or default_runs_dir())]
