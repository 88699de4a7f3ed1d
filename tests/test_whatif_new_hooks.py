"""The what-if model prices an allgather hook and post-local SGD's model averaging as the emulated
link charges them: real 3-rank runs over an emulated link, whose recorded per-step charge
(``link_s``, what ``Link.seconds`` held the hook's collectives for) is held against ``ring``'s
formulas on the bytes each collective really carried, and against the model's price of the run's
own counts.  Nothing here is timed: the charge is computed from bytes, not measured, so load on
the machine cannot move it.  At 3 ranks an allgather of s from each sends 2 s and an allreduce of
s sends 4/3 s, so pricing one as the other fails here (at 2 ranks both send s).
"""
from __future__ import annotations

import math

import pytest

from commlab.analysis import metrics, ring
from commlab.api import RunConfig, run
from commlab.tune import whatif

WORLD, BANDWIDTH_GBPS, LATENCY_US = 3, 2.0, 30.0  # fast enough to hold nothing back for long
COMMON = dict(workload="mlp", world_size=WORLD, bucket_cap_mb=0.05, stall_timeout_s=600,
              emulate_bandwidth_gbps=BANDWIDTH_GBPS, emulate_latency_us=LATENCY_US)


def _finished(cfg: RunConfig):
    r = run(cfg, timeout=900)
    assert r.status() == "finished", r.status_record()
    return r, r.config_dict(), r.metrics_records()


def _model_charge(records, cfg) -> tuple[float, float]:
    """The model's link time per step for the run's own counts, and the link's recorded charge
    over the same steps (``metrics.per_step``: whole periods, with averaging)."""
    profile = whatif.profile_from_records(records, cfg, skip=1)
    steady = whatif.steady_rows(records, cfg, skip=1)
    return (profile.comm_s(WORLD, BANDWIDTH_GBPS, LATENCY_US),
            metrics.per_step(steady, cfg, "link_s"))


def test_the_hooks_recorded_collective_time_is_not_arithmetic():
    """A run that recorded how long its bucket collectives took (waiting for the other ranks
    included) leaves only the rest of the hook's time as arithmetic, whatever the loopback rate
    says; the check's loopback term is that recorded time too."""
    cfg = RunConfig(hook="randomk", world_size=2).to_dict()
    rows = [{"step": i, "loss": 1.0, "step_s": 0.020, "hook_s": 0.012, "collective_s": 0.009,
             "link_s": 0.0, "payload_bytes": 4000, "plain_bytes": 40_000, "collectives": 1, "t": i}
            for i in range(10)]
    p = whatif.profile_from_records(rows, cfg, loopback_s_per_byte=1e-9)
    assert p.arithmetic_s == pytest.approx(0.003) and p.comm_here_s == pytest.approx(0.009)
    assert p.compute_s == pytest.approx(0.008)
    emulated = {**cfg, "emulate_bandwidth_gbps": 0.001, "emulate_latency_us": 0.0}  # 32 ms of link
    row = whatif.check(p, [{**r, "step_s": 0.043} for r in rows], emulated, loopback_s_per_byte=1e-9)
    assert row["loopback_s"] == pytest.approx(0.009)
    assert row["predicted_s"] == pytest.approx(0.008 + 0.003 + ring.allreduce_s(4000, 2, 0.001))
    old = whatif.profile_from_records([{k: v for k, v in r.items() if k != "collective_s"}
                                       for r in rows], cfg, loopback_s_per_byte=1e-6)
    assert old.arithmetic_s == pytest.approx(0.012 - 1e-6 * 4000) and old.comm_here_s is None


@pytest.mark.slow
def test_topk_allgathers_are_charged_and_priced_by_the_ring_allgather_formula(tmp_path):
    ratio = 0.05
    r, cfg, records = _finished(RunConfig(hook="topk", compress_ratio=ratio, steps=8,
                                          runs_dir=str(tmp_path), **COMMON))
    buckets = r.buckets()["rebuilt"]
    assert len(buckets) > 1
    # each bucket of n elements: k float32 values and k int32 indices from every rank
    messages = [8 * math.ceil(ratio * b["numel"]) for b in buckets]
    expected = sum(ring.collective_s(ring.ALLGATHER, m, WORLD, BANDWIDTH_GBPS, LATENCY_US)
                   for m in messages)
    for row in records[1:]:  # step 0 runs DDP's first layout
        assert row["collectives"] == len(buckets)
        assert row["link_s"] == pytest.approx(expected, rel=1e-4), row
        # issued in the hook, done on the real link before the link let the hook's future go
        assert 0 < row["collective_s"] <= row["hook_s"], row
    model, charged = _model_charge(records, cfg)
    assert model == pytest.approx(charged, rel=1e-4)
    assert model == pytest.approx(expected, rel=1e-4)


@pytest.mark.slow
def test_post_local_sgd_pays_its_model_averaging_on_the_emulated_link(tmp_path):
    period, start = 3, 2
    r, cfg, records = _finished(RunConfig(
        hook="post_localsgd", steps=11, runs_dir=str(tmp_path), averager_period=period,
        start_localSGD_iter=start, averager_warmup_steps=start, **COMMON))
    params = r.buckets()["rebuilt"]
    param_bytes = sum(b["bytes"] for b in params)
    averaging = ring.allreduce_s(param_bytes, WORLD, BANDWIDTH_GBPS, LATENCY_US)
    for row in records[start:]:
        averages = (row["step"] - start) % period == 0  # PeriodicModelAverager's steps
        # every rank alone between averagings: its gradient allreduces span one rank, cost nothing
        assert row["link_s"] == pytest.approx(averaging if averages else 0.0, rel=1e-6), row
    model, charged = _model_charge(records, cfg)
    assert charged == pytest.approx(averaging / period, rel=1e-6)
    assert model == pytest.approx(charged, rel=1e-6)
