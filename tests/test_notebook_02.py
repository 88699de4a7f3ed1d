"""notebooks/02_tune_powersgd.ipynb runs top to bottom: a sweep with three seeds and held-out
evaluations, its curves, the noise-aware recommendation, time to quality, the Pareto charts, the
what-if chart and an export, through the Python API (it makes its own runs).

It runs with two seeds, not the notebook's three: two runs fewer (a run's start-up is most of its
cost), and every cell still runs; the three-seed decision is the recommendation's own tests'
(tests/test_sweep_whatif.py)."""
from __future__ import annotations

import os

import nbclient
import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "02_tune_powersgd.ipynb")
pytestmark = pytest.mark.slow  # a Jupyter kernel, and the processes the notebook starts


@pytest.mark.timeout(3600)
def test_notebook_02_executes():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # As papermill does: a cell after the one tagged "parameters" sets this run's values.
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", ()))
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell("repeats = 2", metadata={"tags": ["injected-parameters"]}))
    # The sweep cell waits for four 2-rank runs: minutes on a loaded machine.
    nbclient.NotebookClient(nb, timeout=3000, kernel_name="python3",
                            resources={"metadata": {"path": ROOT}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "sweep finished" in text and "recommendation:" in text
    assert "[4/4] powersgd r=1 start=5 seed 1: finished" in text
    assert "paired by seed" in text and "with 2 seeds: no decision: 2 seeds cannot separate these" in text
    assert "target held-out loss:" in text
    assert "ddp_model.register_comm_hook(" in text and "DistributedDataParallelKwargs(" in text
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) == 4  # curves, loss against bytes and against predicted time, what-if
