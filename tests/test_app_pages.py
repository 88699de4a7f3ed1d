"""AppTest of app.py's navigation and sidebar, the one run picker, and the Launch and watch, Buckets
and Runs pages: with no runs, with the session's real short runs (every number on the page checked
against the run folder), and with a stand-in "running" run whose supervisor is a sleeping child
process, so that re-attaching, Stop and launching from two tabs are tested without starting
torchrun; and the Classroom and Bandwidth buttons that tests/test_classroom.py does not press."""
from __future__ import annotations

import ast
import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
import torch
from streamlit.testing.v1 import AppTest

import lab_widgets
from commlab import api
from commlab.analysis import buckets, metrics, units
from commlab.config import RunConfig, settings
from commlab.engine import launch, machine, procs, store
from commlab.figures import runs as figures_runs
from commlab.teach import headroom
from commlab.ui import form, lowrank_view, runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = os.path.join(ROOT, "app.py")
LAUNCH, BUCKETS, RUNS = "pages/launch_and_watch.py", "pages/buckets.py", "pages/runs.py"
LOWRANK, WHATIF = "pages/low_rank_error.py", "pages/what_if.py"
TIMEOUT = 900  # the first run imports torch: minutes on a loaded machine


# ---------------------------------------------------------------------------- helpers
def open_app(monkeypatch, runs_dir, page: str = LAUNCH, watch: str | None = None) -> AppTest:
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(runs_dir))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    if watch:
        at.session_state["watch"] = str(watch)
    at.run()
    if page != LAUNCH:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def charts(at: AppTest) -> list[dict]:
    """Every plotly chart on the page as its figure JSON, plotly 7's packed arrays decoded."""
    def unpack(v):
        if isinstance(v, dict) and "bdata" in v:
            return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
        if isinstance(v, dict):
            return {k: unpack(x) for k, x in v.items()}
        if isinstance(v, list):
            return [unpack(x) for x in v]
        return v

    return [unpack(json.loads(c.proto.spec)) for c in at.get("plotly_chart")]


def live_chart(at: AppTest) -> dict:
    return next(c for c in charts(at) if any(t.get("name") == "loss" for t in c["data"]))


def texts(at: AppTest) -> str:
    return "\n".join(str(getattr(e, "value", "")) for e in
                     [*at.markdown, *at.caption, *at.info, *at.error, *at.warning, *at.success])


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def selectbox(at: AppTest, label: str):
    return next(s for s in at.selectbox if s.label == label)


