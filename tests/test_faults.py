"""Faults from outside and inside a run (issue 14): a killed supervisor, a supervisor that fails, a
forged supervisor.json, a killed rank, two launches of one request id, a diverged run's JSON.
Real processes throughout; the times from fault to final status are printed (``-s`` shows them)."""
import json
import os
import subprocess
import sys
import textwrap
import time
import types

import psutil
import pytest

from commlab.api import RunConfig, launch, list_runs, open_run, run
from commlab.commands import emit
from commlab.engine import procs, store
from commlab.engine.launch import prepare

HERE = __import__("pathlib").Path(__file__).parent
LONG = dict(workload="mlp", steps=100_000, world_size=2, stall_timeout_s=600)


def _steps(r, n: int, timeout: float = 240) -> dict:
    """Wait for ``n`` steps; supervisor.json once every worker is in it."""
    assert procs.wait_until(lambda: len(r.metrics_records()) >= n or not r.is_running(), timeout), \
        r.status_record()
    assert r.status() == "running", r.status_record()
    # Forked ranks may take their first steps before the supervisor's next look (0.2 s) lists them.
    listed = lambda: len(store.read_json(r.file("supervisor.json"))["worker_pids"]) == r.config().world_size  # noqa: E731
    assert procs.wait_until(listed, 10), store.read_json(r.file("supervisor.json"))
    return store.read_json(r.file("supervisor.json"))


def _of_run(r) -> list[psutil.Process]:
    """Every live process that works for the run (its folder in the command line or environment),
    found by scanning, not from what the folder says."""
    me = str(r.path.resolve())
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and procs.owned_by(p, me):
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def _rank_of(pid: int) -> int:
    """A rank's process is named for its rank (``worker.become_rank``; a forked rank's environment,
    as /proc shows it, is torchrun's)."""
    from commlab.engine.worker import RANK_NAME

    return int(psutil.Process(pid).name().removeprefix(RANK_NAME))


# ---------------------------------------------------------------------------- item 1: orphaned runs
@pytest.mark.slow
def test_a_killed_supervisor_takes_torchrun_and_every_worker_with_it(tmp_path):
    r = launch(RunConfig(runs_dir=str(tmp_path), **LONG))
    sup = _steps(r, 2)
    assert len(_of_run(r)) == 4  # supervisor, torchrun, two workers
    psutil.Process(sup["pid"]).kill()
    t0 = time.monotonic()
    assert procs.wait_until(lambda: not _of_run(r) and r.status() == "lost", 10), \
        ([p.cmdline()[:4] for p in _of_run(r)], r.status_record())
    took = time.monotonic() - t0
    print(f"\nsupervisor SIGKILLed -> no process left and status lost in {took:.2f} s")
    assert took < 5
    steps = len(r.metrics_records())
    time.sleep(1.5)
    assert len(r.metrics_records()) == steps  # nothing trains on
    assert r.status() == "lost" and not r.is_running() and r.stop() == "stopped"


@pytest.mark.slow
def test_the_supervisor_failing_ends_the_run_and_records_why(tmp_path):
    """supervisor.json becomes unwritable (a folder in its place, as ENOSPC would refuse it) while
    torchrun starts its workers: the supervisor's next rewrite of it raises."""
    r = launch(RunConfig(runs_dir=str(tmp_path), **LONG))
    spawned = r.launch_info()["supervisor"]
    path = r.file("supervisor.json")
    assert procs.wait_until(path.exists, 240)
    assert store.read_json(path)["worker_pids"] == [], "the workers came up before the fault"
    path.unlink()
    path.mkdir()
    t0 = time.monotonic()
    assert procs.wait_until(lambda: not procs.alive(spawned["pid"], spawned["create_time"]), 240)
    assert procs.wait_until(lambda: not _of_run(r), 10), [p.cmdline()[:4] for p in _of_run(r)]
    took = time.monotonic() - t0
    rec = r.status_record()
    print(f"\nsupervisor.json unwritable -> run failed, no process left, {took:.2f} s after the fault "
          "(including torchrun's start)")
    assert rec["status"] == "failed", rec
    assert "the supervisor failed" in rec["error"] and "supervisor.json" in rec["error"], rec
    assert not r.is_running()


@pytest.mark.slow
def test_an_orphaned_run_is_said_so_and_stop_ends_it(tmp_path):
    """The supervisor gone, one of the run's processes alive (as if it escaped the guards)."""
    folder = prepare(RunConfig(runs_dir=str(tmp_path), workload="mlp"))
    me = str(folder.path.resolve())
    gone = subprocess.Popen([sys.executable, "-c", "pass", me])
    dead = procs.identity(gone.pid)
    gone.wait()
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", me])
    alive = procs.identity(worker.pid)
    store.write_json(folder.file("supervisor.json"), {
        **dead, "torchrun_pid": None, "worker_pids": [worker.pid],
        "worker_create_times": {str(worker.pid): alive["create_time"]}})
    r = open_run(folder.path)
    rec = r.status_record()
    assert rec["status"] == "orphaned" and "Stop ends them" in rec["error"], rec
    assert r.is_running()
    assert r.stop() == "stopped"
    assert worker.wait(10) is not None
    assert r.status() == "stopped"


