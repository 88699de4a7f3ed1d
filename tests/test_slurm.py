"""Against a real Slurm (``tests/slurm_cluster.py``: munged, slurmctld and slurmd as a one-node
cluster in a temporary folder): the exported Slurm script submitted as pasted, lab runs and a
sweep submitted through ``--launcher slurm``, and a Stop that cancels the job.

A job's state is read with ``scontrol show job`` (the cluster keeps no accounting, so there is no
sacct record; slurmctld keeps a finished job for MinJobAge seconds).
"""
from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from script_end import END

from commlab import cli
from commlab.config import ConfigError, RunConfig
from commlab.tune import export
from commlab.tune.export import Target

ROOT = Path(__file__).resolve().parent.parent
# A test that starts the cluster: slow, and one xdist worker runs them all, one cluster at a time.
def cluster_test(f):
    return pytest.mark.slow(pytest.mark.xdist_group("slurm")(f))
JOB_TIMEOUT_S = 240

TRAIN = """\
import json, os, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
ddp_model = DistributedDataParallel(model)
{snippet}
optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
for step in range({steps}):
    x = torch.randn(16, 32)
    loss = ddp_model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({{"world": dist.get_world_size(), "iter": state.iter,
                    "hook": ddp_model._get_ddp_logging_data().get("comm_hook", "")}}, f)
dist.destroy_process_group()
"""


def _loopback_torchrun(bin_dir: Path) -> None:
    """A ``torchrun`` on PATH that is torch's own with its stores on loopback
    (``commlab.engine.torchrun``): the exported script's rendezvous then listens on 127.0.0.1 only."""
    bin_dir.mkdir()
    path = bin_dir / "torchrun"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} -m commlab.engine.torchrun --local-addr 127.0.0.1 "
                    '--max-restarts 0 "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _wait_gone(slurm, job_id: str, timeout: float = JOB_TIMEOUT_S) -> dict:
    deadline = time.monotonic() + timeout
    while job_id in slurm.jobs():
        assert time.monotonic() < deadline, (slurm.job_state(job_id), slurm.logs())
        time.sleep(0.3)
    return slurm.job_state(job_id)


@cluster_test
@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_the_exported_slurm_script_runs_as_pasted_and_completes(slurm, tmp_path):
    cfg = RunConfig(hook="powersgd", matrix_approximation_rank=1, start_powerSGD_iter=2)
    steps = 5
    snippet = export.render(cfg, "ddp", Target(backend="gloo")).text
    out = tmp_path / "result.json"
    (tmp_path / "train.py").write_text(TRAIN.format(snippet=snippet, steps=steps) + END)
    script = export.render(cfg, "slurm", Target(backend="gloo", nproc_per_node=2,
                                                script_args=[str(out)])).text
    (tmp_path / "job.sbatch").write_text(script)
    _loopback_torchrun(tmp_path / "bin")
    env = {**slurm.env, "PATH": f"{tmp_path / 'bin'}:{slurm.env['PATH']}", "PYTHONPATH": str(ROOT),
           "GLOO_SOCKET_IFNAME": "lo", "PYTHONWARNINGS": "ignore"}
    job_id = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}", f"--output={tmp_path}/job.out",
                             str(tmp_path / "job.sbatch")], env=env, capture_output=True, text=True,
                            check=True).stdout.strip().split(";")[0]
    state = _wait_gone(slurm, job_id)
    log = (tmp_path / "job.out").read_text(errors="replace")
    assert state["JobState"] == "COMPLETED", (state, log[-3000:])
    result = json.loads(out.read_text())
    assert result["world"] == 2, result
    assert result["iter"] == steps, result  # PowerSGD's state counted every step
    assert "powerSGD_hook" in result["hook"], result  # the exported hook was the one DDP ran


# ---------------------------------------------------------------------------- lab runs on Slurm
def _lab_env(slurm) -> dict:
    return {**slurm.env, "PYTHONPATH": str(ROOT)}


def procs_wait(predicate, timeout: float = 60) -> bool:
    from commlab.engine import procs

    return procs.wait_until(predicate, timeout, 0.1)


