"""notebooks/01_allreduce.ipynb runs from top to bottom on real processes and leaves none behind.

The notebook asserts its own results (3.0 on every rank, every op against numpy, the ring
simulation against the real all_reduce, DDP against hand-averaged gradients); this test runs it.
"""
import time
from pathlib import Path

import nbclient
import nbformat
import psutil
import pytest

from commlab.engine import procs

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "01_allreduce.ipynb"
pytestmark = pytest.mark.slow  # a Jupyter kernel, and the processes the notebook starts


def _ranks_since(since: float) -> list[psutil.Process]:
    """Launchers and ranks (their command line names commlab's launcher) started since ``since``,
    among this process's descendants: the conftest makes it the subreaper of every orphan, and
    another test running beside this one (pytest-xdist) has its own."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.create_time() >= since - 1 and "_launcher_main" in " ".join(
                    p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def _kernels() -> list[psutil.Process]:
    found = []
    for p in psutil.Process().children():
        try:
            if "ipykernel_launcher" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def test_notebook_runs_and_leaves_no_process():
    since = time.time()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=600,
                                     resources={"metadata": {"path": str(ROOT)}})
    try:
        client.execute()
    finally:  # an interrupted execute (a timeout) leaves the kernel up: end it and its ranks
        procs.terminate(_kernels())
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
    assert "rank 2: before [2.0] -> after [3.0]" in text
    assert "simulation equals the real all_reduce: True" in text
    deadline = time.monotonic() + 10
    while (left := _ranks_since(since)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left behind: {[p.pid for p in left]}"