def navigation() -> dict[str, list[tuple[str, str]]]:
    """app.py's SECTIONS table (section -> [(file, title)]), read as data: running app.py needs a
    Streamlit session."""
    tree = ast.parse(Path(APP).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", None) == "SECTIONS")
    return ast.literal_eval(node.value)


@pytest.fixture
def sleeper():
    """A child process standing in for a run's supervisor: alive until the test ends it."""
    procs = []

    def start(*argv: str):
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", *argv])
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def fake_running_run(runs_dir, sleeper, steps_written: int = 3, **settings) -> api.Run:
    """A run folder made by the real launcher's prepare(), 'supervised' by a sleeping child."""
    cfg = RunConfig(runs_dir=str(runs_dir), workload="mlp", steps=50, **settings)
    folder = launch.prepare(cfg)
    proc = psutil.Process(sleeper(str(folder.path.resolve())).pid)  # the run folder in its argv, as a supervisor's
    store.write_json(folder.file("supervisor.json"), {
        "pid": proc.pid, "create_time": proc.create_time(), "torchrun_pid": None, "worker_pids": []})
    append_steps(folder, range(steps_written))
    return api.open_run(folder.path)


def append_steps(folder, steps) -> None:
    with open(folder.file("metrics.jsonl"), "a") as f:
        for s in steps:
            f.write(json.dumps({"step": s, "loss": 2.0 - 0.01 * s, "step_s": 0.1 + 0.001 * s,
                                "t": 0.1 * (s + 1), "payload_bytes": 1000, "plain_bytes": 4000,
                                "compression_ratio": 4.0, "hook_s": 0.01}) + "\n")


# ---------------------------------------------------------------------------- no runs
def test_every_page_says_what_to_do_first_without_runs(tmp_path, monkeypatch):
    at = open_app(monkeypatch, tmp_path / "none-yet")
    desc = machine.describe()
    assert at.sidebar.code[0].value == os.path.abspath(tmp_path / "none-yet")
    side = " ".join(c.value for c in at.sidebar.caption)
    assert desc["backend"] in side and torch.__version__ in side and f"{desc['gpus']} CUDA GPU" in side
    assert "No runs yet" in texts(at) and "Launch" in texts(at)
    assert at.expander[0].proto.expanded  # the form is open: there is nothing to watch yet
    for page in (BUCKETS, RUNS):
        at.switch_page(page).run()
        assert not at.exception, [e.value for e in at.exception]
        assert "No runs yet" in texts(at)
        assert not at.get("plotly_chart")


def test_every_section_of_the_navigation_opens_without_runs(tmp_path, monkeypatch):
    sections = navigation()
    assert list(sections) == ["Run", "Understand", "Teach", "Tune and export"]
    listed = [file for pages in sections.values() for file, _ in pages]
    assert sorted(listed) == sorted(f"pages/{p.name}" for p in Path(ROOT, "pages").glob("*.py"))
    at = open_app(monkeypatch, tmp_path / "none-yet")
    for pages in sections.values():
        for file, title in pages:
            at.switch_page(file).run()  # raises unless st.navigation registered the file
            assert not at.exception, (file, [e.value for e in at.exception])
            assert at.title[0].value.startswith(title), (file, at.title[0].value)
            if file in (LAUNCH, RUNS, LOWRANK, BUCKETS, WHATIF):  # the pages that show runs
                assert at.info, file


def test_invalid_settings_are_shown_under_their_field_and_block_launch(tmp_path, monkeypatch):
    at = open_app(monkeypatch, tmp_path)
    at.selectbox(key="f_hook").set_value("powersgd").run()  # enables the PowerSGD fields
    at.number_input(key="f_steps").set_value(0)
    at.number_input(key="f_start_powerSGD_iter").set_value(1)
    at.run()
    expected = RunConfig(hook="powersgd", steps=0, start_powerSGD_iter=1).errors()
    order = list(at.main)
    for key, field in (("f_steps", "steps"), ("f_start_powerSGD_iter", "start_powerSGD_iter")):
        at_widget = next(i for i, n in enumerate(order) if getattr(n, "key", None) == key)
        following = order[at_widget + 1]
        assert following.type == "error" and following.value == expected[field]
    assert at.button(key="launch").disabled
    at.number_input(key="f_steps").set_value(30)
    at.number_input(key="f_start_powerSGD_iter").set_value(4)
    at.run()
    assert not at.error and not at.button(key="launch").disabled
    assert "Hook implementation: **commlab**" in texts(at)  # PowerSGD on Gloo: commlab's variant
    assert not list(tmp_path.iterdir())  # nothing launched


def test_every_bad_field_is_named_at_once_with_a_wrong_type_among_them(tmp_path, monkeypatch):
    """Seven bad fields, one of them text where step numbers go: all seven are named, each under
    its own widget, and no rule between settings is judged on a field that is itself wrong."""
    at = open_app(monkeypatch, tmp_path)
    bad = {"f_steps": 0, "f_world_size": 0, "f_batch_size": 0, "f_lr": 0.0, "f_bucket_cap_mb": 0.0,
           "f_stall_timeout_s": 0.0}
    for key, value in bad.items():
        at.number_input(key=key).set_value(value)
    at.text_input(key="f_save_grads_at").set_value("500, x")
    at.run()
    order = list(at.main)
    named = {}
    for key in [*bad, "f_save_grads_at"]:
        i = next(i for i, n in enumerate(order) if getattr(n, "key", None) == key)
        assert order[i + 1].type == "error", key
        named[key[2:]] = order[i + 1].value
    assert named["save_grads_at"] == "must be a list of step numbers, got ['500', 'x']"
    assert named["steps"].startswith("must be at least 1")
    assert "0..-1" not in texts(at) and "from 0 to -1" not in texts(at)
    summary = next(e.value for e in at.error if e.value.startswith("Fix 7 setting(s)"))
    assert all(f"**{name}**" in summary for name in named)
    assert at.button(key="launch").disabled


def test_checked_names_each_bad_field_and_skips_rules_on_wrong_fields():
    cfg, errors = RunConfig.checked({"steps": 0, "save_grads_at": [500]})
    assert cfg is not None and set(errors) == {"steps"}  # no range from a steps that is wrong
    cfg, errors = RunConfig.checked({"steps": 100, "save_grads_at": [500, 3]})
    assert errors == {"save_grads_at": "each step must be from 0 to 99 (steps is 100; they count "
                                       "from 0), got [500]"}
    cfg, errors = RunConfig.checked({"hook": "nope", "wrapper": "fp16", "steps": "x", "lr": -1,
                                     "start_powerSGD_iter": 1, "bogus": 1})
    assert cfg is None and set(errors) == {"hook", "steps", "lr", "bogus"}
    assert RunConfig.checked({})[1] == RunConfig().errors() == {}


def test_form_labels_wrap_between_words_and_the_help_names_the_setting():
    for s in settings():
        w = form.widget(s)
        assert "_" not in w.label, w.label  # a label breaks only between words
        assert f"`{s.name}`" in w.kwargs["help"] and s.flag in w.kwargs["help"]
    by_name = {s.name: s for s in settings()}
    assert form.readable_label(by_name["stall_timeout_s"]) == "stall timeout (s)"
    assert form.readable_label(by_name["orthogonalization_epsilon"]) == "orthogonalization epsilon"
    assert "PowerSGDState's argument `orthogonalization_epsilon`" in \
        form.widget(by_name["orthogonalization_epsilon"]).kwargs["help"]


# ---------------------------------------------------------------------------- real runs
def test_watch_panel_shows_the_run_folders_numbers(runs_dir, powersgd_run, monkeypatch):
    at = open_app(monkeypatch, runs_dir, watch=powersgd_run.path)
    s = powersgd_run.summary()
    rows = powersgd_run.metrics_records()
    assert len(rows) == rows[-1]["step"] + 1 == s["steps_planned"]  # finished: every step done
    assert f"**Status: {s['status']}** · {len(rows)} of {s['steps_planned']} steps done" in texts(at)
    assert metric(at, "loss") == f"{s['final_loss']:.4f}"
    assert metric(at, "median step time") == units.seconds(s["median_step_s"])
    assert metric(at, "bytes per step (median)") == units.human_bytes(s["bytes_per_step"])
    assert metric(at, metrics.STEADY_RATIO) == f"{s['steady_compression_ratio']:.2f}×"
    assert f"Last point on the charts: step {rows[-1]['step']} (steps count from 0) · loss {s['final_loss']:.4f}" in texts(at)
    meta = powersgd_run.meta()
    assert meta["hook_impl"] == "commlab"  # PowerSGD on Gloo with several buckets
    assert (f"Hook implementation that ran on gloo: **commlab's** (commlab). "
            f"Why: {meta['hook_reason']}.") in texts(at)
    assert f"Loss: {lab_widgets.literal(meta['loss'])}." in texts(at)  # which loss trained

    traces = {t["name"]: t for t in live_chart(at)["data"]}
    assert traces["loss"]["x"] == [r["step"] for r in rows]
    for name, column in (("loss", "loss"), ("whole step", "step_s"),
                         ("in the hook (first bucket in to last out)", "hook_s"),
                         ("plain allreduce would send", "plain_bytes"),
                         ("this hook sent", "payload_bytes"), ("compression ratio", "compression_ratio")):
        assert traces[name]["y"] == [r[column] for r in rows], name
    assert not [b for b in at.button if b.key == "stop"]  # an ended run has no Stop


def test_buckets_page_draws_the_run_folders_layouts(runs_dir, powersgd_run, monkeypatch):
    at = open_app(monkeypatch, runs_dir, page=BUCKETS, watch=powersgd_run.path)
    recorded = powersgd_run.buckets()
    assert buckets.bucket_story(recorded) in texts(at)
    fig = charts(at)[0]
    assert [a["text"] for a in fig["layout"]["annotations"][:2]] == ["iteration 0", "after the rebuild"]
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    cap = int(recorded["bucket_cap_mb"] * 1024 * 1024)
    unit = re.fullmatch(r"bucket size \((\w+)\)", fig["layout"]["xaxis"]["title"]["text"])[1]
    per_unit = 1024 ** units.BINARY_UNITS.index(unit)
    assert f"({units.human_bytes(cap)} = bucket_cap_mb" in texts(at)
    for bar, key, table in zip(bars, ("iter0", "rebuilt"), at.dataframe):
        layout = sorted(recorded[key], key=lambda b: b["index"])
        # Segments of one bar add up to its bucket's bytes, parameter by parameter.
        totals = {}
        for y, x, name in zip(bar["y"], bar["x"], bar["text"]):
            totals.setdefault(y, []).append((name, x))
        assert [sum(x for _, x in segs) for segs in totals.values()] == \
               pytest.approx([b["bytes"] / per_unit for b in layout])
        assert [[n for n, _ in segs] for segs in totals.values()] == \
               [[p["name"] for p in b["params"]] for b in layout]
        assert [y.endswith("· last") for y in totals] == [b["is_last"] for b in layout]
        df = table.value
        assert list(df["bytes"]) == [b["bytes"] for b in layout]
        assert list(df["share of cap"]) == pytest.approx([b["bytes"] / cap for b in layout])
    assert len(recorded["rebuilt"]) > len(recorded["iter0"])  # the cap split the rebuilt layout
    assert "DDP's own bucket_sizes [{}] agrees with the iteration 0 layout".format(", ".join(
        str(b["bytes"]) for b in recorded["iter0"])) in texts(at)
    assert "rebuilt_bucket_sizes" in texts(at) and "differs" not in texts(at)


def test_buckets_page_draws_each_traced_step_it_offers(runs_dir, powersgd_run, monkeypatch):
    at = open_app(monkeypatch, runs_dir, page=BUCKETS, watch=powersgd_run.path)
    steps = list(powersgd_run.timeline()["steps"])
    assert selectbox(at, "traced step").options == steps
    for step in steps:
        selectbox(at, "traced step").set_value(step).run()
        assert not at.exception, [e.value for e in at.exception]
        names = {t.get("name") for t in charts(at)[-1]["data"]}
        assert names >= {"backward", "hook call (gradients ready)", "hook's allreduce"}, (step, names)
    assert [b.proto.label for b in at.get("download_button")][0].startswith("Download trace.json")


def test_runs_page_table_and_overlays_equal_the_run_folders(runs_dir, monkeypatch):
    at = open_app(monkeypatch, runs_dir, page=RUNS)
    table = at.dataframe[0].value
    listed = api.list_runs(runs_dir)
    assert list(table["run_id"]) == [r.id for r in listed]
    for run, (_, row) in zip(listed, table.iterrows()):
        s = run.summary()
        for col in ("status", "hook", "hook_impl", "steps", "final_loss", "median_step_s",
                    "bytes_per_step", "compression_ratio"):
            assert row[col] == s[col], col
        cfg = run.config_dict()
        if cfg["hook"] in ("powersgd", "batched_powersgd"):
            assert row["min_compression_rate"] == cfg["min_compression_rate"]
            assert row["rank"] == cfg["matrix_approximation_rank"]
        else:  # PowerSGD's settings mean nothing for another hook: blank
            assert pd.isna(row["min_compression_rate"]) and pd.isna(row["rank"])
    overlays = [c for c in charts(at) if c["layout"]["title"]["text"].startswith("Loss against")]
    assert [c["layout"]["title"]["text"] for c in overlays] == [
        "Loss against step", "Loss against wall time", "Loss against bytes sent"]
    for trace, run in zip(overlays[2]["data"], listed):
        rows = run.metrics_records()
        assert trace["name"] == runs.picker_label(run)
        assert trace["y"] == [r["loss"] for r in rows]
        assert trace["x"] == list(np.cumsum([r["payload_bytes"] for r in rows]))
    assert overlays[1]["data"][0]["x"] == [r["t"] for r in listed[0].metrics_records()]


def test_runs_page_tracker_filters_smooths_diffs_names_and_exports(runs_dir, powersgd_run,
                                                                   allreduce_run, tmp_path, monkeypatch):
    mine = tmp_path / "runs"
    for run in (powersgd_run, allreduce_run):
        shutil.copytree(run.path, mine / run.id)
    psgd, base = api.open_run(mine / powersgd_run.id), api.open_run(mine / allreduce_run.id)
    at = open_app(monkeypatch, mine, page=RUNS)
    assert len(at.dataframe[0].value) == 2
    # Filter by hook: the table and every picker below keep only those runs.
    at.multiselect(key="filter_hook").set_value(["allreduce"]).run()
    assert list(at.dataframe[0].value["run_id"]) == [base.id]
    assert "1 of 2 runs shown" in texts(at)
    assert selectbox(at, "Run to delete").options == [lab_widgets.run_name(c) for c in
                                                      runs.run_choices(mine) if c["path"] == str(base.path)]
    at.multiselect(key="filter_hook").set_value([]).run()

    # Smoothing draws the moving average over the faded raw curve; log axes on request.
    at.slider(key="smoothing").set_value(0.6)
    at.toggle(key="log_y").set_value(True)
    at.toggle(key="log_x").set_value(True)
    at.run()
    step_chart = next(c for c in charts(at) if c["layout"]["title"]["text"].startswith("Loss against step"))
    assert step_chart["layout"]["yaxis"]["type"] == "log" == step_chart["layout"]["xaxis"]["type"]
    raw = {t["name"]: t for t in step_chart["data"]}
    label = runs.picker_label(psgd)
    losses = [r["loss"] for r in psgd.metrics_records()]
    assert raw[f"{label} (raw)"]["y"] == losses
    assert raw[label]["y"] == pytest.approx(list(figures_runs.smoothed(losses, 0.6)))
    assert raw[label]["y"][0] == losses[0] and raw[label]["y"] != losses

    # Two runs' settings side by side: the ones that differ, or every one.
    at.selectbox(key="diff_a").set_value(str(psgd.path))
    at.selectbox(key="diff_b").set_value(str(base.path))
    at.run()
    diff = at.dataframe[1].value
    assert "hook" in list(diff["setting"]) and "steps" not in list(diff["setting"])
    row = diff[diff["setting"] == "hook"].iloc[0]
    assert (row["first"], row["second"]) == ("powersgd", "allreduce")
    at.toggle(key="diff_every").set_value(True).run()
    assert len(at.dataframe[1].value) == len(psgd.config_dict())

    # A name and a note, stored in the run folder; every picker shows the name.
    selectbox(at, "Run").set_value(str(psgd.path)).run()
    next(t for t in at.text_input if t.label == "Name").input("baseline-beater")
    next(t for t in at.text_area if t.label == "Note").input("rank 2 was enough")
    next(b for b in at.button if b.label == "Save name and note").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert psgd.notes() == {"name": "baseline-beater", "note": "rank 2 was enough"}
    assert runs.picker_label(psgd).startswith("baseline-beater: powersgd")
    assert "baseline-beater" in list(at.dataframe[0].value["name"])

    # The metrics as CSV: every step, every field.
    assert at.get("download_button")
    frame = pd.read_csv(io.BytesIO(runs.metrics_csv(psgd.path)))
    assert list(frame["step"]) == [r["step"] for r in psgd.metrics_records()]
    assert list(frame["loss"]) == pytest.approx(losses)


def test_the_three_compression_ratios_by_hand():
    cfg = RunConfig(hook="powersgd", start_powerSGD_iter=5).to_dict()
    # Steps 0-4 plain allreduce (1000 of 1000 bytes), 5-9 compressed (40 bytes).
    rows = [{"step": i, "loss": 1.0, "plain_bytes": 1000, "payload_bytes": 1000 if i < 5 else 40,
             "compression_ratio": 1000 * (i + 1) / (1000 * min(i + 1, 5) + 40 * max(i - 4, 0))}
            for i in range(10)]
    assert metrics.steady_compression_ratio(rows, cfg) == pytest.approx(25.0)
    assert metrics.cumulative_compression_ratio(rows) == pytest.approx(10_000 / 5_200)
    assert metrics.steady_compression_ratio(rows[:5], cfg) is None  # not compressing yet
    assert metrics.cumulative_compression_ratio([]) is None
    uninstrumented = [{k: r[k] for k in ("step", "loss")} for r in rows]
    assert metrics.steady_compression_ratio(uninstrumented, cfg) is None


def test_steady_state_ratio_is_the_rules_prediction_on_a_real_run(powersgd_run):
    """The three compression ratios of one run: the rule's prediction from the shapes equals the
    ratio measured over the steady steps (per-tensor PowerSGD: P and Q of the compressed
    tensors, the others whole); the cumulative one counts the allreduce warm-up too, so it is
    lower, by exactly the bytes of those steps."""
    from commlab.analysis import shapes
    from commlab.analysis.rule import apply_rule

    cfg, rows = powersgd_run.config_dict(), powersgd_run.metrics_records()
    predicted = apply_rule(shapes.from_workload(cfg["workload"]), cfg["matrix_approximation_rank"],
                           cfg["min_compression_rate"]).predicted_ratio
    steady = metrics.steady_compression_ratio(rows, cfg)
    assert steady == pytest.approx(predicted, rel=1e-9)
    assert powersgd_run.summary()["steady_compression_ratio"] == steady
    cumulative = metrics.cumulative_compression_ratio(rows)
    assert cumulative == pytest.approx(sum(r["plain_bytes"] for r in rows)
                                       / sum(r["payload_bytes"] for r in rows))
    assert 1 < cumulative < steady


def test_delete_asks_first_then_removes_only_that_run(runs_dir, powersgd_run, allreduce_run,
                                                      tmp_path, monkeypatch):
    mine = tmp_path / "runs"
    for run in (powersgd_run, allreduce_run):
        shutil.copytree(run.path, mine / run.id)
    at = open_app(monkeypatch, mine, page=RUNS)
    victim = str(mine / powersgd_run.id)
    selectbox(at, "Run to delete").set_value(victim)
    at.button(key="delete").click().run()
    assert os.path.isdir(victim) and "cannot be undone" in texts(at)
    at.button(key="delete_no").click().run()
    assert os.path.isdir(victim) and "cannot be undone" not in texts(at)
    at.button(key="delete").click().run()
    at.button(key="delete_yes").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not os.path.exists(victim) and os.path.isdir(mine / allreduce_run.id)
    assert f"Deleted run {powersgd_run.id}." in texts(at)
    assert list(at.dataframe[0].value["run_id"]) == [allreduce_run.id]


def test_the_run_picker_remembers_the_chosen_run_across_pages(runs_dir, powersgd_run, allreduce_run,
                                                               monkeypatch):
    choices = runs.run_choices(runs_dir)
    names = [lab_widgets.run_name(c) for c in choices]
    psgd, baseline = str(powersgd_run.path), str(allreduce_run.path)
    at = open_app(monkeypatch, runs_dir, page=BUCKETS)  # a fresh session: the first choice
    assert selectbox(at, "Run").value == choices[0]["path"] and selectbox(at, "Run").options == names
    other = next(c["path"] for c in choices[1:])
    selectbox(at, "Run").set_value(other).run()
    at.switch_page(LAUNCH).run()
    assert selectbox(at, "Watching").value == other and selectbox(at, "Watching").options == names
    assert str(at.session_state["views"][other].run.path) == other  # the live panel shows it
    at.switch_page(RUNS).run()
    assert selectbox(at, "Run to delete").value == other
    overlay = next(m for m in at.multiselect if m.label == "Runs to overlay")
    assert overlay.options == names  # the overlay names runs the same way

    # Low-rank error offers only the runs that saved gradients or measured errors; showing one
    # of those does not make the other pages forget a run it leaves out.
    selectbox(at, "Run to delete").set_value(baseline).run()
    at.switch_page(LOWRANK).run()
    assert not at.exception, [e.value for e in at.exception]
    offered = lowrank_view.choices(runs_dir)
    assert [c["path"] for c in offered] == [psgd]
    assert selectbox(at, "Run").value == psgd
    assert selectbox(at, "Run").options == [lab_widgets.run_name(c) for c in offered]
    at.switch_page(BUCKETS).run()
    assert selectbox(at, "Run").value == baseline
    at.switch_page(WHATIF).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.multiselect[0].options == names and at.multiselect[0].value == [c["path"] for c in choices]


# ---------------------------------------------------------------------------- a "running" run
@pytest.mark.slow
def test_reload_reattaches_refreshes_from_new_lines_and_stops(tmp_path, monkeypatch, sleeper):
    runs = tmp_path / "runs"
    running = fake_running_run(runs, sleeper)
    at = open_app(monkeypatch, runs)  # a fresh session, as after a reload or a restart
    assert "**Status: running** · 3 of 50 steps done" in texts(at)
    assert not at.expander[0].proto.expanded  # the form is folded: the live panel is in view
    view = at.session_state["views"][str(running.path)]
    assert len(view.rows) == 3
    append_steps(running, range(3, 7))
    with open(running.file("metrics.jsonl"), "a") as f:
        f.write('{"step": 7, "loss"')  # half a line: not read until it is complete
    at.run()
    assert [r["step"] for r in view.rows] == list(range(7))
    assert live_chart(at)["data"][0]["x"] == list(range(7))
    assert "Last point on the charts: step 6 (steps" in texts(at)

    supervisor = store.read_json(running.file("supervisor.json"))["pid"]
    at.button(key="stop").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert running.status() == "stopped" and not procs.alive(supervisor)
    assert "**Status: stopped**" in texts(at)
    # A Stop the person asked for is news, not a failure: no red box, now or on a later visit.
    assert "Stopped by the user after 7 steps." in texts(at) and not at.error
    later = open_app(monkeypatch, runs)
    assert "**Status: stopped**" in texts(later) and not later.error


@pytest.mark.slow
def test_a_run_whose_processes_died_is_listed_as_lost(tmp_path, monkeypatch, sleeper):
    runs = tmp_path / "runs"
    gone = fake_running_run(runs, sleeper)
    pid = store.read_json(gone.file("supervisor.json"))["pid"]
    psutil.Process(pid).kill()
    psutil.Process(pid).wait()
    at = open_app(monkeypatch, runs, page=RUNS)
    assert list(at.dataframe[0].value["status"]) == ["lost"]


@pytest.mark.slow
def test_two_tabs_launching_the_same_settings_get_one_run(tmp_path, monkeypatch, sleeper):
    runs = tmp_path / "runs"
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(runs))
    tabs = [AppTest.from_file(APP, default_timeout=TIMEOUT).run() for _ in range(2)]
    for at in tabs:
        at.selectbox(key="f_workload_builtin").set_value("mlp")
        at.number_input(key="f_steps").set_value(50)
        at.run()
    # A run with the tabs' settings, standing in for one already started (no torchrun here).
    first = fake_running_run(runs, sleeper)
    for at in tabs:
        at.button(key="launch").click().run()
        assert not at.exception, [e.value for e in at.exception]
        assert "already going" in texts(at)
        assert at.session_state["watch"] == str(first.path)
    assert [r.id for r in api.list_runs(runs)] == [first.id]


