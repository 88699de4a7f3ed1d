"""Hostile ground, the second half (issue 40, items 1, 2, 8, 9 and 10): ids that reach the lab's own
folders or another run, a log past its bound at the run's end, nodes that cannot meet, and Slurm's
word on a job.

Each fault is made for real: a 40 MB print, a port another process holds, a host name that does
not resolve (``nonexistent.invalid``), a one-node run whose id node 1 is given, a sweep folder.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commlab import cli
from commlab.config import RunConfig
from commlab.engine import launch, store, supervisor
from commlab.ui.runs import delete_run
from tests import misbehaving_workloads

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 300


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_cli(runs: Path, rank: int, endpoint: str, run_id: str, *extra: str) -> list[str]:
    """``commlab run`` for node ``rank`` of 2 on this machine (node 1's agent at 127.0.0.2)."""
    return ["run", "--workload", "mlp", "--world-size", "1", "--steps", "3", "--runs-dir", str(runs),
            "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", endpoint, "--run-id", run_id,
            "--ifname", "lo", "--join-timeout", "8", *(("--local-addr", "127.0.0.2") if rank else ()), *extra]


def _run_cli(argv: list[str], timeout: float = RUN_TIMEOUT_S) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "commlab", *argv], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return done, time.monotonic() - t0


def _a_sweep(runs: Path) -> Path:
    """A sweep's folder as the lab leaves one (its plan and state)."""
    sweep = runs / "sweeps" / "20261205-080000-sweep-0a1b"
    sweep.mkdir(parents=True)
    store.write_json(sweep / "sweep.json", {"spec": {}, "labels": []})
    store.write_json(sweep / "state.json", {"status": "finished", "index": 0, "runs": []})
    return sweep


# ---------------------------------------------------------------------------- item 1: ids that name the lab's folders
@pytest.mark.parametrize("run_id", ["sweeps", ".pools", "..", "a/b"])
def test_a_run_id_naming_the_lab_s_own_folders_is_refused_by_name(tmp_path, capsys, run_id):
    """``--run-id sweeps`` on node 0 wrote the run into runs/sweeps/."""
    sweep = _a_sweep(tmp_path)
    assert cli.main(_node_cli(tmp_path, 0, f"127.0.0.1:{_port()}", run_id)) == 2
    said = capsys.readouterr().err
    assert "run_id" in said and repr(run_id) in said, said
    if run_id == "sweeps":
        assert "names the lab's folder of sweeps" in said, said
    assert sorted(p.name for p in (tmp_path / "sweeps").iterdir()) == [sweep.name]  # nothing written there


def test_deleting_a_run_removes_nothing_but_its_own_folder(tmp_path):
    """A run written into runs/sweeps/ (as ``--run-id sweeps`` did), deleted from the Runs page,
    took every sweep with it."""
    sweep = _a_sweep(tmp_path)
    store.write_json(tmp_path / "sweeps" / "config.json", RunConfig(runs_dir=str(tmp_path)).to_dict())
    store.write_json(tmp_path / "sweeps" / "status.json", {"status": "finished"})
    with pytest.raises(ValueError, match="is the lab's folder of sweeps, not a run's; nothing was deleted"):
        delete_run(tmp_path / "sweeps", str(tmp_path))
    run = tmp_path / "a-run"  # a run folder that holds a sweep's folder of its own
    shutil_copy = run / "inner"
    shutil_copy.mkdir(parents=True)
    for name in ("sweep.json", "state.json"):
        (shutil_copy / name).write_bytes((sweep / name).read_bytes())
    store.write_json(run / "config.json", RunConfig(runs_dir=str(tmp_path)).to_dict())
    store.write_json(run / "status.json", {"status": "finished"})
    with pytest.raises(ValueError, match=r"holds what is not its run's \(inner: another run's or a sweep's\)"):
        delete_run(run, str(tmp_path))
    assert (sweep / "state.json").exists() and (shutil_copy / "sweep.json").exists()
    (run / "nodes" / "1").mkdir(parents=True)  # a run of several nodes: its nodes' records go with it
    store.write_json(run / "nodes" / "1" / "config.json", RunConfig(runs_dir=str(tmp_path)).to_dict())
    for name in ("sweep.json", "state.json"):
        (shutil_copy / name).unlink()
    delete_run(run, str(tmp_path))
    assert not run.exists() and (sweep / "state.json").exists()


