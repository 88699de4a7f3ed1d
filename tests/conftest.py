"""Shared fixtures: real short runs made once per session, and the one rule about processes.

Tests come in two tiers.  ``python -m pytest -m "not slow"`` is the fast one: no test in it starts
a process.  Every test that starts one (ranks, a run, the CLI, a browser, a stand-in child) is
marked ``slow``; a test using the session's real runs below is marked by ``pytest_collection_
modifyitems``.  ``no_process_left_behind`` enforces both: no test may leave a process running,
and a test not marked slow may not start one at all.
"""
from __future__ import annotations

import fcntl
import os
import shutil
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


# The longest tests and groups, longest first (`--durations` of a full run: several minutes down to
# about 30 s each on a loaded 2-core machine), a node id or the start of one.  They run first:
# with `--dist loadgroup` (pyproject.toml) each xdist worker takes the next test or group when it
# is free, so long ones started last cannot leave one worker running alone while the other idles.
LONG_FIRST = [
    "tests/test_notebook_02.py::",
    "tests/test_browser.py::",
    "tests/test_slurm.py::",  # one xdist group (a test Slurm cluster at a time): about 2 minutes
    "tests/test_hostile_ends.py::test_a_killed_slurmctld",  # the Slurm group: about 3 minutes
    "tests/test_lose_nothing.py::test_sweeps_created_at_one_instant_make_one_running_sweep",
    "tests/test_new_launcher.py::",
    "tests/test_pool.py::test_a_run_that_hangs_is_stalled_and_the_next_gets_fresh_ranks",
    "tests/test_warm_like_cold.py::",
    "tests/test_real_link.py::",
    "tests/test_escape.py::",
    "tests/test_faults.py::test_a_rank_killed_is_named_as_the_one_that_failed",
    "tests/test_app_pages.py::test_bandwidth_headroom_button_runs_noop_and_allreduce",
    "tests/test_resume.py::",
    "tests/test_sweep_whatif.py::test_a_resumed_sweep_runs_only_what_is_left",  # its group
    "tests/test_classroom.py::test_every_op_against_numpy",  # its group
    "tests/test_engine.py::test_cli_run_json_three_ranks_batched_bf16",
    "tests/test_app_pages.py::test_classroom_ring_check_and_gradient_averaging_buttons",
    "tests/test_damaged.py::test_every_page_survives_the_damaged_folder",
    "tests/test_damaged.py::test_disk_full_mid_run_ends_it_failed_with_the_reason",
    "tests/test_notebook_01.py::",
    "tests/test_hf_models.py::test_a_hugging_face_model_trains_unwrapped_with_powersgd_on_two_ranks",
    "tests/test_hf_models.py::test_the_trainer_export_puts_the_hook_on_every_bucket_of_a_trainer_run",
    "tests/test_hooks.py::test_powersgd_matches_pytorch_on_one_bucket",  # its group
    "tests/test_engine.py::test_no_step_for_the_stall_timeout_is_stalled",
    "tests/test_engine.py::test_every_hook_and_wrapper_trains_on_gloo_with_several_buckets",
    "tests/test_pages_rule_lowrank.py::test_lowrank_page_numbers_equal_the_run_folder",
    "tests/test_faults.py::test_two_processes_launching_one_request_id_at_once_get_one_run",
    "tests/test_engine.py::test_a_crashing_rank_ends_the_run_and_is_named",
    "tests/test_engine.py::test_the_leak_fixture_fails_an_unmarked_test_that_starts_a_process",
    "tests/test_export_matrix.py::test_every_snippet_runs_as_pasted_under_the_two_node_torchrun_line",
    "tests/test_engine.py::test_stop_leaves_no_process_even_a_worker_ignoring_sigterm",
    "tests/test_faults.py::test_the_json_of_a_diverged_run_is_strict_with_null",
    "tests/test_inputs.py::test_a_sweep_s_runs_stay_on_loopback_with_eth0_in_the_environment",
    "tests/test_engine.py::test_nan_loss_stops_the_run_as_diverged",
    "tests/test_notebook_03.py::",
    "tests/test_faults.py::test_a_killed_supervisor_takes_torchrun_and_every_worker_with_it",
    "tests/test_overlap.py::test_overlap_matches_blocking_bit_for_bit_in_the_same_order_on_every_rank",
    "tests/test_nodes.py::",
]


def _shared_module_fixtures(item) -> list[str]:
    defs = getattr(item, "_fixtureinfo", None)
    return sorted(name for name, fixturedefs in (defs.name2fixturedefs.items() if defs else ())
                  if fixturedefs and fixturedefs[-1].scope == "module")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Marks the tests using the session's real runs slow; puts a module's tests that share a
    module-scoped fixture into one xdist group (one worker makes the fixture once, and runs them
    in file order: test_sweep_whatif's last one resumes the sweep the others read); then moves
    LONG_FIRST to the front, a group where its first listed test is."""
    for item in items:
        if REAL_RUNS & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if _shared_module_fixtures(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))

    def unit(item) -> str:
        return item.nodeid.split("::")[0] if _shared_module_fixtures(item) else item.nodeid

    def rank(nodeid: str) -> int:
        return next((i for i, start in enumerate(LONG_FIRST) if nodeid.startswith(start)), len(LONG_FIRST))

    ranks: dict[str, int] = {}
    for item in items:
        ranks[unit(item)] = min(ranks.get(unit(item), len(LONG_FIRST)), rank(item.nodeid))
    items.sort(key=lambda item: ranks[unit(item)])  # stable: file order within a rank


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
def runs_dir(tmp_path_factory, request):
    """A runs folder holding real short runs, made once: a PowerSGD run with several buckets,
    error measurement and saved gradients, and a plain allreduce baseline.

    The xdist workers share one (the tests only read it; those that change runs copy them): the
    first worker to need it makes it while the others wait, instead of each making the same runs
    on the same 2 cores."""
    if not hasattr(request.config, "workerinput"):  # no xdist: this process is the whole session
        return _make_runs(tmp_path_factory.mktemp("runs"))
    root = tmp_path_factory.getbasetemp().parent / "shared-runs"  # the session's, above each worker's
    made = root.with_name("shared-runs.made")
    with open(root.with_name("shared-runs.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held until the file closes, or this worker exits
        if not made.exists():
            shutil.rmtree(root, ignore_errors=True)  # what a worker whose runs failed left
            _make_runs(root)
            made.touch()
    return root


def _make_runs(root):
    root.mkdir(parents=True, exist_ok=True)
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


@pytest.fixture
def slurm(tmp_path_factory, request):
    """A real one-node Slurm cluster (``tests/slurm_cluster.py``), started for the test and torn
    down after it with every job: skipped without Debian's slurm-wlm and munge, failed under CI.
    ``@pytest.mark.slurm_nodes(2)``: two nodes, each in a network namespace of its own on a veth."""
    from slurm_cluster import SlurmCluster, skip_or_fail

    skip_or_fail()
    marked = request.node.get_closest_marker("slurm_nodes")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), marked.args[0] if marked else 1)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
