"""The comparison (commlab.tune.compare, ``commlab compare``, the Compare page) and the what-if
model's allgather and model-averaging costs."""
from __future__ import annotations

import json
import os

import pytest
import torch
from streamlit.testing.v1 import AppTest

from commlab import cli
from commlab.analysis import ring
from commlab.config import RunConfig
from commlab.figures import compare as figs
from commlab.hooks.instrument import CollectiveCounter, Link
from commlab.tune import compare, payoff, quality, whatif
from commlab.tune.quality import Cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP, PAGE = os.path.join(ROOT, "app.py"), "pages/compare.py"


def records(n: int, payload, plain: float, calls, loss=lambda i: 2.0 - 0.05 * i) -> list[dict]:
    """``n`` steps with 10 ms steps, 4 ms of them in the hook; payload and calls by step."""
    return [{"step": i, "loss": loss(i), "step_s": 0.010, "hook_s": 0.004, "t": 0.01 * (i + 1),
             "payload_bytes": payload(i), "plain_bytes": plain, "collectives": calls(i)}
            for i in range(n)]


# ---------------------------------------------------------------- the ring formulas
@pytest.mark.parametrize("n", [2, 3, 8, 64])
def test_an_allgather_takes_n_minus_1_latencies_and_sends_n_minus_1_pieces(n):
    s, bw, lat = 1e6, 8.0, 10.0  # 8 Gb/s: 1 GB/s
    assert ring.latency_steps(ring.ALLGATHER, n) == n - 1 == ring.steps(n) / 2
    assert ring.sent_bytes(ring.ALLGATHER, s, n) == (n - 1) * s
    assert ring.collective_s(ring.ALLGATHER, s, n, bw, lat, 3) == pytest.approx(
        3 * (n - 1) * 10e-6 + (n - 1) * s / 1e9)
    assert ring.collective_s(ring.ALLREDUCE, s, n, bw, lat, 2) == ring.allreduce_s(s, n, bw, lat, 2)
    with pytest.raises(ValueError, match="all_gather"):
        ring.latency_steps("broadcast", n)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_message_bytes_undoes_the_counters_allreduce_equivalent(n):
    tensor = torch.zeros(30, dtype=torch.float32)  # 120 bytes from each rank
    counted = CollectiveCounter(world_size=n).payload_of("all_gather", tensor, None)
    assert ring.wire_bytes(counted, n) == pytest.approx((n - 1) * 120, abs=1)
    assert ring.message_bytes(ring.ALLGATHER, counted, n, n) == pytest.approx(120, rel=0.01)
    assert ring.message_bytes(ring.ALLREDUCE, 500, n, n) == pytest.approx(500)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_emulated_link_charges_an_allgather_n_minus_1_latencies(n):
    counter = CollectiveCounter(Link(1.0, 50.0), world_size=n)
    hops = counter.hops("all_gather", None)
    assert hops == n - 1 and counter.hops("all_reduce", None) == 2 * (n - 1)
    counted = CollectiveCounter(world_size=n).payload_of("all_gather", torch.zeros(250), None)
    assert counter.link.seconds(counted, n, hops) == pytest.approx(
        ring.collective_s(ring.ALLGATHER, 1000, n, 1.0, 50.0), rel=1e-3)
    assert counter.link.seconds(1000, n) == ring.allreduce_s(1000, n, 1.0, 50.0)


# ---------------------------------------------------------------- the what-if model's costs
def test_an_allgather_hooks_cost_grows_with_the_workers_from_its_measured_count():
    cfg = RunConfig(hook="topk", world_size=2).to_dict()
    recs = records(12, lambda i: 300, 3000, lambda i: 3)  # 3 buckets of 100 B each, from each rank
    p = whatif.profile_from_records(recs, cfg, "t")
    assert (p.collective, p.group_size, p.period) == (ring.ALLGATHER, 0, 1)
    assert p.message_bytes() == pytest.approx(300)
    for n in (2, 8, 64):
        assert p.wire_bytes(n) == pytest.approx((n - 1) * 300)
        assert p.comm_s(n, 1.0, 5.0) == pytest.approx(3 * (n - 1) * 5e-6 + (n - 1) * 300 * 8 / 1e9)
    # randomk's messages add up: an allreduce, whose bytes on each rank stay bounded
    assert whatif.traffic(RunConfig(hook="randomk").to_dict())[0] == ring.ALLREDUCE
    assert whatif.traffic(RunConfig(hook="quantize_pertensor").to_dict())[0] == ring.ALLGATHER
    # against allreduce: the break-even uses what each sends on N ranks, not the counted payload
    base = whatif.profile_from_records(records(12, lambda i: 3000, 3000, lambda i: 1),
                                       RunConfig(hook="allreduce").to_dict(), "a")
    assert payoff.payoff(base, p, 8, 5).verdict == payoff.BELOW  # 7 x 300 B against 2 x 7/8 x 3000 B
    assert payoff.payoff(base, p, 64, 5).verdict == payoff.NEVER  # 63 x 300 B: more than allreduce sends


