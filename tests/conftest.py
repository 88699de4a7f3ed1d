"""Shared fixtures: real short runs made once per session, and the rule that no test leaves a
process behind."""
from __future__ import annotations

import os
import sys
import time

import psutil
import pytest

from commlab.api import RunConfig, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# `streamlit run app.py` puts app.py's folder on sys.path (pages import lab_widgets from there);
# AppTest does not, so the tests do.
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _leftovers(timeout: float = 20.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        kids = [p for p in psutil.Process().children(recursive=True) if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
        if not kids or time.monotonic() > deadline:
            return kids
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def no_process_left_behind():
    yield
    kids = _leftovers()
    if kids:
        desc = [" ".join(p.cmdline()[:6]) for p in kids if p.is_running()]
        for p in kids:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        pytest.fail(f"processes left behind by this test: {desc}")


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory):
    """A runs folder holding real short runs, made once: a PowerSGD run with several buckets,
    error measurement and saved gradients, and a plain allreduce baseline."""
    root = tmp_path_factory.mktemp("runs")
    # A generous stall timeout: on a busy 2-core machine a rank can take minutes to import torch.
    common = dict(workload="mlp", steps=24, world_size=2, runs_dir=str(root), bucket_cap_mb=0.05,
                  stall_timeout_s=600)
    powersgd = run(RunConfig(hook="powersgd", start_powerSGD_iter=4, matrix_approximation_rank=2,
                             error_every=4, save_grads_at=[8, 9, 10], **common), timeout=900)
    baseline = run(RunConfig(hook="allreduce", **common), timeout=900)
    assert powersgd.status() == "finished", powersgd.status_record()
    assert baseline.status() == "finished", baseline.status_record()
    return root


@pytest.fixture(scope="session")
def powersgd_run(runs_dir):
    from commlab.api import list_runs

    return next(r for r in list_runs(runs_dir) if r.config_dict()["hook"] == "powersgd")


@pytest.fixture(scope="session")
def allreduce_run(runs_dir):
    from commlab.api import list_runs

    return next(r for r in list_runs(runs_dir) if r.config_dict()["hook"] == "allreduce")
