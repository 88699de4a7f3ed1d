"""The formulas and definitions written once (commlab.analysis.ring, commlab.analysis.metrics), and
every place that reads them agreeing with them on the same inputs, so that a second copy cannot
come back unnoticed.  No processes: run folders are written by hand."""
from __future__ import annotations

import ast
import inspect
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from commlab.analysis import metrics, ring
from commlab.config import RunConfig, is_plain_allreduce, label_of
from commlab.engine import run_folder, store
from commlab.hooks.instrument import Link
from commlab.teach import bench, classroom, headroom
from commlab.tune import payoff, sweep, whatif
from commlab.ui import runs as ui_runs

ROOT = Path(__file__).resolve().parents[1]
WORLD_SIZES = range(1, 9)


# ============================================================================ the ring
def test_ring_factor_steps_and_time_by_hand():
    assert [ring.factor(n) for n in (1, 2, 3, 4, 8)] == pytest.approx([0, 1, 4 / 3, 1.5, 1.75])
    assert [ring.steps(n) for n in (1, 2, 4, 8)] == [0, 2, 6, 14]
    assert ring.wire_bytes(1000, 4) == pytest.approx(1500) and ring.wire_bytes(1000, 1) == 0
    # N=4, alpha=10 us, S=1 MB, beta=8 Gb/s = 1 GB/s: 6 latencies, 1.5 MB on the link
    assert ring.allreduce_s(1e6, 4, 8.0, 10.0) == pytest.approx(6 * 10e-6 + 1.5e-3)
    assert ring.allreduce_s(1e6, 4, 8.0, 10.0, collectives=3) == pytest.approx(3 * 6 * 10e-6 + 1.5e-3)
    assert ring.allreduce_s(1e6, 4, 0.0, 0.0) == 0  # bandwidth 0: an infinitely fast link
    assert ring.allreduce_s(1e6, 1, 1.0, 10.0) == 0  # one rank sends nothing


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_ring_trace_sends_what_the_formula_says(n):
    size = 4 * n * 5  # float32s, divisible by N: every chunk the same size
    trace = classroom.ring_trace(np.ones((n, size // 4)).tolist())
    assert len(trace.steps) == ring.steps(n)
    assert trace.bytes_sent == trace.bytes_received == [ring.wire_bytes(size, n)] * n


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_every_reader_of_the_ring_agrees_with_it(n):
    size, bw, lat = 123_456, 10.0, 7.0
    ring_cost, naive_cost = classroom.scheme_costs(size, n)
    assert (ring_cost.steps, ring_cost.max_sent_bytes) == (ring.steps(n), ring.wire_bytes(size, n))
    assert naive_cost.steps == ring.steps(n)
    assert ring.bus_factor("all_reduce", n) == ring.factor(n)
    assert bench.busbw(2e9, n) == 2e9 * ring.factor(n)
    assert bench.busbw(2e9, n, "all_gather") == 2e9 * ring.bus_factor("all_gather", n)
    assert Link(bw, lat).seconds(size, n) == ring.allreduce_s(size, n, bw, lat)
    profile = whatif.HookProfile("p", "powersgd", "none", 0.01, 0.002, size, 3, 2, "r", "loopback", 5)
    assert profile.comm_s(n, bw, lat) == ring.allreduce_s(size, n, bw, lat, collectives=3)


def test_break_even_is_where_the_ring_says_the_saved_bytes_pay_for_the_extra_time():
    base = whatif.HookProfile("allreduce", "allreduce", "none", 0.010, 0.0, 100e6, 1, 2, "a", "loopback", 5)
    psgd = whatif.HookProfile("psgd", "powersgd", "none", 0.010, 0.005, 1e6, 3, 2, "b", "loopback", 5)
    even = payoff.payoff(base, psgd, 64, 5.0).break_even_gbps
    extra = psgd.step_s(64, 0.0, 5.0) - base.step_s(64, 0.0, 5.0)
    assert even * 1e9 / 8 * extra == pytest.approx(ring.wire_bytes(99e6, 64))


def test_no_second_copy_of_the_ring_factor_in_the_package():
    pattern = re.compile(r"2\s*\*\s*\(\s*[A-Za-z_][\w.]*\s*-\s*1\s*\)")  # 2 * (n - 1) in code
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "commlab").rglob("*.py"))
             if p.name != "ring.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, f"the ring's 2(N-1) belongs in commlab/analysis/ring.py, found it at {found}"


# ============================================================================ steady steps
def _records(n=12, start=7):
    """Steps 0-2 slow (start-up); PowerSGD's allreduce steps before ``start`` slower and heavier
    than its compressed ones: every window but the steady one gives other medians."""
    def step_s(i):
        return (1.0, 0.5, 0.2)[i] if i < 3 else 0.3 if i < start else 0.1 + 0.001 * i

    return [{"step": i, "loss": 10.0 - i, "step_s": step_s(i), "t": 0.1 * (i + 1), "hook_s": 0.01,
             "collectives": 3 if i >= start else 1, "payload_bytes": 100 if i >= start else 1000,
             "plain_bytes": 1000, "compression_ratio": 2.0} for i in range(n)]


def test_steady_steps_skip_start_up_and_wait_for_compression():
    psgd = RunConfig(hook="powersgd", start_powerSGD_iter=5).to_dict()
    assert metrics.first_steady_step(psgd) == 5
    assert metrics.first_steady_step({**psgd, "start_powerSGD_iter": 2}) == metrics.WARMUP_STEPS == 3
    assert metrics.first_steady_step({**psgd, "hook": "batched_powersgd", "wrapper": "fp16"}) == 5
    assert metrics.first_steady_step(RunConfig(hook="allreduce", start_powerSGD_iter=50).to_dict()) == 3
    assert metrics.first_steady_step(RunConfig(hook="noop").to_dict(), warmup=0) == 0
    records = _records()
    records[7]["loss"] = math.nan
    assert [r["step"] for r in metrics.steady_rows(records, psgd)] == [5, 6, 8, 9, 10, 11]


def test_headline_figures_by_hand():
    cfg = RunConfig(hook="powersgd", start_powerSGD_iter=7).to_dict()
    records = _records()
    h = metrics.headline(records, cfg)
    assert h == {"final_loss": -1.0, "median_step_s": pytest.approx(0.109), "bytes_per_step": 100,
                 "steady_steps": 5}
    over_run = metrics.headline(records, cfg, final_window=3, bytes_over_run=True)
    assert over_run["final_loss"] == pytest.approx((1 + 0 - 1) / 3)
    assert over_run["bytes_per_step"] == pytest.approx((7 * 1000 + 5 * 100) / 12)
    # A young run has no steady step yet: its figures come from the steps it has.
    young = metrics.headline(records[:2], cfg)
    assert young == {"final_loss": 9.0, "median_step_s": pytest.approx(0.75), "bytes_per_step": 1000,
                     "steady_steps": 0}
    assert metrics.headline([], cfg) == {"final_loss": None, "median_step_s": None,
                                         "bytes_per_step": None, "steady_steps": 0}
    uninstrumented = [{k: r[k] for k in ("step", "loss", "step_s", "t")} for r in records]
    assert metrics.headline(uninstrumented, cfg, bytes_over_run=True)["bytes_per_step"] is None
    assert metrics.headline(uninstrumented, cfg)["bytes_per_step"] is None


def _run_folder(root: Path, name: str, cfg: RunConfig, records: list[dict]) -> run_folder.RunFolder:
    folder = root / name
    folder.mkdir(parents=True)
    store.write_json(folder / "config.json", cfg.to_dict())
    store.write_json(folder / "status.json", {"status": "finished"})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_folder.RunFolder(folder)


def test_every_reader_of_a_runs_figures_agrees_with_the_one_definition(tmp_path):
    cfg = RunConfig(hook="powersgd", start_powerSGD_iter=7, runs_dir=str(tmp_path))
    records = _records()
    run = _run_folder(tmp_path, "20260101-000000-powersgd-abcd", cfg, records)
    want = metrics.headline(records, cfg.to_dict())

    summary = run.summary()
    assert {k: summary[k] for k in want} == want
    (row,) = ui_runs.run_table(str(tmp_path))
    assert {k: row[k] for k in want} == want
    view = ui_runs.LiveView(run.path)
    view.poll()
    live = view.headline()
    assert (live["loss"], live["median_step_s"], live["bytes_per_step"], live["steady_steps"]) == (
        want["final_loss"], want["median_step_s"], want["bytes_per_step"], want["steady_steps"])

    # The sweep reads the same steady median step time; its loss and bytes over its own windows.
    sweep_row = sweep.summarize(records, cfg.to_dict(), "finished", final_window=4)
    over_run = metrics.headline(records, cfg.to_dict(), 4, bytes_over_run=True)
    assert sweep_row["median_step_s"] == want["median_step_s"]
    assert (sweep_row["final_loss"], sweep_row["bytes_per_step"]) == (over_run["final_loss"],
                                                                       over_run["bytes_per_step"])

    # The what-if model reads the steady steps strictly, as they are.
    steady = metrics.steady_rows(records, cfg.to_dict())
    profile = whatif.profile_from_records(records, cfg.to_dict())
    assert profile.steady_steps == len(steady) == want["steady_steps"]
    assert (profile.payload_bytes, profile.collectives) == (want["bytes_per_step"], 3)
    too_short = RunConfig(hook="powersgd", start_powerSGD_iter=20).to_dict()
    with pytest.raises(ValueError, match="no steady steps"):
        whatif.profile_from_records(records, too_short)

    # Headroom reads a run over the same steady steps, from its own ``skip`` on.
    assert inspect.signature(headroom.measure_headroom).parameters["skip"].default == metrics.WARMUP_STEPS


def test_an_averaging_hook_s_bytes_per_step_are_one_figure_for_every_reader(tmp_path):
    """Post-local SGD averages at steps 4, 7, 10 and 13 (from 4, every 3): its steady steps, 4 to
    13, hold four averagings in ten (their mean: 540 bytes), its whole periods one in three (500)."""
    cfg = RunConfig(hook="post_localsgd", start_localSGD_iter=4, averager_warmup_steps=4, averager_period=3,
                    runs_dir=str(tmp_path))
    records = [{"step": i, "loss": 1.0, "step_s": 0.1, "t": 0.1 * (i + 1), "hook_s": 0.01, "plain_bytes": 300,
                "collectives": 2 if i >= 4 and (i - 4) % 3 == 0 else 1,
                "payload_bytes": 300 + (600 if i >= 4 and (i - 4) % 3 == 0 else 0)} for i in range(14)]
    want = metrics.headline(records, cfg.to_dict())["bytes_per_step"]
    assert want == 300 + 600 / 3
    assert whatif.profile_from_records(records, cfg.to_dict()).payload_bytes == want
    view = ui_runs.LiveView(_run_folder(tmp_path, "20260101-000000-post-localsgd-abcd", cfg, records).path)
    view.poll()  # the live view's columns, read with NumPy: the same figure
    assert view.headline()["bytes_per_step"] == want
    # Before a whole period: the mean of the steady steps there are (4, which averages, and 5).
    assert metrics.headline(records[:6], cfg.to_dict())["bytes_per_step"] == (900 + 300) / 2


# ============================================================================ labels and the baseline
def test_one_label_per_meaning_and_one_baseline_test(tmp_path):
    emulated = RunConfig(hook="powersgd", matrix_approximation_rank=2, start_powerSGD_iter=4,
                         emulate_bandwidth_gbps=1.0, emulate_latency_us=20.0).to_dict()
    assert label_of(emulated, link=True) == "powersgd r=2 start=4 [emulated 1 Gb/s, 20 µs]"
    assert label_of(emulated) == "powersgd r=2 start=4"
    assert label_of(RunConfig().to_dict(), link=True) == label_of(RunConfig().to_dict()) == "allreduce"
    assert sweep.summarize([], emulated, "finished")["label"] == label_of(emulated, link=True)

    run = _run_folder(tmp_path, "20260101-000000-powersgd-beef", RunConfig(**{
        k: emulated[k] for k in ("hook", "matrix_approximation_rank", "start_powerSGD_iter")}), [])
    assert ui_runs.picker_label(run) == "powersgd r=2 start=4 · beef"

    for cfg, plain in ((RunConfig(), True), (RunConfig(wrapper="fp16"), False),
                       (RunConfig(hook="fp16"), False), (RunConfig(hook="powersgd"), False)):
        d = cfg.to_dict()
        assert is_plain_allreduce(d) is plain
        assert sweep.summarize([], d, "finished")["baseline"] is plain
        assert (whatif.loopback_s_per_byte(_records(), d) is not None) is plain
    profiles = [whatif.HookProfile("p", "powersgd", "none", 0.01, 0.0, 1.0, 1, 2, "a", "loopback", 5),
                whatif.HookProfile("a", "allreduce", "none", 0.01, 0.0, 1.0, 1, 2, "b", "loopback", 5)]
    assert whatif.baseline_profile(profiles) is profiles[1]


# ============================================================================ approximation error
def test_relative_error():
    exact = torch.tensor([3.0, 4.0])
    assert metrics.relative_error(exact, exact) == 0
    assert metrics.relative_error(2 * exact, exact) == pytest.approx(1.0)
    assert metrics.relative_error(torch.tensor([3.0, 0.0]), exact) == pytest.approx(4 / 5)
    assert metrics.relative_error(torch.zeros(2), torch.zeros(2)) == 0
    assert metrics.relative_error(torch.ones(2), torch.zeros(2)) == math.inf


def _imports_at_load(module: str, seen: set[str] | None = None) -> set[str]:
    """Every module ``import module`` loads: its own module-level imports, commlab's followed."""
    seen = set() if seen is None else seen
    parts = module.split(".")
    path = ROOT.joinpath(*parts).with_suffix(".py")
    if not path.exists():
        path = ROOT.joinpath(*parts, "__init__.py")
    packages = [".".join(parts[:i]) for i in range(1, len(parts))]
    found = set(packages)
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names
                      if ROOT.joinpath(*node.module.split("."), f"{a.name}.py").exists()}
    for name in found - seen:
        seen.add(name)
        if name.split(".")[0] == "commlab":
            _imports_at_load(name, seen)
    return seen