def test_local_sgd_pays_a_subgroup_allreduce_and_one_parameter_allreduce_per_period():
    cfg = RunConfig(hook="post_localsgd", world_size=4, localsgd_subgroup_size=2, averager_period=4,
                    start_localSGD_iter=2, averager_warmup_steps=4).to_dict()
    params = 1000.0
    sub = round(ring.wire_bytes(params, 2) / ring.factor(4))  # the counter's count of it
    recs = records(20, lambda i: (3000 if i < 2 else sub) + (params if i >= 4 and i % 4 == 0 else 0),
                   params, lambda i: 1 + (i >= 4 and i % 4 == 0))
    p = whatif.profile_from_records(recs, cfg, "l", skip=0)
    assert p.steady_steps == 16  # from averager_warmup_steps: local SGD and averaging both on
    assert (p.collective, p.group_size, p.period, p.averaged_bytes) == (ring.ALLREDUCE, 2, 4, params)
    assert p.payload_bytes == pytest.approx(sub + params / 4)  # a mean: one step in four averages
    assert p.message_bytes() == pytest.approx(params, rel=1e-3)
    for n in (4, 64):
        want = (ring.allreduce_s(params, 2, 10.0, 5.0) + ring.allreduce_s(params, n, 10.0, 5.0) / 4)
        assert p.comm_s(n, 10.0, 5.0) == pytest.approx(want, rel=1e-3)
    # the averaging, after the optimizer step, is outside the hook: compute is the step less both
    assert p.compute_s == pytest.approx(0.006)


# ---------------------------------------------------------------- the table (pure)
def _entries():
    ar_cfg = RunConfig(hook="allreduce", workload="mlp").to_dict()
    tk_cfg = RunConfig(hook="topk", workload="mlp", compress_ratio=0.1).to_dict()
    ar = compare.Entry("ar", ar_cfg, records(12, lambda i: 4000, 4000, lambda i: 1),
                       [{"step": 12, "loss": 1.25, "accuracy": 0.5}])
    tk = compare.Entry("tk", tk_cfg, records(12, lambda i: 800, 4000, lambda i: 2),
                       [{"step": 12, "loss": 1.5, "accuracy": 0.4}])
    return ar, tk


def test_the_table_has_quality_bytes_ratio_and_predicted_time_per_run():
    ar, tk = _entries()
    profiles = [whatif.profile_from_records(e.records, e.cfg, e.run_id) for e in (ar, tk)]
    cluster = Cluster(8, 1.0, 5.0)
    rows = compare.table([ar, tk], profiles, cluster)
    assert [r["run_id"] for r in rows] == ["ar", "tk"] and set(compare.COLUMNS) <= rows[0].keys()
    a, t = rows
    assert (a["basis"], a["quality"], a["heldout_accuracy"]) == (quality.HELD_OUT, 1.25, 0.5)
    assert (t["bytes_per_step"], t["compression_ratio"], a["compression_ratio"]) == (800, 5.0, 1.0)
    assert t["wire_bytes"] == pytest.approx(7 * 800) and a["wire_bytes"] == pytest.approx(ring.wire_bytes(4000, 8))
    assert t["predicted_step_s"] == pytest.approx(profiles[1].step_s(8, 1.0, 5.0))
    assert a["median_step_s"] == 0.010 and not t["diverged"]
    assert compare.bases(rows) == quality.BASIS_TEXT[quality.HELD_OUT]


def test_the_page_table_reads_setting_bytes_ratio_pays_first_and_12_runs_get_12_colours():
    """What the Compare page shows (``figures.compare``): the columns a person reads first, first;
    the verdict in a cell's words; columns no run fills left out; one colour per run, no two
    alike for 12 runs, named by the run's label in a legend beside the plot, no text on points."""
    ar, tk = _entries()
    profiles = [whatif.profile_from_records(e.records, e.cfg, e.run_id) for e in (ar, tk)]
    rows = compare.table([ar, tk], profiles, Cluster(8, 1.0, 5.0))
    frame = figs.table_frame(rows)
    assert list(frame.columns[:4]) == ["label", "bytes_per_step", "compression_ratio", "pays"]
    assert "heldout_bits_per_char" not in frame.columns  # the mlp has no bits per character
    pays = payoff.payoff(profiles[0], profiles[1], 8, 5.0)
    assert frame["pays"][0] == "is the baseline (fp32 allreduce)"
    assert frame["pays"][1] == (f"{pays.verdict} {pays.break_even_gbps:.3g} Gb/s"
                                if pays.break_even_gbps else pays.verdict)
    twelve = [{**rows[1], "label": f"setting {i}"} for i in range(12)]
    fig = figs.quality_figure(twelve, "bytes_per_step", "bytes", "t", "loss")
    assert len({t.marker.color for t in fig.data}) == 12
    assert [t.name for t in fig.data] == [f"setting {i}" for i in range(12)]
    assert all(t.mode == "markers" for t in fig.data) and fig.layout.legend.x > 1


