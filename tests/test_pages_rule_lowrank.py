"""AppTest of the compression-rule and low-rank-error pages: with no runs, and with the session's
real short runs; every number checked is recomputed here from commlab and the run folder."""
from __future__ import annotations

import base64
import io
import json
import os
import time

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

import lab_widgets
from commlab.analysis import lowrank, shapes, units
from commlab.analysis.rule import IN_BY_OUT_NOTE, apply_rule
from commlab.figures import lowrank as lowrank_figs
from commlab.figures import rule as rule_figs
from commlab.ui import runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULE_PAGE, LOWRANK_PAGE = "pages/compression_rule.py", "pages/low_rank_error.py"
# The first run of a page imports torch and builds models: minutes on a loaded machine.
TIMEOUT = 900
# Over the suite's 300 s: the session's runs are made on first use, and pages import torch.
pytestmark = pytest.mark.timeout(1800)


def open_page(monkeypatch, runs_dir, page: str) -> AppTest:
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(runs_dir))
    at = AppTest.from_file(os.path.join(ROOT, "app.py"), default_timeout=TIMEOUT).run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def widget(widgets, label: str):
    return next(w for w in widgets if w.label == label)


def plotly_arrays(at: AppTest, index: int) -> list[dict]:
    """The traces of a page's n-th plotly chart, with plotly 7's packed arrays decoded."""
    spec = json.loads(at.get("plotly_chart")[index].proto.spec)

    def unpack(v):
        if isinstance(v, dict) and "bdata" in v:
            return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
        return v

    return [{k: unpack(v) for k, v in trace.items()} for trace in spec["data"]]


def check_rule_page(at: AppTest, named, rank: int, rate: float) -> None:
    """Table, metrics, byte caption and chart all equal commlab.analysis.rule's summary."""
    assert not at.exception, [e.value for e in at.exception]
    summary = apply_rule(named, rank, rate)
    table = at.dataframe[0].value
    assert list(table.columns[:3]) == ["layer", "decision", "n·m"]  # what the page is for, first
    assert list(table["layer"]) == [d.name for d in summary.layers]
    assert list(table["n"]) == [d.n for d in summary.layers]
    assert list(table["m"]) == [d.m for d in summary.layers]
    assert list(table["r"]) == [d.r for d in summary.layers]
    assert list(table["(n+m)·r·rate"]) == pytest.approx([d.lhs for d in summary.layers])
    assert list(table["n·m"]) == [d.rhs for d in summary.layers]
    assert list(table["decision"]) == [rule_figs.DECISIONS[d.compressed] for d in summary.layers]
    assert list(table["elements before"]) == [d.numel_before for d in summary.layers]
    assert list(table["elements after"]) == [d.numel_after for d in summary.layers]
    metrics = {m.label: m.value for m in at.metric}
    sent = rule_figs.step_bytes(summary)
    assert sent == {"powersgd": 4 * summary.numel_after, "allreduce": 4 * summary.numel_before}
    assert metrics["Predicted compression ratio"] == f"{summary.predicted_ratio:.2f}×"
    assert metrics["Layers compressed"] == f"{summary.compressed_count} / {len(summary.layers)}"
    assert metrics["PowerSGD sends per step"] == units.human_bytes(sent["powersgd"])
    assert metrics["Plain allreduce sends"] == units.human_bytes(sent["allreduce"])
    caption = next(c.value for c in at.caption if "bytes with PowerSGD" in c.value)
    assert f"{sent['powersgd']:,} bytes with PowerSGD" in caption
    assert f"{sent['allreduce']:,} bytes with plain allreduce" in caption
    sent_trace, saved_trace = plotly_arrays(at, 0)
    grouping = at.radio(key="rule_grouping").value
    if grouping == "every layer":
        assert sent_trace["y"] == [d.numel_after for d in summary.layers]
        assert saved_trace["y"] == [d.numel_before - d.numel_after for d in summary.layers]
    bars = rule_figs.grouped(summary, grouping)
    assert list(sent_trace["x"]) == list(bars["name"]) and sent_trace["y"] == list(bars["sent"])
    # Grouped or not, the bars hold every element once.
    assert sum(sent_trace["y"]) == summary.numel_after
    assert sum(sent_trace["y"]) + sum(saved_trace["y"]) == summary.numel_before


# ------------------------------------------------------------------ no runs at all
def test_lowrank_page_without_runs_says_how_to_make_one(monkeypatch, tmp_path):
    at = open_page(monkeypatch, tmp_path / "empty", LOWRANK_PAGE)
    assert at.title[0].value == "Low-rank error"
    assert "has saved gradients" in at.info[0].value
    text = " ".join(m.value for m in at.markdown)
    assert "--save-grads-at" in text and "--error-every" in text and "save_grads_at" in text
    assert f"--runs-dir {tmp_path / 'empty'}" in text  # where the page reads, from any terminal


