"""A run owns everything its ranks start, and a workload's check everything the person's code starts:
a process in a session of its own with a clean environment, and one left by a double fork (adopted
by init otherwise), end with the check, with a cold run and with a run on warm ranks
(``procs.adopt_orphans``: the supervisor and the check's parent are the kernel's subreapers)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from commlab.config import RunConfig
from commlab.engine import procs, workload_probe
from tests.misbehaving_workloads import ESCAPED_ENV

pytestmark = pytest.mark.slow  # a check's child, and runs of real ranks

ESCAPING = "tests.misbehaving_workloads:escaping"


@pytest.fixture
def escaped(tmp_path, monkeypatch) -> Path:
    """The file the escaping workload notes its processes in (every process it starts appends)."""
    path = tmp_path / "escaped.txt"
    path.touch()
    monkeypatch.setenv(ESCAPED_ENV, str(path))
    return path


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


def _all_gone(pids: list[int], within_s: float = 10) -> bool:
    return procs.wait_until(lambda: not any(procs.alive(pid) for pid in pids), within_s)


def test_what_a_workloads_check_starts_ends_with_it(escaped):
    assert workload_probe.error(RunConfig(workload=ESCAPING)) is None
    pids = _pids(escaped)
    assert len(pids) == 2 and _all_gone(pids), [procs.alive(p) for p in pids]


@pytest.mark.timeout(600)
def test_what_a_runs_ranks_start_ends_with_the_run_cold_and_warm(escaped, tmp_path):
    # Cold: one run of two ranks (and its check); warm: a comparison's two runs on one pool.
    for command in (["run", "--steps", "3"], ["compare", "--hooks", "allreduce,noop", "--steps", "3"]):
        done = subprocess.run([sys.executable, "-m", "commlab", *command, "--workload", ESCAPING,
                               "--eval-every", "0", "--runs-dir", str(tmp_path / command[0]), "--json"],
                              env=procs.package_env(), capture_output=True, text=True, timeout=500)
        assert done.returncode == 0, done.stderr[-3000:]
    pids = _pids(escaped)
    # 2 for each of the 2 ranks of each of the 3 runs, and 2 for each check (one a run or hook)
    assert len(pids) == 3 * 2 * 2 + 3 * 2, pids
    assert _all_gone(pids), [p for p in pids if procs.alive(p)]
    assert os.environ[ESCAPED_ENV] == str(escaped)