def test_the_hooks_hot_path_imports_no_analysis_beyond_ring_and_metrics():
    loaded = _imports_at_load("commlab.hooks.instrument")
    assert "commlab.analysis.lowrank" not in loaded
    assert {"commlab.analysis.ring", "commlab.analysis.metrics"} <= loaded
    heavy = {"numpy", "pandas", "torch", "scipy"}
    assert not {m.split(".")[0] for m in _imports_at_load("commlab.analysis.metrics")} & heavy
    assert not {m.split(".")[0] for m in _imports_at_load("commlab.analysis.ring")} & heavy


# ============================================================================ the live charts' points
def test_the_live_charts_draw_a_bounded_number_of_points_and_keep_a_spike(tmp_path):
    """A 100,000-step run: the live view's frame holds a bounded number of rows however long the
    run, every one of the latest steps, and the history's extremes (a spike's shape survives)."""
    n = 100_000
    records = [{"step": s, "loss": 2.0 - s / n, "step_s": 0.02 + (1.5 if s == 43_210 else 0.0), "t": s * 0.02,
                "payload_bytes": 1000, "plain_bytes": 4000, "compression_ratio": 4.0, "hook_s": 0.01}
               for s in range(n)]
    run = _run_folder(tmp_path, "20260101-000000-long-beef", RunConfig(runs_dir=str(tmp_path)), records)
    view = ui_runs.LiveView(run.path)
    assert view.poll() == n
    frame = view.frame()
    assert len(frame) <= len(ui_runs.CHARTED) * ui_runs.CHART_POINTS and len(frame) < 5_000
    assert list(frame["step"][-ui_runs.RECENT_POINTS:]) == list(range(n - ui_runs.RECENT_POINTS, n))
    assert 43_210 in set(frame["step"]) and frame["step_s"].max() == pytest.approx(1.52)
    assert frame["step"].is_monotonic_increasing
    assert len(view.frame(bounded=False)) == n
    short = _run_folder(tmp_path, "20260101-000000-short-beef", RunConfig(runs_dir=str(tmp_path)), records[:500])
    view = ui_runs.LiveView(short.path)
    view.poll()
    assert len(view.frame()) == 500  # a short run: every point