def test_rule_page_without_runs(monkeypatch, tmp_path):
    at = open_page(monkeypatch, tmp_path / "empty", RULE_PAGE)
    assert at.title[0].value == "Compression rule"
    check_rule_page(at, shapes.from_workload("charlm"), 1, 2.0)
    widget(at.selectbox, "Workload").set_value("mlp")
    widget(at.slider, "matrix_approximation_rank").set_value(2)
    widget(at.slider, "min_compression_rate").set_value(5.0)
    at.run()
    check_rule_page(at, shapes.from_workload("mlp"), 2, 5.0)


@pytest.mark.slow  # a person's module:function is built in a child process
def test_rule_page_module_and_checkpoint_sources(monkeypatch, tmp_path):
    at = open_page(monkeypatch, tmp_path / "empty", RULE_PAGE)
    widget(at.radio, "Shapes from").set_value("Your module:function").run()
    assert at.info and not at.dataframe  # nothing named yet
    widget(at.text_input, "module:function").set_value("commlab.workloads:cnn").run()
    check_rule_page(at, shapes.from_workload("cnn"), 1, 2.0)  # the same model, built-in
    assert IN_BY_OUT_NOTE not in [i.value for i in at.info]
    # GPT-2's Conv1D keeps its weight as in × out: the page says what n × m is for it.
    widget(at.text_input, "module:function").set_value("tests.hf_workloads:gpt2").run()
    assert not at.exception and IN_BY_OUT_NOTE in [i.value for i in at.info]
    widget(at.text_input, "module:function").set_value("no_such_module_here:fn").run()
    assert "does not import" in at.error[0].value
    # The person's code runs in a child: one that aborts ends the child, not the app.
    widget(at.text_input, "module:function").set_value("os:abort").run()
    assert not at.exception and "SIGABRT" in at.error[0].value

    state = {"model": {"emb.weight": torch.randn(300, 48), "head.weight": torch.randn(10, 48),
                       "head.bias": torch.randn(10)}}
    buf = io.BytesIO()
    torch.save(state, buf)
    widget(at.radio, "Shapes from").set_value("Uploaded checkpoint").run()
    at.file_uploader[0].set_value(("ckpt.pt", buf.getvalue(), "application/octet-stream"))
    at.run()
    check_rule_page(at, [("emb.weight", (300, 48)), ("head.weight", (10, 48)), ("head.bias", (10,))],
                    1, 2.0)
    at.file_uploader[0].set_value(("junk.pt", b"not a checkpoint", "application/octet-stream"))
    at.run()
    assert "not a readable torch checkpoint" in at.error[0].value


def test_rule_page_on_the_1_5b_reference_model(monkeypatch, tmp_path):
    """Correctness only; the time of one slider change is printed, never asserted (shared machine)."""
    name = next(k for k in shapes.REFERENCE_MODELS if "1.5B" in k)
    named = shapes.from_reference(name)
    assert shapes.total_numel(named) > 1.5e9
    at = open_page(monkeypatch, tmp_path / "empty", RULE_PAGE)
    widget(at.radio, "Shapes from").set_value("Reference model").run()
    widget(at.selectbox, "Reference model").set_value(name).run()
    check_rule_page(at, named, 1, 2.0)
    times = []
    for rank in (4, 8, 16):
        widget(at.slider, "matrix_approximation_rank").set_value(rank)
        t0 = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - t0)
        check_rule_page(at, named, rank, 2.0)
    # 581 bars are grouped by kind unless told; the largest layers and the rest as one bar.
    assert at.radio(key="rule_grouping").value == "by layer kind"
    at.radio(key="rule_grouping").set_value("largest layers").run()
    check_rule_page(at, named, 16, 2.0)
    assert len(plotly_arrays(at, 0)[0]["x"]) == rule_figs.TOP_N + 1
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert spec["layout"]["yaxis"]["type"] == "log"  # sizes span decades: log unless told
    at.toggle(key="rule_log").set_value(False).run()
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert spec["layout"]["yaxis"].get("type", "linear") == "linear"
    print(f"\n[timing] rule page, one slider change on {name} ({len(named)} tensors): "
          + ", ".join(f"{t:.3f} s" for t in times))