# ---------------------------------------------------------------------------- item 2: node 1 in another run's folder
@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_node_1_given_a_one_node_run_s_id_is_refused_before_anything_starts(tmp_path):
    """Node 1 given an existing one-node run's id wrote nodes/1/ into it, and printed "finished: 3
    steps", exit 0, while its own record said failed."""
    one = launch.start(RunConfig(workload="mlp", world_size=1, steps=3, runs_dir=str(tmp_path)))
    assert one.wait(RUN_TIMEOUT_S) == "finished"
    before = sorted(p.name for p in one.path.iterdir())
    done, took = _run_cli(_node_cli(tmp_path, 1, f"127.0.0.1:{_port()}", one.id))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"{one.id!r} is taken: {one.path.resolve()} holds a run on one node" in done.stderr, done.stderr
    assert sorted(p.name for p in one.path.iterdir()) == before  # no nodes/ written into it
    assert json.loads(one.file("status.json").read_text())["status"] == "finished"
    print(f"node 1 given a one-node run's id: refused, exit 2, in {took:.1f} s")


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


# ---------------------------------------------------------------------------- item 9: nodes that cannot meet
@pytest.fixture
def busy_port():
    """A port another process holds: listening, accepting, never answering."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_node_0_on_a_port_another_process_holds_is_refused_naming_it(tmp_path, capsys, busy_port):
    """It said "node 1 did not join within 8 s" while its log said "Address already in use"."""
    t0 = time.monotonic()
    assert cli.main(_node_cli(tmp_path, 0, f"127.0.0.1:{busy_port}", "busy")) == 2
    said = capsys.readouterr().err
    assert f"port {busy_port} on 127.0.0.1 is held by another process (Address already in use)" in said, said
    assert not (tmp_path / "busy").exists()
    print(f"node 0 on a held port: refused in {time.monotonic() - t0:.2f} s")


def test_node_1_given_a_host_that_does_not_resolve_is_refused_naming_it(tmp_path, capsys):
    """It said "node 0 did not join" while its log said "Name or service not known"."""
    t0 = time.monotonic()
    assert cli.main(_node_cli(tmp_path, 1, f"nonexistent.invalid:{_port()}", "unresolved")) == 2
    said = capsys.readouterr().err
    assert "'nonexistent.invalid' does not resolve on this node" in said, said
    print(f"node 1 given nonexistent.invalid: refused in {time.monotonic() - t0:.2f} s")


def _started_past_the_checks(tmp_path: Path, rank: int, endpoint: str, run_id: str):
    """A node whose checks passed and whose fault came after (a port taken, a name gone from the
    resolver meanwhile): its place built as launch.json records one, without the checks."""
    from commlab.engine.launchers.nodes import Nodes, OnNodes

    node = Nodes(2, rank, endpoint, run_id, "lo", "127.0.0.2" if rank else "127.0.0.1", 8.0)
    return launch.start(RunConfig(workload="mlp", world_size=1, steps=3, runs_dir=str(tmp_path)), OnNodes(node))


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("rank, host, said", [
    (0, "127.0.0.1", "port {port} on 127.0.0.1 is held by another process: node 0 could not serve the rendezvous"),
    (1, "nonexistent.invalid", "'nonexistent.invalid' does not resolve on node 1"),
])
def test_a_fault_after_the_checks_is_named_from_torchrun_s_log(tmp_path, busy_port, rank, host, said):
    t0 = time.monotonic()
    run = _started_past_the_checks(tmp_path, rank, f"{host}:{busy_port}", "late")
    assert run.wait(RUN_TIMEOUT_S, processes=False) == "failed"
    took = time.monotonic() - t0
    error = run.status_record()["error"]
    assert said.format(port=busy_port) in error, error
    print(f"node {rank}, {host}:{busy_port} after the checks: {error!r} {took:.1f} s after the start")


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_node_1_at_a_port_that_never_answers_ends_within_its_join_timeout(tmp_path, busy_port):
    """With --join-timeout 8 it took 101 s (here 300 s, the stall timeout before a first step):
    torchrun's client waits without end on an endpoint that accepts and never answers."""
    done, took = _run_cli(_node_cli(tmp_path, 1, f"127.0.0.1:{busy_port}", "unanswered", "--json"))
    assert done.returncode == 1, done.stderr
    said = json.loads(done.stdout)
    assert said["status"] == "failed" and said["error"] == (
        f"node 0 did not join within 8 s: 127.0.0.1:{busy_port} accepts connections but no rendezvous "
        "answered there (another process holds that port, or node 0 has not started)"), said
    up = json.loads((tmp_path / "unanswered" / "nodes" / "1" / "torchrun.json").read_text())["up_at"]
    ended = json.loads((tmp_path / "unanswered" / "nodes" / "1" / "status.json").read_text())["ended_at"]
    assert ended - up < 8 + 5 + 3, (ended - up)  # the join timeout, torchrun's grace, a few polls
    print(f"node 1 at a port that never answers: failed {ended - up:.1f} s after torchrun was up, "
          f"the command returned in {took:.1f} s")