# ============================================================================ the compressors' definitions
# Written once, in each compressor's row (HookSpec.definition; tests/test_grace.py holds them to
# GRACE's code); every place that shows them asks the row.
def _compressors() -> list[str]:
    from commlab.hook_specs import COMPRESSOR, hooks_of

    return list(hooks_of(COMPRESSOR))


def _retold(monkeypatch, hook: str) -> str:
    """``hook``'s row given a definition no page could have typed: what a page shows must follow it."""
    import dataclasses

    from commlab import hook_specs

    spec = hook_specs.SPECS[hook]
    marker = f"retold-{hook}-in-the-row"
    monkeypatch.setitem(hook_specs.SPECS, hook, dataclasses.replace(
        spec, definition=dataclasses.replace(spec.definition, choice=marker)))
    return marker


def test_every_compressor_has_a_definition_and_only_the_compressors():
    from commlab.hook_specs import SPECS
    from commlab.ui import definitions

    assert len(_compressors()) == 11 and definitions.defined() == tuple(_compressors())
    assert all(SPECS[h].definition is None for h in SPECS if h not in _compressors())
    for hook in _compressors():
        text = definitions.explain(hook)
        d = SPECS[hook].definition
        assert all(getattr(d, part) in text for part, _ in definitions.PARTS)
    assert definitions.explain("powersgd") is None and definitions.explain("nonesuch") is None