# ------------------------------------------------------------------ the session's real runs
def test_lowrank_page_numbers_equal_the_run_folder(monkeypatch, runs_dir, powersgd_run, allreduce_run):
    at = open_page(monkeypatch, runs_dir, LOWRANK_PAGE)
    run_box = widget(at.selectbox, "Run")
    names = {c["path"]: lab_widgets.run_name(c) for c in runs.run_choices(runs_dir)}
    # The allreduce baseline saved nothing and measured nothing: it is not offered.
    assert names[str(powersgd_run.path)] in run_box.options
    assert names[str(allreduce_run.path)] not in run_box.options
    run_box.set_value(str(powersgd_run.path)).run()
    assert not at.exception, [e.value for e in at.exception]

    cfg = powersgd_run.config_dict()
    steps = powersgd_run.grad_steps()
    assert steps == [8, 9, 10]
    names = lowrank.compressed_names(powersgd_run.layers())
    assert names  # the fixture's mlp compresses its weight matrices

    def expected_layers(step):
        return lowrank.step_errors(powersgd_run.grads(step), names, cfg["random_seed"],
                                   lowrank.MAX_RANK, cfg["orthogonalization_epsilon"])

    def check(step, rank):
        layers = expected_layers(step)
        table = at.dataframe[0].value
        want = lowrank_figs.error_table(layers, rank)
        assert list(table["layer"]) == list(want["layer"])
        for col in ("optimum (SVD)", "PowerSGD (1 power iteration)"):
            assert list(table[col]) == pytest.approx(list(want[col]), rel=1e-9)
        traces = plotly_arrays(at, 0)
        assert traces[0]["y"] == pytest.approx(layers[0].optimum, rel=1e-9)
        assert traces[1]["y"] == pytest.approx(layers[0].power, rel=1e-9)
        # The layer shown (the first) against rank; warm start when steps before this one were saved.
        shown = plotly_arrays(at, 1)
        assert shown[0]["y"] == pytest.approx(layers[0].optimum, rel=1e-9)
        assert shown[1]["y"] == pytest.approx(layers[0].power, rel=1e-9)
        before = [s for s in steps if s <= step]
        if len(before) > 1:
            warm_curve = lowrank.warm_errors_by_rank(
                {s: powersgd_run.grads(s)[names[0]] for s in before}, cfg["random_seed"],
                lowrank.MAX_RANK, cfg["orthogonalization_epsilon"])
            assert shown[2]["y"] == pytest.approx(warm_curve, rel=1e-9)
        else:
            assert len(shown) == 2
        # Warm start over the consecutive saved steps, for the same layer.
        ws = lowrank.warm_start(names[0], {s: powersgd_run.grads(s)[names[0]] for s in steps},
                                rank, cfg["random_seed"], cfg["orthogonalization_epsilon"])
        warm = at.dataframe[1].value
        assert list(warm["step"]) == steps
        assert list(warm["PowerSGD, warm start"]) == pytest.approx(ws.warm, rel=1e-9)
        assert list(warm["PowerSGD, new Q each step"]) == pytest.approx(ws.cold, rel=1e-9)
        assert list(warm["optimum (SVD)"]) == pytest.approx(ws.optimum, rel=1e-9)

    picker = at.multiselect(key="lowrank_layers")
    assert picker.value == picker.options[:lowrank_figs.SHOWN_LAYERS]
    assert len(plotly_arrays(at, 0)) == 2 * len(picker.value)  # optimum and PowerSGD per layer
    assert widget(at.selectbox, "Saved step").value == 10
    assert widget(at.slider, "Rank to compare at").value == cfg["matrix_approximation_rank"]
    check(10, cfg["matrix_approximation_rank"])
    widget(at.selectbox, "Saved step").set_value(8)
    widget(at.slider, "Rank to compare at").set_value(5)
    at.run()
    check(8, 5)

    measured = at.dataframe[2].value
    rows = lowrank.measured_rows(powersgd_run.error_records())
    assert len(measured) == len(rows) > 0
    assert list(measured["rel_error"]) == [r["rel_error"] for r in rows]
    assert sorted(set(measured["step"])) == list(range(0, cfg["steps"], cfg["error_every"]))


def test_a_spectrum_stops_at_float32_precision():
    from commlab.analysis.lowrank import LayerError

    sv = [10.0, 1.0, 1e-3, 1e-7, 1e-30, 1e-49, 0.0]
    le = LayerError("w", (7, 7), 7, 7, [1], [0.0], [0.0], sv)
    fig = lowrank_figs.spectrum(le)
    # σ₁·ε(float32) = 10 · 2⁻²³ ≈ 1.2e-6: 1e-7 and below are rounding noise.
    assert list(fig.data[0].y) == [10.0, 1.0, 1e-3] and list(fig.data[0].x) == [1, 2, 3]
    assert "4 σₖ below σ₁·ε(float32) not drawn" in fig.layout.annotations[-1].text


def test_the_winner_map_has_log_axes_and_a_log_colour_scale():
    from commlab.figures import whatif as whatif_figs

    cells = [{"world_size": n, "bandwidth_gbps": b, "best": "powersgd", "speedup": s}
             for n, b, s in ((2, 1, 1.0), (2, 400, 1.02), (1024, 1, 40.0), (1024, 400, 1.5))]
    fig = whatif_figs.winner_map(cells)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    heat = fig.data[0]
    assert [t.split("<br>")[1] for t in heat.text[1]] == ["×1.02", "×1.50"]  # rows by bandwidth
    assert heat.z[0][1] == pytest.approx(np.log10(40.0))
    # Profiles without a plain allreduce: the fastest hook is named, no speed-up, no colour.
    bare = whatif_figs.winner_map([{**c, "speedup": None} for c in cells]).data[0]
    assert all(t == "A" for row in bare.text for t in row) and not any(map(any, bare.z))
    assert all(n == "powersgd" for row in bare.customdata for n in row) and "A = powersgd" in fig.layout.title.text