# ---------------------------------------------------------------------------- item 10: Slurm's word on a job
def slurm_test(f):
    """Starts a real one-node Slurm (``tests/slurm_cluster.py``): slow, in the Slurm tests' xdist group."""
    return pytest.mark.slow(pytest.mark.xdist_group("slurm")(f))


def _submitted(slurm, runs: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "commlab", "run", "--launcher", "slurm", "--runs-dir", str(runs),
                             "--json", *flags], env={**slurm.env, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _the_run(runs: Path, timeout: float = RUN_TIMEOUT_S):
    from commlab.engine import procs

    assert procs.wait_until(lambda: launch.list_runs(runs) and launch.list_runs(runs)[0].metrics_records(),
                            timeout, 0.2)
    return launch.list_runs(runs)[0]


@slurm_test
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_a_percent_in_the_runs_folder_s_path_runs_on_slurm(slurm, tmp_path):
    """Every Slurm run failed with "JobLaunchFailure, exit code 0:53" and no output: sbatch expands
    % in --output."""
    runs = tmp_path / "100%j runs"
    cli_run = _submitted(slurm, runs, "--workload", "mlp", "--steps", "3")
    out, err = cli_run.communicate(timeout=RUN_TIMEOUT_S)
    assert cli_run.returncode == 0, (out, err)
    said = json.loads(out)
    assert said["status"] == "finished" and said["steps"] == 3, said
    run = launch.open_run(said["run_dir"])
    job = run.launch_info()["slurm"]["job_id"]
    assert run.file(f"slurm-{job}.out").exists()  # the job's output where the lab reads it


@slurm_test
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_a_killed_slurmctld_leaves_the_run_training_to_its_own_end(slurm, tmp_path):
    """The run was recorded failed ("ended GONE") at +57 s while it kept training, `commlab run`
    exited 1, and the status flipped to finished later."""
    cli_run = _submitted(slurm, tmp_path, "--workload", "tests.misbehaving_workloads:stubborn", "--steps", "300")
    run = _the_run(tmp_path)
    slurm.procs["slurmctld"].kill()
    slurm.procs["slurmctld"].wait()
    killed, seen = time.monotonic(), []
    while cli_run.poll() is None:
        seen.append((time.monotonic() - killed, run.status()))
        time.sleep(0.5)
    out, err = cli_run.communicate()
    took = time.monotonic() - killed
    said = json.loads(out)
    assert cli_run.returncode == 0 and said["status"] == "finished" and said["steps"] == 300, (said, err)
    assert {s for _, s in seen} <= {"running", "finished"}, seen
    assert run.status_record()["slurm"] == {"job_id": run.launch_info()["slurm"]["job_id"], "state": "UNKNOWN",
                                            "reason": "slurmctld did not answer"} or run.status() == "finished"
    print(f"slurmctld killed: the run trained on, finished {took:.1f} s later; exit 0")
    # slurmctld back (as an administrator restarts it): the job's srun reports its end and leaves
    slurm._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(slurm.conf)])
    from commlab.engine import procs

    assert procs.wait_until(lambda: not slurm.jobs(), 120, 0.5), slurm.logs()


@slurm_test
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_a_slurm_time_limit_is_said_by_the_command_as_slurm_s(slurm, tmp_path):
    """A TIMEOUT was reported by the command as "stopped by the user", and corrected in status.json
    about 20 s later."""
    cli_run = _submitted(slurm, tmp_path, "--workload", "mlp", "--steps", "1000000", "--time-limit", "00:01:00")
    run = _the_run(tmp_path)
    t0 = time.monotonic()
    out, err = cli_run.communicate(timeout=RUN_TIMEOUT_S)
    returned = time.monotonic()
    said, job = json.loads(out), run.launch_info()["slurm"]["job_id"]
    word = f"Slurm ended job {job}: TIMEOUT (time limit 00:01:00)"
    assert cli_run.returncode == 1 and (said["status"], said["error"]) == ("stopped", word), (said, err)
    assert run.status_record()["error"] == word  # status.json says the same at once
    print(f"time limit: the command said {said['error']!r} {returned - t0:.1f} s after the first step")
