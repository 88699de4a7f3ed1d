"""torch_profiler: a real 2-rank Gloo run profiles its traced step on every rank, each rank's
file is a Chrome trace of that step's backward and Gloo allreduces, and the Buckets page offers
every one as a download next to trace.json."""
import json
import os

import pytest
from streamlit.testing.v1 import AppTest

from commlab.api import RunConfig, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_each_rank_writes_a_chrome_trace_of_its_traced_step(tmp_path, monkeypatch):
    r = run(RunConfig(workload="mlp", steps=2, world_size=2, trace_steps=[1], torch_profiler=True,
                      eval_every=0, save_checkpoint=False, runs_dir=str(tmp_path),
                      stall_timeout_s=600), timeout=600)
    assert r.status() == "finished", r.status_record()
    traces = r.profiler_traces()
    assert [p.name for p in traces] == ["step1.rank0.json", "step1.rank1.json"]
    for path in traces:
        events = json.loads(path.read_text())["traceEvents"]
        names = {e.get("name", "") for e in events if e.get("ph") == "X"}
        assert any(n.startswith("autograd::engine::evaluate_function") for n in names), path
        assert "gloo:all_reduce" in names, (path, sorted(names)[:50])

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(os.path.join(ROOT, "app.py"), default_timeout=300)
    at.run()
    at.switch_page("pages/buckets.py").run()
    assert not at.exception, [e.value for e in at.exception]
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == ["Download trace.json (Perfetto, chrome://tracing)",
                      *(f"Download torch.profiler trace {p.name}" for p in traces)]


@pytest.mark.slow
def test_the_buckets_page_offers_the_profiler_traces_of_a_run_without_instrumentation(tmp_path,
                                                                                      monkeypatch):
    r = run(RunConfig(workload="mlp", steps=2, world_size=2, trace_steps=[1], torch_profiler=True,
                      instrument=False, eval_every=0, save_checkpoint=False, runs_dir=str(tmp_path),
                      stall_timeout_s=600), timeout=600)
    assert r.status() == "finished", r.status_record()
    traces = r.profiler_traces()
    assert [p.name for p in traces] == ["step1.rank0.json", "step1.rank1.json"]
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(os.path.join(ROOT, "app.py"), default_timeout=300)
    at.run()
    at.switch_page("pages/buckets.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("No step of this run was traced" in c.value for c in at.caption)
    assert [b.proto.label for b in at.get("download_button")] == [
        f"Download torch.profiler trace {p.name}" for p in traces]
