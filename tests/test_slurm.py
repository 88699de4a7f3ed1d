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