@cluster_test
@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_ctrl_c_on_commlab_run_launcher_slurm_cancels_the_job(slurm, tmp_path):
    import signal

    from commlab.api import list_runs

    cli = subprocess.Popen([sys.executable, "-m", "commlab", "run", "--launcher", "slurm", "--workload", "mlp",
                            "--steps", "100000", "--runs-dir", str(tmp_path)], env=_lab_env(slurm),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert procs_wait(lambda: list_runs(tmp_path) and list_runs(tmp_path)[0].metrics_records(), JOB_TIMEOUT_S)
    run = list_runs(tmp_path)[0]
    cli.send_signal(signal.SIGINT)  # Stop: the stop request and scancel
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == 1, (out, err)
    assert run.wait(60) == "stopped", run.status_record()
    state = _wait_gone(slurm, run.launch_info()["slurm"]["job_id"])
    assert state["JobState"] == "CANCELLED", state
    assert run.status_record()["error"] == "stopped by the user", run.status_record()
    assert not run.processes()


@cluster_test
@pytest.mark.timeout(2 * JOB_TIMEOUT_S + 60)
def test_the_launch_and_sweep_pages_submit_to_slurm_and_follow_the_jobs(slurm, tmp_path, monkeypatch):
    """The Launch page's run waits in the queue (the partition down: Slurm's reason shown), runs
    and finishes as its job completes; the Sweep page's two runs are two jobs, one after another."""
    from streamlit.testing.v1 import AppTest

    from commlab.api import list_runs
    from commlab.tune.sweep import list_sweeps

    for k, v in {**_lab_env(slurm), "COMMLAB_RUNS_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(k, v)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=JOB_TIMEOUT_S)
    at.run()
    at.radio(key="launch_launcher").set_value("Slurm").run()
    at.text_input(key="launch_time_limit").set_value("ten minutes").run()
    assert at.button(key="launch").disabled  # refused by name before anything is submitted
    assert any("time_limit" in str(e.value) for e in at.error), [e.value for e in at.error]
    at.text_input(key="launch_time_limit").set_value("00:10:00")
    at.number_input(key="f_steps").set_value(8).run()
    slurm.client(["scontrol", "update", "PartitionName=debug", "State=DOWN"])
    at.button(key="launch").click().run()
    assert not at.exception, [e.value for e in at.exception]
    run = list_runs(tmp_path)[0]
    job = run.launch_info()["slurm"]["job_id"]
    assert run.launch_info()["slurm"]["job"]["time_limit"] == "00:10:00"
    assert procs_wait(lambda: run.status_record().get("slurm", {}).get("reason") == "PartitionDown")
    assert run.status() == "pending"
    at.run()
    assert any("PartitionDown" in str(c.value) for c in at.caption), [c.value for c in at.caption]
    seen = ["pending"]
    slurm.client(["scontrol", "update", "PartitionName=debug", "State=UP"])
    while run.is_running():
        if run.status() != seen[-1]:
            seen.append(run.status())
        time.sleep(0.05)
    seen.append(run.wait())
    assert "running" in seen and seen[-1] == "finished", seen
    assert _wait_gone(slurm, job)["JobState"] == "COMPLETED"
    assert run.status_record()["slurm"]["state"] == "COMPLETED"  # the follower's last word
    assert run.meta()["world_size"] == 2 and len(run.metrics_records()) == 8
    first = run.meta()["started_at"] + run.metrics_records()[0]["t"] - run.launch_info()["slurm"]["submitted_at"]
    print(f"Slurm job {job}: {' -> '.join(seen)}; submit to first step {first:.1f} s (partition held down "
          "for part of it)")

    at.switch_page("pages/sweep.py").run()
    at.radio(key="sweep_launcher").set_value("Slurm").run()
    at.number_input(key="sweep_steps").set_value(6)
    at.number_input(key="sweep_repeats").set_value(1)
    at.text_input(key="sweep_matrix_approximation_rank").set_value("1, 2")
    at.checkbox[0].uncheck()  # no baseline: two runs
    next(b for b in at.button if b.label == "Start sweep").click().run()
    assert not at.exception, [e.value for e in at.exception]
    sweep = list_sweeps(tmp_path)[0]
    assert sweep.slurm() is not None
    assert procs_wait(lambda: sweep.status() != "running", 2 * JOB_TIMEOUT_S)
    assert sweep.status() == "finished", sweep.state()
    runs = sweep.runs()
    jobs = [r.launch_info()["slurm"]["job_id"] for r in runs]
    assert [r.status() for r in runs] == ["finished", "finished"] and len(set(jobs)) == 2
    assert [_wait_gone(slurm, j)["JobState"] for j in jobs] == ["COMPLETED", "COMPLETED"]
    ups = [r.meta()["started_at"] + r.metrics_records()[0]["t"] - r.launch_info()["slurm"]["submitted_at"]
           for r in runs]
    print(f"sweep on Slurm: jobs {jobs}, COMPLETED; submit to first step {', '.join(f'{u:.1f} s' for u in ups)}")


@cluster_test
@pytest.mark.slurm_nodes(2)
@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_a_lab_run_on_two_slurm_nodes_is_one_run_of_both(slurm, tmp_path):
    """Two slurmd on this machine, each in a network namespace of its own on a veth ``eth0`` to a
    bridge (``tests/slurm_cluster.py``): one srun task on each, each its node's supervisor, one
    rendezvous at the allocation's first node's address, the ranks talking through their veths."""
    from commlab.api import list_runs, open_run

    port = 29511  # the nodes' own namespaces: nothing else listens there
    done = subprocess.run([sys.executable, "-m", "commlab", "run", "--launcher", "slurm", "--nodes", "2",
                           "--ifname", "eth0", "--rdzv-port", str(port), "--world-size", "1", "--workload", "mlp",
                           "--steps", "8", "--runs-dir", str(tmp_path), "--json"], env=_lab_env(slurm),
                          capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    (run,) = list_runs(tmp_path)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:], run.status_record(),
                                  _tail_of(run.path / f"slurm-{run.launch_info()['slurm']['job_id']}.out"))
    assert json.loads(done.stdout)["status"] == "finished"
    assert run.meta()["world_size"] == 2 and len(run.metrics_records()) == 8  # 2 nodes x 1 rank
    n1, n2 = (addr for _, addr in slurm.nodes)
    assert run.launch_info()["nodes"]["rdzv_endpoint"] == f"{n1}:{port}"  # n1's NodeAddr, on its veth
    assert (run.launch_info()["nodes"]["ifname"], run.launch_info()["nodes"]["local_addr"]) == ("eth0", n1)
    node1 = open_run(run.path / "nodes" / "1")  # node 1's supervisor, ending a moment after node 0's
    assert node1.wait(60) == "finished", node1.status_record()
    assert node1.launch_info()["nodes"]["local_addr"] == n2  # its veth's address, read from eth0 there
    job = run.launch_info()["slurm"]["job_id"]
    state = _wait_gone(slurm, job)  # the tasks end a moment after the run recorded its end
    assert (state["JobState"], state["NumNodes"]) == ("COMPLETED", "2"), state
    _follower_ended(run)
    print(f"two Slurm nodes: job {job} {state['NodeList']} COMPLETED, world size 2, 8 steps; submit to "
          f"first step {run.meta()['started_at'] + run.metrics_records()[0]['t'] - run.launch_info()['slurm']['submitted_at']:.1f} s")


def _follower_ended(run) -> None:
    """The run's follower reads the job's end (a two-node job stays COMPLETING a while after its
    tasks) and records it, while the cluster still answers."""
    from commlab.engine import procs

    me = run.launch_info()["supervisor"]
    assert procs_wait(lambda: not procs.alive(me["pid"], me["create_time"]), 60), run.status_record()
    assert run.status_record()["slurm"]["state"] == "COMPLETED"


def _tail_of(path) -> str:
    try:
        return Path(path).read_text(errors="replace")[-3000:]
    except FileNotFoundError:
        return ""


@cluster_test
def test_a_job_slurm_refuses_is_refused_with_slurm_s_words_and_leaves_nothing(slurm, tmp_path, monkeypatch,
                                                                               capsys):
    """It said "nothing was started" and left a failed run in the list (issue 40 leftover a)."""
    from commlab.api import launch, list_runs
    from commlab.engine.launchers.slurm import SlurmJob

    for k, v in _lab_env(slurm).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match="sbatch refused the job: .*[Ii]nvalid partition") as refused:
        launch(RunConfig(workload="mlp", runs_dir=str(tmp_path)), slurm=SlurmJob(partition="nosuch"),
               request_id="twice")
    assert set(refused.value.errors) == {"launcher"}
    assert list_runs(tmp_path) == [] and not [p for p in tmp_path.iterdir() if p.is_dir()]
    assert not list(tmp_path.glob(".request-*"))  # the request id is free again
    # The command says it as it says any refusal: the field and why, no traceback.
    assert cli.main(["run", "--workload", "mlp", "--runs-dir", str(tmp_path), "--launcher", "slurm",
                     "--partition", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "launcher: sbatch refused the job" in err and "Traceback" not in err


# ---------------------------------------------------------------------------- Slurm's word on an end
@pytest.mark.parametrize("state, before, status, error", [
    ({"JobState": "TIMEOUT", "TimeLimit": "00:01:00"}, "stopped", "stopped",
     "Slurm ended job 7: TIMEOUT (time limit 00:01:00)"),
    ({"JobState": "CANCELLED"}, "running", "stopped", "Slurm cancelled job 7 (scancel, or the cluster's administrator)"),
    ({"JobState": "FAILED", "Reason": "NonZeroExitCode", "ExitCode": "1:0"}, "pending", "failed",
     "Slurm job 7 ended FAILED (reason NonZeroExitCode, exit code 1:0) before the run recorded an end"),
    ({"JobState": "COMPLETED"}, "finished", "finished", None),
])
def test_a_job_s_end_gives_the_run_slurm_s_reason_unless_the_run_recorded_its_own(tmp_path, state, before,
                                                                                 status, error):
    from commlab.engine import run_folder, store
    from commlab.engine.launchers.slurm import record_end

    folder = run_folder.RunFolder(tmp_path)
    store.write_json(folder.file("status.json"), {"status": before, "step": 3, **(
        {"error": "stopped by the user"} if before == "stopped" else {})})
    (tmp_path / "slurm-7.out").write_text("python: No module named commlab\n")
    record_end(folder, "7", state, wait_s=0)
    said = folder.status_record()
    assert (said["status"], said.get("error")) == (status, error), said
    assert said["slurm"]["state"] == state["JobState"]
    if status == "failed":
        assert "No module named commlab" in said["traceback"]


def test_launcher_flags_are_refused_by_name_where_they_do_not_apply(monkeypatch):
    from commlab.cli import build_parser
    from commlab.commands.run import node_from_args, slurm_from_args
    from commlab.config import ConfigError
    from commlab.engine.launchers import slurm

    parse = build_parser().parse_args
    with pytest.raises(ConfigError) as e:
        slurm_from_args(parse(["run", "--partition", "gpu", "--time-limit", "1:00:00"]))
    assert set(e.value.errors) == {"partition", "time_limit"}  # only with --launcher slurm
    with pytest.raises(ConfigError) as e:  # a sweep spans nodes only through Slurm
        slurm_from_args(parse(["sweep", "--nodes", "2"]))
    assert set(e.value.errors) == {"nnodes"}
    monkeypatch.setattr(slurm, "available", lambda: True)  # as where sbatch is on PATH
    with pytest.raises(ConfigError) as e:  # Slurm places the nodes itself
        slurm_from_args(parse(["run", "--launcher", "slurm", "--node-rank", "1", "--run-id", "x"]))
    assert set(e.value.errors) == {"node_rank", "run_id"}
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    with pytest.raises(ConfigError) as e:
        slurm_from_args(parse(["sweep", "--launcher", "slurm", "--nodes", "2", "--time-limit", "1 hour"]))
    assert set(e.value.errors) == {"ifname", "time_limit"}
    job = slurm_from_args(parse(["run", "--launcher", "slurm", "--nodes", "2", "--ifname", "eth0"]))
    assert (job.nodes, job.ifname, job.port) == (2, "eth0", slurm.RDZV_PORT)
    assert node_from_args(parse(["run"])) is None  # one node: loopback, as always
    monkeypatch.setattr(slurm, "available", lambda: False)
    with pytest.raises(ConfigError, match="sbatch is not on PATH"):
        slurm_from_args(parse(["run", "--launcher", "slurm"]))


def test_the_job_script_runs_one_supervisor_per_node_with_paths_quoted(tmp_path):
    from commlab.engine.launchers.slurm import SlurmJob, sbatch_argv, script
    from commlab.engine.run_folder import RunFolder

    run_dir = tmp_path / "a run; rm -rf ~"
    text = script(run_dir, RunConfig(world_size=3), SlurmJob(nodes=2, partition="cpu", ifname="eth0"), "/opt/py")
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=3\n" in text
    assert "#SBATCH --partition=cpu\n" in text and "#SBATCH --no-requeue\n" in text
    assert "--gpus-per-node" not in text  # Gloo on CPUs
    gpus = script(run_dir, RunConfig(world_size=3), SlurmJob(nodes=2, ifname="eth0"), "/opt/py", backend="nccl")
    assert "#SBATCH --gpus-per-node=3\n" in gpus  # NCCL: a GPU per rank, asked of Slurm
    assert text.endswith(f"exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 /opt/py -m commlab.engine.slurm_node "
                         f"'{run_dir}'\n")
    argv = sbatch_argv(RunFolder(run_dir))
    assert argv[0] == "sbatch" and argv[-1] == str(run_dir / "job.sbatch")  # a list: no shell reads it


def test_without_slurm_its_tests_skip_except_under_ci(monkeypatch):
    from slurm_cluster import skip_or_fail

    monkeypatch.setenv("PATH", "/nonexistent")  # no sbatch, squeue, ... (the daemons' /usr/sbin is looked in)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y --no-install-recommends slurm-wlm munge"):
        skip_or_fail()
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="sbatch"):
        skip_or_fail()
