"""The project's own scripts as a newcomer and CI meet them: .ci/run reads the README's two set-up
commands (so they are the ones CI runs), and benchmarks/gpu_check.sh on a machine without a GPU
says so and succeeds."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # each script runs as its own process


def readme_command(which: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_commands.py"), which],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_ci_runs_the_readme_s_two_set_up_commands():
    lab, tests = readme_command("lab"), readme_command("test")
    assert "pip install -r requirements.txt" in lab and lab.endswith("streamlit run app.py"), lab
    assert "pip install -r requirements-dev.txt" in tests and tests.endswith("python -m pytest"), tests
    assert "chromium" in tests  # the browser test's browser, from Debian
    assert "slurm-wlm munge" in tests  # the one-node Slurm the Slurm tests start (tests/slurm_cluster.py)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv" in ci and "readme_commands.py lab" in ci and "readme_commands.py test" in ci
    assert 'export CI="${CI:-1}"' in ci  # under CI a missing Slurm fails its tests instead of skipping them


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_gpu_check_without_a_gpu_says_so_and_succeeds():
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT,
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no CUDA GPU here (torch 2.13.0" in done.stdout, done.stdout
