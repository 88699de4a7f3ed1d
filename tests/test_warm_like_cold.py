"""Every run of a sweep starts from what a cold run starts from, whatever its workload keeps in its
module (``tests/stateful_workloads.py``: a data stream made at first use, a random draw at import, a
cached model): the sweep's runs, on the warm ranks it shares, and the same runs started cold, one
``commlab run`` each, give every step's loss and the final parameters bit for bit."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from commlab.engine import procs

pytestmark = pytest.mark.slow  # sweeps and runs of real ranks

STATEFUL = ["stream_at_first_use", "draw_at_import", "cached_model"]


def _lab(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commlab", *args], cwd=cwd, env=procs.package_env(),
                          capture_output=True, text=True, timeout=600)


def _runs(runs_dir: Path) -> list[Path]:
    return sorted((p.parent for p in runs_dir.glob("*/config.json")), key=lambda p: p.name)


def _losses(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    return [(r["step"], r["loss"]) for r in rows]


def _weights(run: Path) -> dict:
    return torch.load(run / "checkpoint" / "rank0.pt", map_location="cpu", weights_only=True)["model"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("workload", STATEFUL)
def test_a_sweeps_warm_runs_equal_the_same_runs_cold(workload, tmp_path):
    warm_dir, cold_dir = tmp_path / "warm", tmp_path / "cold"
    spec = f"tests.stateful_workloads:{workload}"
    swept = _lab("sweep", "--workload", spec, "--hook", "powersgd", "--matrix-approximation-rank", "1,2",
                 "--start-powersgd-iter", "2", "--steps", "4", "--eval-every", "0", "--repeats", "1",
                 "--no-baseline", "--runs-dir", str(warm_dir), "--json", cwd=Path.cwd())
    assert swept.returncode in (0, 1), swept.stderr[-3000:]  # 1: it may not decide on 4 steps
    warm = _runs(warm_dir)
    assert len(warm) == 2, (swept.stdout[-2000:], swept.stderr[-2000:])
    for run in warm:
        cfg = json.loads((run / "config.json").read_text())
        settings = tmp_path / f"{run.name}.json"
        settings.write_text(json.dumps({**cfg, "runs_dir": str(cold_dir)}))
        done = _lab("run", "--config", str(settings), "--json", cwd=Path.cwd())
        assert done.returncode == 0, done.stderr[-3000:]
    cold = {json.loads((r / "config.json").read_text())["matrix_approximation_rank"]: r for r in _runs(cold_dir)}
    for run in warm:
        twin = cold[json.loads((run / "config.json").read_text())["matrix_approximation_rank"]]
        assert _losses(run) == _losses(twin), f"{run.name} against {twin.name}"
        mine, theirs = _weights(run), _weights(twin)
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine), f"{run.name}: final parameters differ"