@pytest.mark.slow
def test_a_process_is_known_as_the_runs_the_moment_popen_returns(tmp_path):
    """Popen returns once exec is past its point of no return, but the new command line and
    environment are set a moment later: read in that moment both are empty (1 of 750 reads of a
    fresh ``sleep`` at load 4), and a Stop right after a launch took the run's supervisor for a
    stranger and left it running.  ``owned_by`` waits out that moment: here it is made to last
    three reads, as psutil saw it."""
    me = str(tmp_path.resolve())
    child = subprocess.Popen(["/bin/sleep", "30"], env={procs.OWNER_ENV: me}, start_new_session=True)

    class InExec(psutil.Process):
        reads = 0

        def cmdline(self):
            InExec.reads += 1
            return [] if InExec.reads <= 3 else super().cmdline()

        def environ(self):
            return {} if InExec.reads <= 3 else super().environ()

    try:
        assert procs.owned_by(InExec(child.pid), me) and InExec.reads > 3
        assert not procs.owned_by(psutil.Process(child.pid), me + "-another")
    finally:
        child.kill()
        child.wait()


# ---------------------------------------------------------------------------- item 3: stop trusts nothing
@pytest.mark.slow
def test_stop_kills_nothing_a_forged_supervisor_json_names(tmp_path):
    folder = prepare(RunConfig(runs_dir=str(tmp_path), workload="mlp"))
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        me, parent = procs.identity(os.getpid()), procs.identity(os.getppid())
        forged = [{"pid": 1}, {"pid": 1, "create_time": procs.identity(1)["create_time"]}, me, parent,
                  {"pid": stranger.pid}, procs.identity(stranger.pid)]
        for sup in forged:
            others = [rec for rec in forged if rec is not sup and rec.get("create_time") is not None]
            store.write_json(folder.file("supervisor.json"), {
                **sup, "torchrun_pid": stranger.pid, "torchrun_create_time": forged[-1]["create_time"],
                "worker_pids": [rec["pid"] for rec in others],
                "worker_create_times": {str(rec["pid"]): rec["create_time"] for rec in others}})
            assert open_run(folder.path).stop() == "stopped"
            assert stranger.poll() is None, sup  # not the run's: never signalled
            assert psutil.pid_exists(1) and psutil.Process(os.getppid()).is_running()
            store.write_json(folder.file("status.json"), {"status": "running", "step": None})
    finally:
        stranger.kill()
        stranger.wait()


# ---------------------------------------------------------------------------- item 8: the first rank to die
@pytest.mark.slow
def test_a_rank_killed_is_named_as_the_one_that_failed(tmp_path):
    for attempt in range(3):
        r = launch(RunConfig(runs_dir=str(tmp_path), **LONG))
        sup = _steps(r, 3)
        victim = next(pid for pid in sup["worker_pids"] if _rank_of(pid) == 1)
        psutil.Process(victim).kill()
        t0 = time.monotonic()
        assert r.wait(120) == "failed", r.status_record()
        took = time.monotonic() - t0
        rec = r.status_record()
        print(f"\nattempt {attempt}: rank 1 SIGKILLed -> failed in {took:.2f} s: {rec['error'][:160]}")
        assert rec["failed_rank"] == 1, rec
        assert rec["error"].startswith("rank 1 "), rec
        assert not _of_run(r)


# ---------------------------------------------------------------------------- item 8: one id, one run
RACER = textwrap.dedent("""
    import sys, time
    from commlab.api import RunConfig, launch
    runs_dir, request_id = sys.argv[1], sys.argv[2]
    cfg = RunConfig(runs_dir=runs_dir, workload="mlp", steps=100000).check()
    print("ready", flush=True)
    at = float(sys.stdin.readline())
    time.sleep(max(0.0, at - time.time()))
    print(launch(cfg, request_id=request_id).path, flush=True)
""")


@pytest.mark.slow
def test_two_processes_launching_one_request_id_at_once_get_one_run(tmp_path):
    for attempt in range(3):
        racers = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), f"id-{attempt}"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   cwd=HERE.parent) for _ in range(2)]
        # One moment for both, told once both have imported commlab and checked the settings (a
        # fixed delay from their start would have to allow for the slowest machine).
        assert [p.stdout.readline().strip() for p in racers] == ["ready", "ready"]
        at = time.time() + 0.5
        for p in racers:
            p.stdin.write(f"{at}\n")
            p.stdin.flush()
        paths = {p.communicate(timeout=120)[0].strip() for p in racers}
        assert len(paths) == 1 and "" not in paths, paths
        assert len(list_runs(tmp_path)) == attempt + 1
        assert open_run(paths.pop()).stop() == "stopped"


# ---------------------------------------------------------------------------- item 8: strict JSON
def test_emit_prints_strict_json_with_null_for_what_is_not_finite(capsys):
    emit(types.SimpleNamespace(json=True), {"final_loss": float("nan"), "rows": [float("inf"), 1.5],
                                            "n": {"x": -float("inf")}}, "")
    line = capsys.readouterr().out
    assert json.loads(line, parse_constant=_refuse) == {"final_loss": None, "rows": [None, 1.5],
                                                        "n": {"x": None}}


@pytest.mark.slow
def test_the_json_of_a_diverged_run_is_strict_with_null(tmp_path):
    r = run(RunConfig(workload="tests.misbehaving_workloads:exploding", steps=50, lr=0.01,
                      runs_dir=str(tmp_path), world_size=2), timeout=300)
    assert r.status() == "diverged"
    for argv in (["runs", "--runs-dir", str(tmp_path), "--json"],):
        out = subprocess.run([sys.executable, "-m", "commlab", *argv], capture_output=True, text=True,
                             timeout=120, cwd=HERE.parent).stdout.strip().splitlines()[-1]
        row = json.loads(out, parse_constant=_refuse)["runs"][0]
        assert row["status"] == "diverged" and row["final_loss"] is None, row


def _refuse(constant: str):
    raise ValueError(f"not strict JSON: {constant}")
