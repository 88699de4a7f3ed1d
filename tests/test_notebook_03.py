"""notebooks/03_rule_buckets_error.ipynb runs top to bottom (it makes its own short run)."""
from __future__ import annotations

import os

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "03_rule_buckets_error.ipynb")
pytestmark = pytest.mark.slow  # a Jupyter kernel, and the processes the notebook starts


@pytest.mark.timeout(1800)
def test_notebook_03_executes():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # One cell waits for a 2-rank run: minutes on a loaded machine.
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": ROOT}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("compression ratio" in o.get("text", "") for o in outputs)
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) == 6
