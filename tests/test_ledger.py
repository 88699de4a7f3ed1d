"""The communication ledger: its formulas by hand (fast), and on real runs its counts and bytes
against metrics.jsonl's, the emulated link's share, the table on the run's pages and in `commlab
runs --json`.  The session's two runs serve the counts and the pages; one short run of its own, over
an emulated link, the link's share."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from test_app_pages import LAUNCH, RUNS, open_app

from commlab import cli
from commlab.analysis import ledger, ring
from commlab.api import RunConfig, run
from commlab.hooks.instrument import Link
from commlab.ui import runs

KINDS = ring.COLLECTIVES


# ---------------------------------------------------------------------------- the formulas, by hand
def test_busbw_is_algbw_times_nccl_tests_factor_for_every_kind():
    by_hand = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
               "reduce": lambda n: 1.0}
    assert set(by_hand) == set(KINDS)
    for kind, factor in by_hand.items():
        for n in (2, 3, 4, 8, 64):
            alg = ring.algbw(3_000_000, 0.002)
            assert alg == 1.5e9
            assert ring.busbw(alg, n, kind) == pytest.approx(1.5e9 * factor(n), rel=1e-15)
    with pytest.raises(ValueError, match="unknown collective 'all_to_all'; known: all_reduce"):
        ledger.message_size("all_to_all", 8, 2)


def test_message_size_is_the_calls_largest_buffer():
    assert ledger.message_size("all_reduce", 1024, 4) == 1024
    assert ledger.message_size("all_gather", 1024, 4) == 4096  # the output: 4 pieces of 1 KiB
    assert ledger.message_size("reduce_scatter", 4096, 4) == 4096  # the input
    assert ledger.message_size("broadcast", 100, 3) == 100


def test_the_ledger_files_each_call_and_derives_its_figures():
    book = ledger.Ledger()
    a = book.issued(ledger.HOOK, "all_reduce", 4, 1000, 1000)
    b = book.issued(ledger.HOOK, "all_reduce", 4, 1000, 1000)
    assert a is b  # one entry per (traffic, kind, ranks, size)
    book.completed(a, 0.004, link_s=0.003, link_wait_s=0.001)
    book.completed(a, 0.006)
    gather = book.issued(ledger.HOOK, "all_gather", 4, 250, 500)  # counted as the counter counts it
    loss = book.issued(ledger.OTHER, "all_reduce", 4, 4, 4)  # issued, not yet completed
    first = book.rows()[0]
    assert first == {"traffic": "hook", "collective": "all_gather", "ranks": 4, "size_bytes": 1000,
                     "count": 1, "bytes": 1000, "counted_bytes": 500, "timed": 0, "total_s": 0.0,
                     "mean_s": None, "algbw_gbytes_s": None, "busbw_gbytes_s": None, "bus_factor": 0.75,
                     "link_s": 0.0, "link_wait_s": 0.0, "link_share": None}
    reduce = book.rows()[1]
    assert (reduce["count"], reduce["timed"], reduce["bytes"], reduce["counted_bytes"]) == (2, 2, 2000, 2000)
    assert reduce["total_s"] == pytest.approx(0.010) and reduce["mean_s"] == pytest.approx(0.005)
    assert reduce["algbw_gbytes_s"] == pytest.approx(1000 / 0.005 / 1e9)
    assert reduce["busbw_gbytes_s"] == pytest.approx(reduce["algbw_gbytes_s"] * 1.5)  # 2(4-1)/4
    assert reduce["link_share"] == pytest.approx(0.1) and reduce["link_s"] == 0.003
    assert [r["traffic"] for r in book.rows()] == ["hook", "hook", "other"]  # the hook's first
    book.completed(gather, 0.002)
    book.completed(loss, 0.001)
    t = ledger.totals(book.rows())
    assert t["hook"] == {"count": 3, "bytes": 3000, "counted_bytes": 2500, "total_s": pytest.approx(0.012),
                         "link_s": 0.003, "link_wait_s": 0.001, "link_share": pytest.approx(0.001 / 0.012)}
    assert t["other"]["count"] == 1 and t["other"]["link_share"] == 0.0


# ---------------------------------------------------------------------------- real runs
def check_against_metrics(folder) -> dict:
    """The ledger of a finished run against its metrics.jsonl; its totals by traffic."""
    written = folder.ledger()
    m = pd.DataFrame(folder.metrics_records())
    rows = written["rows"]
    assert written["step"] == m.step.iloc[-1] and written["world_size"] == folder.config().world_size
    t = ledger.totals(rows)
    assert t["hook"]["count"] == m.collectives.sum()
    assert t["hook"]["counted_bytes"] == m.payload_bytes.sum()
    assert t.get("measure", {}).get("counted_bytes", 0) == m.measure_bytes.sum()
    assert t["hook"]["link_s"] == pytest.approx(m.link_s.sum(), rel=1e-12, abs=0)  # what the link charged
    # The worker's mean loss: one 4-byte allreduce a step, outside the hook, listed apart.
    assert [(r["collective"], r["size_bytes"], r["count"]) for r in rows if r["traffic"] == "other"] \
        == [("all_reduce", 4, len(m))]
    for r in rows:
        assert r["timed"] == r["count"] and r["bytes"] == r["count"] * r["size_bytes"], r
        assert r["mean_s"] == pytest.approx(r["total_s"] / r["count"]) and r["mean_s"] > 0, r
        assert r["algbw_gbytes_s"] == pytest.approx(r["size_bytes"] / r["mean_s"] / 1e9), r
        assert r["busbw_gbytes_s"] == pytest.approx(r["algbw_gbytes_s"] * ring.bus_factor(r["collective"], r["ranks"])), r
    return t


def test_the_ledger_counts_what_metrics_count(powersgd_run, allreduce_run):
    for folder in (powersgd_run, allreduce_run):
        check_against_metrics(folder)
    # Plain allreduce hands over each bucket as it is: its sizes are the buckets' (both layouts).
    layouts = allreduce_run.buckets()
    sizes = {b["bytes"] for name in ("iter0", "rebuilt") for b in layouts[name]}
    assert {r["size_bytes"] for r in allreduce_run.ledger()["rows"] if r["traffic"] == "hook"} == sizes
    assert "measure" in ledger.totals(powersgd_run.ledger()["rows"])  # error_every=4: measured


def ledger_table(at) -> pd.DataFrame:
    tables = [d.value for d in at.dataframe if "collective" in d.value.columns]
    assert len(tables) == 1
    return tables[0]


def test_the_run_pages_show_the_ledger(runs_dir, powersgd_run, monkeypatch):
    want = pd.DataFrame(runs.ledger_view(powersgd_run.path)["rows"])
    assert list(want.columns) == list(runs.LEDGER_COLUMNS)  # no link columns: no emulated link
    for page in (LAUNCH, RUNS):
        at = open_app(monkeypatch, runs_dir, page=page, watch=powersgd_run.path)
        pd.testing.assert_frame_equal(ledger_table(at).reset_index(drop=True), want)
        shown = "\n".join(m.value for m in at.markdown)
        hook = ledger.totals(powersgd_run.ledger()["rows"])["hook"]
        assert "**hook** (the hook's collectives" in shown and f"{hook['count']:,} calls" in shown


@pytest.mark.slow
def test_an_emulated_link_shows_its_share_on_the_pages_and_in_commlab_runs(tmp_path, monkeypatch, capsys):
    link = Link(bandwidth_gbps=1.0, latency_us=20_000.0)  # 40 ms a 2-rank allreduce: the link dominates
    folder = run(RunConfig(workload="mlp", hook="allreduce", steps=4, world_size=2, bucket_cap_mb=0.05,
                           emulate_bandwidth_gbps=link.bandwidth_gbps, emulate_latency_us=link.latency_us,
                           runs_dir=str(tmp_path), stall_timeout_s=600), timeout=900)
    assert folder.status() == "finished", folder.status_record()
    t = check_against_metrics(folder)
    rows = folder.ledger()["rows"]
    assert folder.ledger()["emulated_link"] is True
    for r in rows:
        if r["traffic"] == "hook":  # held until the link would have carried it, from its issue
            per_call = link.seconds(r["counted_bytes"] / r["count"], 2)
            assert r["link_s"] == pytest.approx(per_call * r["count"]), r
            assert r["mean_s"] >= per_call * (1 - 1e-9), r
            # A call can complete after its deadline (a rank late to the first step): no wait then.
            assert 0 <= r["link_wait_s"] <= r["total_s"] and r["link_share"] == r["link_wait_s"] / r["total_s"], r
        else:  # the link carries the hook's traffic only
            assert r["link_s"] == r["link_wait_s"] == 0, r
    # 0.92 measured here; a busy machine's slow real collectives hide more of the link
    assert t["hook"]["link_share"] > 0 and t["hook"]["link_wait_s"] > 0

    at = open_app(monkeypatch, tmp_path, page=RUNS, watch=folder.path)
    table = ledger_table(at)
    assert list(table.columns) == [*runs.LEDGER_COLUMNS, *runs.LINK_COLUMNS]
    assert list(table.link_share) == [r["link_share"] for r in rows]
    assert f"{t['hook']['link_share']:.0%} of it added by the emulated link" in "\n".join(m.value for m in at.markdown)

    capsys.readouterr()
    assert cli.main(["runs", "--runs-dir", str(tmp_path), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["runs"]
    assert listed["ledger"]["rows"] == rows
    assert listed["ledger"]["totals"]["hook"]["link_share"] == pytest.approx(t["hook"]["link_share"])
