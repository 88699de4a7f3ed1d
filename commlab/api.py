"""The Python API, for notebooks and scripts.

    from commlab.api import RunConfig, launch, open_run, list_runs
    run = launch(RunConfig(hook="powersgd", steps=100))   # returns at once
    run.wait(); run.metrics()                              # a pandas DataFrame
    run.evals()                  # held-out loss (and accuracy or bits per character) by step
    more = resume(run.path, steps=400)   # a new run that continues it from its checkpoint
"""
from __future__ import annotations

from commlab.config import RunConfig
from commlab.engine import launch as _launch
from commlab.engine.launch import Run, list_runs, open_run
from commlab.engine.launchers.choice import chosen
from commlab.engine.run_state import GOING, STOPPABLE, RunStatus

__all__ = ["RunConfig", "Run", "RunStatus", "GOING", "STOPPABLE", "launch", "run", "resume", "open_run",
           "list_runs"]


def launch(cfg: RunConfig | None = None, request_id: str | None = None, resume=None, node=None,
           slurm=None, **overrides) -> Run:
    """Validate and start a run in the background (status ``starting``, then ``running``: both
    in ``GOING``); raises ConfigError before starting anything.  ``resume``: the folder of a
    finished run that this one continues from its checkpoint (see ``resume``).  ``node``: this
    node of a run on several (``commlab.engine.launchers.nodes.Nodes``).  ``slurm``: submit it to
    Slurm (``commlab.engine.launchers.slurm.SlurmJob``)."""
    cfg = (cfg or RunConfig()).with_overrides(**overrides) if overrides else (cfg or RunConfig())
    return _launch.start(cfg, chosen(resume, node, slurm, cfg=cfg), request_id)


def resume(run_dir, request_id: str | None = None, **overrides) -> Run:
    """Continue the finished run in ``run_dir`` from its checkpoint, in a new run folder that
    names it (``Run.resumed_from()``): its settings, with ``overrides`` of those that may change
    (``steps`` counts from its step 0; by default as many steps again).  ConfigError, naming the
    field, before anything starts when it cannot."""
    from commlab.engine.checkpoint import resume_config  # torch: only to open a checkpoint

    return launch(resume_config(run_dir, **overrides), request_id, resume=run_dir)


def run(cfg: RunConfig | None = None, timeout: float | None = None, **overrides) -> Run:
    """Launch and wait for the end."""
    r = launch(cfg, **overrides)
    r.wait(timeout)
    return r
