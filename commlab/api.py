"""The Python API, for notebooks and scripts.

    from commlab.api import RunConfig, launch, open_run, list_runs
    run = launch(RunConfig(hook="powersgd", steps=100))   # returns at once
    run.wait(); run.metrics()                              # a pandas DataFrame
"""
from __future__ import annotations

from commlab.config import RunConfig
from commlab.engine import launch as _launch
from commlab.engine.launch import Run, list_runs, open_run
from commlab.engine.store import GOING, STOPPABLE

__all__ = ["RunConfig", "Run", "GOING", "STOPPABLE", "launch", "run", "open_run", "list_runs"]


def launch(cfg: RunConfig | None = None, request_id: str | None = None, **overrides) -> Run:
    """Validate and start a run in the background (status ``starting``, then ``running``: both
    in ``GOING``); raises ConfigError before starting anything."""
    cfg = (cfg or RunConfig()).with_overrides(**overrides) if overrides else (cfg or RunConfig())
    return _launch.start(cfg, request_id)


def run(cfg: RunConfig | None = None, timeout: float | None = None, **overrides) -> Run:
    """Launch and wait for the end."""
    r = launch(cfg, **overrides)
    r.wait(timeout)
    return r
