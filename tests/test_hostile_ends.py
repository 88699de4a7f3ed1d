"""Hostile ground, the second half (issue 40, items 1, 2, 8, 9 and 10): ids that reach the lab's own
folders or another run, a log past its bound at the run's end, nodes that cannot meet, and Slurm's
word on a job.

Each fault is made for real: a 40 MB print, a port another process holds, a host name that does
not resolve (``nonexistent.invalid``), a one-node run whose id node 1 is given, a sweep folder.
"""
from __future__ import annotations

import pytest

from commlab.config import RunConfig
from commlab.engine import launch, supervisor
from tests import misbehaving_workloads

RUN_TIMEOUT_S = 300


# ---------------------------------------------------------------------------- item 8: the log's bound at the end
@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_a_workload_printing_40_mb_leaves_a_log_within_its_bound(tmp_path):
    """40 MB printed in the last steps: the log was cut only while the run went (every few
    seconds), so the run's end left 42-84 MB of it."""
    cfg = RunConfig(workload="tests.misbehaving_workloads:loud", steps=misbehaving_workloads.LOUD_STEP + 1,
                    runs_dir=str(tmp_path))
    run = launch.start(cfg)
    assert run.wait(RUN_TIMEOUT_S) == "finished", run.status_record()
    log = run.file("launcher.log")
    size = log.stat().st_size
    assert size <= supervisor.LOG_LIMIT, f"{size:,} bytes"
    assert log.read_text(errors="replace").startswith("[commlab: the first ")
    print(f"40 MB printed: launcher.log {size:,} bytes once the run ended")