@pytest.mark.slow
def test_launch_is_one_run_under_concurrent_requests(tmp_path, monkeypatch, sleeper):
    """Two sessions racing: the check and the start are serialized by the lock file."""
    runs = tmp_path / "runs"
    cfg = RunConfig(runs_dir=str(runs), workload="mlp", steps=50)
    started = []

    def slow_launch(c, request_id=None, slurm=None):
        time.sleep(0.5)  # a slow start widens the window in which a second request could slip in
        run = fake_running_run(runs, sleeper)
        started.append(run)
        return run

    monkeypatch.setattr(launch, "start", slow_launch)  # what form.launch calls to start a run
    results = []
    threads = [threading.Thread(target=lambda: results.append(form.launch(cfg, "tab"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(started) == 1
    assert {str(run.path) for run, _ in results} == {str(started[0].path)}
    assert sorted(new for _, new in results) == [False, False, True]


# ---------------------------------------------------------------------------- buttons of the Teach pages
@pytest.mark.slow
def test_classroom_ring_check_and_gradient_averaging_buttons(tmp_path, monkeypatch):
    at = open_app(monkeypatch, tmp_path, page="pages/classroom.py")
    assert "Not run on real processes with these inputs yet" in texts(at)
    next(b for b in at.button if b.label == "Run dist.all_reduce on these inputs").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("The ring simulation equals dist.all_reduce on 3 real rank(s)" in m.value
               for m in at.success)
    next(b for b in at.button if b.label == "Train on real processes").click().run()
    assert not at.exception, [e.value for e in at.exception]
    demo = at.session_state["grad_averaging"]
    assert demo.max_grad_diff <= 1e-6 and len(demo.rows) == demo.steps + 1
    assert any(f"over {demo.steps} steps and {demo.world_size} ranks" in m.value for m in at.success)


@pytest.mark.slow
def test_bandwidth_headroom_button_runs_noop_and_allreduce(tmp_path, monkeypatch):
    at = open_app(monkeypatch, tmp_path / "runs", page="pages/bandwidth.py")
    next(s for s in at.slider if s.label == "Steps per run").set_value(10)
    at.slider(key="headroom_ranks").set_value(1)
    next(b for b in at.button if b.label == "Compare noop with allreduce").click().run()
    assert not at.exception, [e.value for e in at.exception]
    h = at.session_state["headroom"]
    assert (h.steps, h.world_size) == (10, 1)
    assert h.step_s_allreduce > 0 and h.step_s_noop > 0
    assert metric(at, "allreduce step") == f"{h.step_s_allreduce * 1e3:.2f} ms"
    assert metric(at, "noop step") == f"{h.step_s_noop * 1e3:.2f} ms"
    # One figure, one name: the share of the allreduce step that noop saves, against 10%.
    assert h.saved == pytest.approx(1 - h.step_s_noop / h.step_s_allreduce)
    assert metric(at, headroom.SAVED_LABEL) == f"{h.saved:.0%}"
    assert h.allreduce_is_bottleneck == (h.saved >= headroom.THRESHOLD)
    shown = [m.value for m in [*at.warning, *at.success] if "noop saves" in m.value]
    assert shown == [h.verdict]
    chart = next(c for c in charts(at) if c["layout"]["title"]["text"].startswith(headroom.SAVED_LABEL))
    assert chart["data"][0]["y"] == pytest.approx([h.step_s_allreduce * 1e3, h.step_s_noop * 1e3])
    assert chart["data"][0]["text"] == [f"{h.step_s_allreduce * 1e3:.2f} ms", f"{h.step_s_noop * 1e3:.2f} ms"]
    made = {r.id: r.config_dict()["hook"] for r in api.list_runs(tmp_path / "runs")}
    assert made == {h.run_ids["allreduce"]: "allreduce", h.run_ids["noop"]: "noop"}


# ---------------------------------------------------------------------------- commlab.ui alone
@pytest.mark.slow
def test_live_view_reads_only_new_complete_lines(tmp_path, sleeper):
    run = fake_running_run(tmp_path, sleeper, steps_written=2)
    view = runs.LiveView(run.path)
    assert view.poll() == 2 and view.poll() == 0
    append_steps(run, [2])
    assert view.poll() == 1 and [r["step"] for r in view.rows] == [0, 1, 2]
    assert view.implementation()["ran"] is False  # rank 0 never reported in this stand-in


@pytest.mark.slow
def test_delete_run_refuses_what_it_must_not_delete(tmp_path, sleeper):
    root = tmp_path / "runs"
    running = fake_running_run(root, sleeper)
    with pytest.raises(ValueError, match="still running"):
        runs.delete_run(running.path, str(root))
    stray = root / "not-a-run"
    stray.mkdir()
    with pytest.raises(ValueError, match="not a commlab run folder"):
        runs.delete_run(stray, str(root))
    outside = tmp_path / "elsewhere"
    shutil.copytree(running.path, outside)
    with pytest.raises(ValueError, match="not a folder directly inside"):
        runs.delete_run(outside, str(root))
    link = root / "link"
    link.symlink_to(outside)
    with pytest.raises(ValueError, match="not a folder directly inside"):
        runs.delete_run(link, str(root))
    with pytest.raises(ValueError, match="not a folder directly inside"):
        runs.delete_run(root / running.id / ".." / running.id / "..", str(root))
    assert running.exists() and outside.exists()


def test_request_id_is_stable_per_submission(tmp_path):
    cfg = RunConfig(runs_dir=str(tmp_path))
    assert form.request_id(cfg, "d1") == form.request_id(RunConfig(runs_dir=str(tmp_path)), "d1")
    assert form.request_id(cfg, "d1") != form.request_id(cfg, "d2")
    assert form.request_id(cfg, "d1") != form.request_id(RunConfig(runs_dir=str(tmp_path), steps=7), "d1")