def test_the_launch_page_shows_the_chosen_compressors_definition_from_its_row(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from commlab.ui import definitions

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.run()
    titles = lambda: [e.label for e in at.expander]  # noqa: E731
    assert not any("against its paper" in t for t in titles())  # allreduce: no definition
    marker = _retold(monkeypatch, "randomk")
    for hook in _compressors():
        at.selectbox(key="f_hook").set_value(hook).run()
        assert not at.exception, [e.value for e in at.exception]
        assert f"What {hook} sends, against its paper and GRACE" in titles()
        shown = [m.value for m in at.markdown if m.value == definitions.explain(hook)]
        assert len(shown) == 1, hook
        assert (marker in shown[0]) == (hook == "randomk")
    assert "definition" in at.selectbox(key="f_hook").help


def test_the_compare_page_explains_the_compressors_it_compares_from_their_rows(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from commlab.ui import definitions

    for hook in ("topk", "randomk", "allreduce"):
        _run_folder(tmp_path, f"20260101-00000{len(hook)}-{hook}-beef",
                    RunConfig(hook=hook, workload="mlp", runs_dir=str(tmp_path)), _records())
    marker = _retold(monkeypatch, "topk")
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.run()
    at.switch_page("pages/compare.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert set(at.dataframe[0].value["hook"]) == {"topk", "randomk", "allreduce"}
    (box,) = [e for e in at.expander if "against its paper and GRACE" in e.label]
    said = [m.value for m in box.markdown]
    assert sorted(said) == [f"#### {h}\n\n{definitions.explain(h)}" for h in ("randomk", "topk")]
    assert any(marker in m for m in said) and not any("allreduce" in m.split("\n")[0] for m in said)
    assert "n/k" in " ".join(said)  # random-k's unbiased scaling, the lab's own choice, said


def test_commlab_hooks_prints_every_definition_from_the_rows(capsys, monkeypatch):
    from dataclasses import asdict

    from commlab import cli
    from commlab.hook_specs import SPECS
    from commlab.ui import definitions

    marker = _retold(monkeypatch, "dgc")
    assert cli.main(["hooks", "--backend", "gloo"]) == 0
    text = capsys.readouterr().out
    assert all(definitions.plain(h) in text for h in _compressors()) and marker in text
    assert cli.main(["hooks", "--backend", "gloo", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["definitions"] == {h: asdict(SPECS[h].definition) for h in _compressors()}
    assert cli.main(["hooks", "--definitions"]) == 0
    assert capsys.readouterr().out.strip() == definitions.table()


def test_docs_hooks_holds_the_definitions_table_as_the_rows_print_it():
    from commlab.ui import definitions

    table = definitions.table()
    assert table.count("\n") == 1 + len(_compressors())
    assert table in (ROOT / "docs" / "hooks.md").read_text(), (
        "docs/hooks.md's definitions table differs from the hook table: paste `commlab hooks --definitions`")
