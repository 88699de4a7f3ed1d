"""notebooks/02_tune_powersgd.ipynb runs top to bottom: a small sweep, its Pareto chart, the
what-if charts and an export, through the Python API (it makes its own runs)."""
from __future__ import annotations

import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "02_tune_powersgd.ipynb")
pytestmark = pytest.mark.slow  # a Jupyter kernel, and the processes the notebook starts


@pytest.mark.timeout(3600)
def test_notebook_02_executes():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # The sweep cell waits for three 2-rank runs: minutes on a loaded machine.
    nbclient.NotebookClient(nb, timeout=3000, kernel_name="python3",
                            resources={"metadata": {"path": ROOT}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "sweep finished" in text and "recommendation:" in text
    assert "[3/3] powersgd r=2 start=5: finished" in text
    assert "ddp_model.register_comm_hook(" in text and "DistributedDataParallelKwargs(" in text
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) == 3
