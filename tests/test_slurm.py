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

from commlab.config import RunConfig
from commlab.tune import export
from commlab.tune.export import Target

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]
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


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_the_exported_slurm_script_runs_as_pasted_and_completes(slurm, tmp_path):
    cfg = RunConfig(hook="powersgd", matrix_approximation_rank=1, start_powerSGD_iter=2)
    steps = 5
    snippet = export.render(cfg, "ddp", Target(backend="gloo")).text
    out = tmp_path / "result.json"
    (tmp_path / "train.py").write_text(TRAIN.format(snippet=snippet, steps=steps))
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


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_a_lab_run_on_slurm_follows_its_job_from_pending_to_finished(slurm, tmp_path, monkeypatch):
    from commlab.api import launch
    from commlab.engine.slurm import SlurmJob, job_of

    for k, v in _lab_env(slurm).items():
        monkeypatch.setenv(k, v)
    # The partition down: the job waits in the queue, and the run says why (Slurm's reason).
    slurm.client(["scontrol", "update", "PartitionName=debug", "State=DOWN"])
    run = launch(RunConfig(workload="mlp", steps=8, runs_dir=str(tmp_path)), slurm=SlurmJob())
    assert procs_wait(lambda: run.status_record().get("slurm", {}).get("reason") == "PartitionDown")
    assert run.status() == "pending"
    seen = ["pending"]
    slurm.client(["scontrol", "update", "PartitionName=debug", "State=UP"])
    while run.is_running():
        if run.status() != seen[-1]:
            seen.append(run.status())
        time.sleep(0.05)
    seen.append(run.wait())
    assert seen[0] == "pending" and "running" in seen and seen[-1] == "finished", seen
    job = job_of(run)
    state = slurm.job_state(job)
    assert state["JobState"] == "COMPLETED", state
    assert run.status_record()["slurm"]["state"] == "COMPLETED"  # the follower's last word
    assert run.meta()["world_size"] == 2 and len(run.metrics_records()) == 8
    up = run.launch_info()["slurm"]["submitted_at"]
    first = run.meta()["started_at"] + run.metrics_records()[0]["t"]
    print(f"Slurm job {job}: {' -> '.join(seen)}; submit to first step {first - up:.1f} s "
          f"(partition held down for part of it)")


def procs_wait(predicate, timeout: float = 60) -> bool:
    from commlab.engine import procs

    return procs.wait_until(predicate, timeout, 0.1)


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
    state = slurm.job_state(run.launch_info()["slurm"]["job_id"])
    assert state["JobState"] == "CANCELLED", state
    assert run.status_record()["error"] == "stopped by the user", run.status_record()
    assert not run.processes()


@pytest.mark.timeout(2 * JOB_TIMEOUT_S + 60)
def test_a_sweep_on_slurm_runs_each_configuration_as_a_job_of_its_own(slurm, tmp_path):
    from commlab.tune.sweep import list_sweeps

    done = subprocess.run([sys.executable, "-m", "commlab", "sweep", "--launcher", "slurm", "--workload", "mlp",
                           "--steps", "6", "--matrix-approximation-rank", "1,2", "--start-powersgd-iter", "2",
                           "--no-baseline", "--repeats", "1", "--runs-dir", str(tmp_path), "--json"],
                          env=_lab_env(slurm), capture_output=True, text=True, timeout=2 * JOB_TIMEOUT_S)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert json.loads(done.stdout)["status"] == "finished"
    runs = list_sweeps(tmp_path)[0].runs()
    jobs = [r.launch_info()["slurm"]["job_id"] for r in runs]
    assert len(runs) == 2 and len(set(jobs)) == 2, jobs
    assert [r.status() for r in runs] == ["finished", "finished"]
    assert [slurm.job_state(j)["JobState"] for j in jobs] == ["COMPLETED", "COMPLETED"]
    ups = [r.meta()["started_at"] + r.metrics_records()[0]["t"] - r.launch_info()["slurm"]["submitted_at"]
           for r in runs]
    print(f"sweep on Slurm: jobs {jobs}, COMPLETED; submit to first step {', '.join(f'{u:.1f} s' for u in ups)}")


@pytest.mark.timeout(2 * JOB_TIMEOUT_S + 60)
def test_the_launch_and_sweep_pages_offer_slurm_and_submit_to_it(slurm, tmp_path, monkeypatch):
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
    at.number_input(key="f_steps").set_value(6).run()
    at.button(key="launch").click().run()
    assert not at.exception, [e.value for e in at.exception]
    run = list_runs(tmp_path)[0]
    assert run.launch_info()["slurm"]["job"]["time_limit"] == "00:10:00"
    assert run.wait(JOB_TIMEOUT_S) == "finished", run.status_record()
    assert slurm.job_state(run.launch_info()["slurm"]["job_id"])["JobState"] == "COMPLETED"
    at.run()
    assert any("Slurm job" in str(c.value) for c in at.caption)

    at.switch_page("pages/sweep.py").run()
    at.radio(key="sweep_launcher").set_value("Slurm").run()
    at.number_input(key="sweep_steps").set_value(6)
    at.number_input(key="sweep_repeats").set_value(1)
    at.text_input(key="sweep_matrix_approximation_rank").set_value("1")
    at.checkbox[0].uncheck()  # no baseline: one run, one job
    next(b for b in at.button if b.label == "Start sweep").click().run()
    assert not at.exception, [e.value for e in at.exception]
    sweep = list_sweeps(tmp_path)[0]
    assert sweep.slurm() is not None
    assert procs_wait(lambda: sweep.status() != "running", 2 * JOB_TIMEOUT_S)
    assert sweep.status() == "finished", sweep.state()
    (only,) = sweep.runs()
    assert only.status() == "finished" and "slurm" in only.launch_info()
