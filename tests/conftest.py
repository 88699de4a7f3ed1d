"""Shared fixtures: real short runs made once per session, and the one rule about processes.

Tests come in two tiers.  ``python -m pytest -m "not slow"`` is the fast one: no test in it starts
a process.  Every test that starts one (ranks, a run, the CLI, a browser, a stand-in child) is
marked ``slow``; a test using the session's real runs below is marked by ``pytest_collection_
modifyitems``.  ``no_process_left_behind`` enforces both: no test may leave a process running,
and a test not marked slow may not start one at all.
"""
from __future__ import annotations

import os
import sys
import time

import psutil
import pytest

from commlab.api import RunConfig, run

pytest_plugins = ["pytester"]  # tests/test_engine.py checks the rule below on a suite of its own
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# `streamlit run app.py` puts app.py's folder on sys.path (pages import lab_widgets from there);
# AppTest does not, so the tests do.
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

REAL_RUNS = {"runs_dir", "powersgd_run", "allreduce_run"}  # the session fixtures below
# How long a slow test's processes may take to end after it returns (a run's supervisor is still
# collecting its workers); the suite that tests this fixture itself needs no such wait.
LEAK_GRACE_S = float(os.environ.get("COMMLAB_TEST_LEAK_GRACE_S", "20"))
# Python's audit events for starting a process (multiprocessing's fork raises os.fork); a start
# that raises none is still caught if its process outlives the test.
STARTS = {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system",
          "os.exec", "pty.spawn"}
_started: list[str] = []
_PID = os.getpid()


def _note_start(event: str, args: tuple) -> None:
    if event in STARTS and os.getpid() == _PID:  # a forked child inherits this hook: not its starts
        argv = args[1] if event == "subprocess.Popen" else args[:1]
        line = argv if isinstance(argv, str) else " ".join(map(str, argv))
        _started.append(f"{event}: {' '.join(line.split())}"[:120])


sys.addaudithook(_note_start)


def _adopt_orphans() -> None:
    """Be the subreaper of every process the tests start (Linux): one orphaned by a launcher that
    died first is re-parented here, not to init, so the leak check below still sees it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


_adopt_orphans()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if REAL_RUNS & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _started.clear()  # before the test's fixtures: what they start counts as the test's


def _leftovers(timeout: float) -> list[psutil.Process]:
    def running():
        kids = []
        for p in psutil.Process().children(recursive=True):
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    kids.append(p)
            except psutil.NoSuchProcess:
                pass
        return kids

    kids = running()
    deadline = time.monotonic() + timeout
    while kids and time.monotonic() < deadline:
        time.sleep(0.2)
        kids = running()
    return kids


@pytest.fixture(autouse=True)
def no_process_left_behind(request):
    yield
    slow = request.node.get_closest_marker("slow") is not None
    kids = _leftovers(LEAK_GRACE_S if slow else 0.0)
    left = []
    for p in kids:
        try:
            left.append(" ".join(p.cmdline()[:6]))
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if not slow and (_started or kids):
        started = "; ".join(dict.fromkeys(_started)) or ", ".join(left)
        pytest.fail(f"this test started a process ({started}) but is not marked slow: mark it "
                    "@pytest.mark.slow (a whole file: pytestmark), so that "
                    "`python -m pytest -m 'not slow'` stays the tier that starts none")
    _reap_adopted()
    if kids:
        pytest.fail(f"processes left behind by this test: {left}")


def _reap_adopted() -> None:
    """Collect the exit of every child that has ended (the orphans adopted above have no Popen
    to wait for them): without this they stay zombies until pytest exits."""
    for p in psutil.Process().children():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(p.pid, os.WNOHANG)
        except (psutil.NoSuchProcess, ChildProcessError):
            pass


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
