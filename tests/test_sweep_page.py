"""A real sweep of a compressor (top-k over two values of k, 2 ranks, the mlp), stopped with a run
left undone, then resumed with the Sweep page's "Resume sweep" button as a person presses it.

Its own runs folder: the sweep of tests/test_sweep_whatif.py is another module's, resumed there.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from commlab.analysis import ring
from commlab.api import list_runs
from commlab.config import RunConfig
from commlab.figures.sweep import pareto_figure
from commlab.tune import pareto, whatif
from commlab.tune import sweep as sw

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 1200  # a run reaches its first step in 5 s idle, minutes on a loaded machine
LABELS = ["allreduce", "topk compress_ratio=0.01", "topk compress_ratio=0.1"]


@pytest.fixture(scope="module")
def stopped_topk(tmp_path_factory):
    """The baseline and top-k at k = 1% finished, k = 10% never started: stopped between runs."""
    runs_dir = tmp_path_factory.mktemp("topk_sweep")
    base = RunConfig(hook="topk", workload="mlp", steps=6, world_size=2, runs_dir=str(runs_dir),
                     stall_timeout_s=RUN_TIMEOUT_S)
    sweep = sw.create(sw.SweepSpec(base=base, compress_ratio=[0.01, 0.1], repeats=1))
    status = sw.execute(sweep, should_stop=lambda: sum(
        r.status() == "finished" for r in sweep.runs()) >= 2)
    return {"sweep": sweep, "status": status, "runs_dir": runs_dir}


@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_a_compressor_sweep_runs_its_own_axis_beside_the_baseline(stopped_topk):
    sweep = stopped_topk["sweep"]
    assert stopped_topk["status"] == "stopped" == sweep.status()
    assert [r.status() for r in sweep.runs()] == ["finished", "finished"]
    assert [r.config().compress_ratio for r in sweep.runs()] == [0.01, 0.01]  # the baseline's is unread
    runs = sweep.results()
    assert list(runs["label"]) == LABELS[:2] and list(runs["hook"]) == ["allreduce", "topk"]
    assert runs["compress_ratio"].isna().tolist() == [True, False]
    base, topk = runs.to_dict(orient="records")
    assert 0 < topk["bytes_per_step"] < base["bytes_per_step"] / 10  # 1% of values, and their indices
    assert topk["quality_basis"] == "held-out" and topk["predicted_s"] > 0
    table = pareto.by_setting(runs)
    assert list(table["label"]) == LABELS[:2] and table["pareto_bytes"].all()
    fig = pareto_figure(table, "bytes_per_step", None, runs)
    assert {t.name for t in fig.data} >= {"fp32 allreduce baseline", "topk settings", "each seed"}
    profiles = whatif.profiles_from_runs(sweep.runs())
    assert [p.label for p in profiles] == LABELS[:2] and profiles[1].collective == ring.ALLGATHER


@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_resume_on_the_sweep_page_runs_only_what_is_left(stopped_topk, monkeypatch):
    from streamlit.testing.v1 import AppTest

    sweep, runs_dir = stopped_topk["sweep"], stopped_topk["runs_dir"]
    before = [r.path for r in sweep.runs()]
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(runs_dir))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900).run()
    at.switch_page("pages/sweep.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("was stopped with 2 run(s) finished and 1 to go" in i.value for i in at.info)
    next(b for b in at.button if b.label == "Resume sweep").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert sweep.wait(timeout=2 * RUN_TIMEOUT_S) == "finished"
    after = sweep.runs()
    assert [r.status() for r in after] == ["finished"] * 3
    assert [r.path for r in after[:2]] == before  # kept, not run again
    assert len(list_runs(runs_dir)) == 3  # one run started: the one left
    assert [r.config().compress_ratio for r in after[1:]] == [0.01, 0.1]
    # The page as it is opened now (AppTest cannot rerun a selectbox whose labels changed, as the
    # sweep's status in them did; a browser's page gets a fresh one).
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900).run()
    at.switch_page("pages/sweep.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not any(b.label == "Resume sweep" for b in at.button)
    assert len(at.get("plotly_chart")) == 3
    assert any("Status: **finished**" in c.value for c in at.caption)