def test_a_run_without_evaluations_is_named_as_training_loss_and_no_profile_leaves_blanks():
    ar, tk = _entries()
    bare = compare.Entry("tk", tk.cfg, tk.records[:2])  # no steady step, no evaluation
    rows = compare.table([ar, bare], [whatif.profile_from_records(ar.records, ar.cfg, "ar")])
    b = rows[1]
    assert b["basis"] == quality.TRAINING and b["quality"] == pytest.approx((2.0 + 1.95) / 2)
    assert b["predicted_step_s"] is None and b["wire_bytes"] is None
    assert "mixed" in compare.bases(rows) and "do not rank" in compare.bases(rows)


def test_runs_of_two_workloads_or_a_bad_cluster_are_refused_by_name():
    ar, tk = _entries()
    other = compare.Entry("c", {**tk.cfg, "workload": "cnn"}, tk.records)
    with pytest.raises(ValueError, match="cnn, mlp"):
        compare.table([ar, other], [])
    with pytest.raises(ValueError, match="predict_world_size"):
        compare.table([ar], [], Cluster(1, 1.0, 0.0))


def test_the_cli_refuses_bad_input_before_starting_anything(tmp_path, capsys):
    base = ["compare", "--runs-dir", str(tmp_path)]
    assert cli.main(base) == 2
    assert cli.main([*base, "--hooks", "allreduce,nonesuch"]) == 2
    assert "nonesuch" in capsys.readouterr().err
    assert cli.main([*base, "--hooks", "topk", "--compress-ratio", "7"]) == 2
    assert "compress_ratio" in capsys.readouterr().err
    assert cli.main([*base, "nope", "--json"]) == 2
    assert "nope" in json.loads(capsys.readouterr().out.splitlines()[-1])["errors"]["run"]
    assert cli.main([*base, "x", "--hooks", "topk"]) == 2
    assert not list(tmp_path.iterdir())  # nothing was started


# ---------------------------------------------------------------- real runs: CLI and page
def test_the_cli_tabulates_existing_runs_by_id(runs_dir, powersgd_run, allreduce_run, capsys):
    ids = [allreduce_run.id, powersgd_run.id]
    args = ["compare", *ids, "--runs-dir", str(runs_dir), "--predict-world-size", "16",
            "--predict-bandwidth-gbps", "1"]
    assert cli.main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    rows = {r["run_id"]: r for r in out["rows"]}
    assert list(rows) == ids and out["cluster"] == Cluster(16, 1.0).text()
    want = compare.compare_runs([allreduce_run, powersgd_run], Cluster(16, 1.0))
    assert out["rows"] == json.loads(json.dumps(want))  # the same numbers the module computes
    assert rows[powersgd_run.id]["compression_ratio"] > 1 and rows[powersgd_run.id]["predicted_step_s"] > 0
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert "quality:" in text and "16 workers, 1 Gb/s" in text and " KiB" in text
    assert text.count("powersgd") >= 1 and "allreduce" in text


def _open(monkeypatch, folder) -> AppTest:
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(folder))
    at = AppTest.from_file(APP, default_timeout=600)
    at.run()
    at.switch_page(PAGE).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_page_without_runs_says_so(tmp_path, monkeypatch):
    at = _open(monkeypatch, tmp_path / "none-yet")
    assert at.title[0].value == "Compare"
    assert "No runs yet" in " ".join(i.value for i in at.info)
    assert not at.get("plotly_chart") and not at.dataframe


def test_the_page_shows_both_runs_and_reacts_to_the_cluster(runs_dir, powersgd_run, allreduce_run,
                                                            monkeypatch):
    at = _open(monkeypatch, runs_dir)
    table = at.dataframe[0].value
    assert set(table["run_id"]) == {powersgd_run.id, allreduce_run.id}
    assert len(at.get("plotly_chart")) == 2
    before = table.set_index("run_id")["predicted_step_s"]
    at.select_slider[1].set_value(1).run()  # 1 Gb/s: slower links, longer predicted steps
    assert not at.exception, [e.value for e in at.exception]
    after = at.dataframe[0].value.set_index("run_id")["predicted_step_s"]
    assert (after > before).all()
    at.multiselect[0].set_value([]).run()
    assert "Pick one or more runs" in " ".join(i.value for i in at.info)
