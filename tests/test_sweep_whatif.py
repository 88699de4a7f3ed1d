"""commlab.tune.sweep, the emulated link and commlab.tune.whatif: pure parts on made-up numbers, then one real
tiny sweep over an emulated link, stopped during its last run, that the rest is checked against.

No timing is asserted except the emulated link's floor, which is the emulation's contract: every
collective the hook issues completes no earlier than 2(N-1)·latency + 2(N-1)/N·bytes/bandwidth.
"""
from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from commlab import cli
from commlab.analysis import ring
from commlab.config import ConfigError, RunConfig, label_of
from commlab.hooks.instrument import Link
from commlab.tune import pareto, payoff, quality, whatif
from commlab.tune import sweep as sw

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 1200  # a run reaches its first step in 5 s idle, minutes on a loaded machine
BANDWIDTH_GBPS, LATENCY_US = 0.05, 20.0


# =========================================================================== the grid
def test_grid_puts_the_baseline_first_then_every_combination():
    base = RunConfig(workload="mlp", steps=30, emulate_bandwidth_gbps=1.0)
    spec = sw.SweepSpec(base=base, matrix_approximation_rank=[1, 2], start_powerSGD_iter=[5, 10],
                        wrapper=["none", "fp16"], repeats=1)
    configs = sw.grid(spec)
    assert len(configs) == 1 + 2 * 2 * 2
    assert (configs[0].hook, configs[0].wrapper) == ("allreduce", "none")
    assert {(c.matrix_approximation_rank, c.start_powerSGD_iter, c.wrapper) for c in configs[1:]} == {
        (r, s, w) for r in (1, 2) for s in (5, 10) for w in ("none", "fp16")}
    assert all(c.hook == "powersgd" and c.emulate_bandwidth_gbps == 1.0 and c.steps == 30
               for c in configs[1:])
    no_base = sw.grid(sw.SweepSpec(base=base.with_overrides(hook="batched_powersgd"),
                                   matrix_approximation_rank=[1, 1], baseline=False, repeats=1))
    assert [(c.hook, c.matrix_approximation_rank) for c in no_base] == [("batched_powersgd", 1)]


def test_a_bad_grid_is_refused_before_anything_starts(tmp_path):
    base = RunConfig(runs_dir=str(tmp_path))
    with pytest.raises(ConfigError) as e:
        sw.create(sw.SweepSpec(base=base, matrix_approximation_rank=[0, 2], start_powerSGD_iter=[1]))
    assert "matrix_approximation_rank" in e.value.errors and "start_powerSGD_iter" in e.value.errors
    with pytest.raises(ConfigError, match="wrapper"):
        sw.grid(sw.SweepSpec(base=base, wrapper=["gzip"]))
    with pytest.raises(ConfigError, match="give at least one value"):
        sw.grid(sw.SweepSpec(base=base, matrix_approximation_rank=[]))
    with pytest.raises(ConfigError, match="comma-separated list of int"):
        sw.parse_list("1,two", int, "matrix_approximation_rank")
    assert not any(tmp_path.iterdir())
    # allreduce is the baseline, not a hook to sweep; an axis the hook does not read is refused.
    assert cli.main(["sweep", "--hook", "allreduce", "--runs-dir", str(tmp_path), "--dry-run"]) == 2
    assert cli.main(["sweep", "--hook", "qsgd", "--compress-ratio", "0.01", "--runs-dir",
                     str(tmp_path), "--dry-run"]) == 2
    assert not any(tmp_path.iterdir())


# The axes each hook reads, as the registry builds it: what the sweep must find (hook_axes).
OWN_AXES = {"powersgd": ["matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate",
                         "wrapper"],
            "topk": ["compress_ratio"], "randomk": ["compress_ratio"], "dgc": ["compress_ratio"],
            "qsgd": ["qsgd_levels"], "threshold": ["sparsify_threshold"],
            "quantize_perchannel": ["quantization_bucket_size"],
            "post_localsgd": ["start_localSGD_iter", "averager_period", "wrapper"],
            "fp16": ["wrapper"], "signsgd": [], "noop": [], "quantize_pertensor": []}


@pytest.mark.parametrize("hook", OWN_AXES)
def test_each_hook_sweeps_its_own_axes(hook):
    assert [s.name for s in sw.hook_axes(hook)] == OWN_AXES[hook]
    spec = sw.SweepSpec(base=RunConfig(hook=hook, workload="mlp", steps=30), repeats=1)
    configs = sw.grid(spec)
    # The table's values unless told (top-k's k: 0.001, 0.01, 0.1), else base's: every combination.
    expected = math.prod(len(s.sweep) or 1 for s in sw.hook_axes(hook))
    assert len(configs) == 1 + expected and {c.hook for c in configs[1:]} == {hook}
    labels = [sw.plan_label(c, spec) for c in configs]
    assert len(set(labels)) == len(labels), labels  # each setting says its values


def test_every_axis_of_the_table_belongs_to_some_hook_or_to_the_job():
    # the job's axes are those no hook reads: every run, the baselines too, runs at their values
    assert [s.name for s in sw.AXES if not sw.axis_hooks(s.name)] == [s.name for s in sw.JOB_AXES] == ["sharding"]
    assert sw.axis_hooks("compress_ratio") == ["topk", "randomk", "dgc"]
    assert "topk" not in sw.axis_hooks("wrapper") and "powersgd" in sw.axis_hooks("wrapper")


def test_a_compressor_sweep_is_labelled_by_its_values():
    base = RunConfig(workload="mlp", steps=30, emulate_bandwidth_gbps=1.0)
    spec = sw.SweepSpec(base=base.with_overrides(hook="topk"), compress_ratio=[0.01, 0.05, 0.01], repeats=1)
    assert spec.hook == "topk" and spec.axes() == {"compress_ratio": [0.01, 0.05]}
    assert [sw.plan_label(c, spec) for c in sw.grid(spec)] == [
        "allreduce [emulated 1 Gb/s, 0 µs]", "topk compress_ratio=0.01 [emulated 1 Gb/s, 0 µs]",
        "topk compress_ratio=0.05 [emulated 1 Gb/s, 0 µs]"]
    assert sw.SweepSpec.from_dict(spec.to_dict()) == spec and "qsgd_levels" not in spec.to_dict()
    qsgd = sw.SweepSpec(base=base.with_overrides(hook="qsgd"), qsgd_levels=[1, 127], repeats=2)
    assert sw.plan_label(sw.grid(qsgd)[-1], qsgd) == "qsgd qsgd_levels=127 [emulated 1 Gb/s, 0 µs] seed 1"
    local = sw.SweepSpec(base=base.with_overrides(hook="post_localsgd"), averager_period=[2, 8],
                         start_localSGD_iter=[5], baseline=False, repeats=1)
    assert [label_of(c.to_dict(), link=True) for c in sw.grid(local)] == [
        f"post_localsgd start_localSGD_iter=5 averager_period={p} [emulated 1 Gb/s, 0 µs]" for p in (2, 8)]
    # The default, plain allreduce as the base, still sweeps PowerSGD, labelled as before.
    assert sw.SweepSpec(base=base).hook == "powersgd"


def test_an_axis_the_hook_does_not_read_is_refused_by_name_with_why():
    base = RunConfig(workload="mlp", hook="qsgd")
    with pytest.raises(ConfigError) as e:
        sw.grid(sw.SweepSpec(base=base, compress_ratio=[0.01], wrapper=["fp16"],
                             qsgd_levels=[0, 7]))
    errs = e.value.errors
    assert set(errs) == {"compress_ratio", "wrapper", "qsgd_levels"}
    assert errs["compress_ratio"].startswith("is not an axis of qsgd: qsgd does not read compress_ratio")
    assert "it is an axis of topk, randomk, dgc" in errs["compress_ratio"]
    assert "qsgd's axes are: qsgd_levels" in errs["compress_ratio"]
    assert "no compress wrapper may wrap it" in errs["wrapper"]
    # A bad value of the hook's own axis: the table's bounds, for the setting that has it.
    assert errs["qsgd_levels"].startswith("qsgd qsgd_levels=0: must be at least 1")
    with pytest.raises(ConfigError, match="unknown hook 'gzip'"):
        sw.grid(sw.SweepSpec(base=RunConfig(hook="gzip")))


def test_cli_sweeps_a_compressor_over_its_own_axis(capsys):
    rc = cli.main(["sweep", "--workload", "mlp", "--hook", "topk", "--compress-ratio", "0.01,0.05",
                   "--repeats", "1", "--dry-run", "--json"])
    runs = json.loads(capsys.readouterr().out.splitlines()[-1])["runs"]
    assert rc == 0 and runs == ["allreduce", "topk compress_ratio=0.01", "topk compress_ratio=0.05"]


def test_a_second_sweep_waits_for_the_first(tmp_path):
    spec = sw.SweepSpec(base=RunConfig(runs_dir=str(tmp_path)), matrix_approximation_rank=[1])
    first = sw.create(spec)
    sw._write_state(first, pid=__import__("os").getpid(), create_time=psutil.Process().create_time())
    assert first.status() == "running"
    with pytest.raises(ConfigError, match=f"sweep {first.id} is still running"):
        sw.create(spec)
    sw._write_state(first, status="finished")  # an ended (or lost) sweep no longer blocks
    assert sw.create(spec).status() == "running"


def test_cli_dry_run_prints_the_plan(capsys):
    rc = cli.main(["sweep", "--workload", "mlp", "--matrix-approximation-rank", "1,4",
                   "--start-powersgd-iter", "10", "--wrapper", "none,fp16", "--emulate-bandwidth-gbps",
                   "10", "--repeats", "1", "--dry-run", "--json"])
    runs = json.loads(capsys.readouterr().out.splitlines()[-1])["runs"]
    assert rc == 0 and len(runs) == 5 and runs[0].startswith("allreduce [emulated 10 Gb/s")
    assert "fp16_wrapper(powersgd) r=4 start=10 [emulated 10 Gb/s, 0 µs]" in runs


# =========================================================================== analysis
def _row(label, loss, nbytes, secs, status="finished", baseline=False, seed=0):
    return {c: None for c in sw.ROW_COLUMNS} | {
        "label": label, "seed": seed, "run_id": f"{label}-{seed}", "run_dir": "", "status": status,
        "diverged": status == "diverged", "baseline": baseline,
        "hook": "allreduce" if baseline else "powersgd", "wrapper": "none",
        "matrix_approximation_rank": 1, "start_powerSGD_iter": 1, "min_compression_rate": 2.0,
        "steps": 10, "quality": loss, "quality_basis": "held-out", "final_loss": loss,
        "bytes_per_step": nbytes, "time_s": secs, "predicted_s": secs / 2, "median_step_s": secs / 10,
        "link": "loopback"}


def test_pareto_front_keeps_what_nothing_beats_on_both_axes():
    assert pareto.pareto_front([1, 2, 3, 4], [4, 3, 3.5, 1]) == [True, True, False, True]
    assert pareto.pareto_front([1, 1], [2, 2]) == [True, True]  # equal points do not beat each other


def test_recommendation_is_the_fewest_bytes_within_x_percent_of_allreduce():
    # Three seeds each, every seed's luck shared across settings (+-0.02), so the gaps are clear.
    luck = (0.0, 0.02, -0.02)
    runs = pd.DataFrame([_row(label, loss + d, nbytes, secs, status, label == "allreduce", seed)
                         for label, loss, nbytes, secs, status in (
                             ("allreduce", 1.00, 1000, 5.0, "finished"), ("r=1", 1.08, 100, 4.0, "finished"),
                             ("r=2", 1.04, 200, 6.0, "finished"), ("r=4", 1.01, 400, 7.0, "finished"),
                             ("r=8", 0.5, 50, 1.0, "stopped"), ("r=16", math.nan, 20, 1.0, "diverged"))
                         for seed, d in enumerate(luck)], columns=sw.ROW_COLUMNS)
    table = pareto.by_setting(runs)
    assert table.set_index("label")["pareto_bytes"].to_dict() == {
        "allreduce": True, "r=1": True, "r=2": True, "r=4": True, "r=8": False, "r=16": False}
    assert table.set_index("label")["pareto_time"].to_dict() == {
        "allreduce": True, "r=1": True, "r=2": False, "r=4": False, "r=8": False, "r=16": False}
    assert pareto.recommend(runs, 5).label == "r=2"
    assert pareto.recommend(runs, 10).label == "r=1"
    # Nothing within 0.5%; r=8 stopped before its seeds finished, so it could still qualify.
    assert "r=8: unfinished seed" in pareto.recommend(runs, 0.5).text
    rec = pareto.recommend(runs[runs["label"] != "r=8"], 0.5)
    assert rec.label == "allreduce" and rec.text.startswith("keep fp32 allreduce")
    assert "at most 0.5% of fp32 allreduce's loss" in rec.rule
    assert pareto.recommend(runs[~runs["baseline"]], 5).run_id is None


def test_summarize_reads_final_loss_bytes_and_time_from_metrics():
    records = [{"step": i, "loss": 10 - i, "step_s": 0.1, "t": 0.1 * (i + 1),
                "payload_bytes": 400 if i < 2 else 40} for i in range(10)]
    cfg = RunConfig(hook="powersgd", start_powerSGD_iter=2, emulate_latency_us=5).to_dict()
    row = sw.summarize(records, cfg, "finished", final_window=3)
    assert row["final_loss"] == pytest.approx((3 + 2 + 1) / 3) == row["quality"]
    assert row["quality_basis"] == "training" and not row["diverged"]
    held_out = sw.summarize(records, cfg, "finished", evals=[{"step": 10, "loss": 1.5, "accuracy": 0.6}])
    assert (held_out["quality"], held_out["quality_basis"], held_out["accuracy"]) == (1.5, "held-out", 0.6)
    assert row["bytes_per_step"] == pytest.approx((2 * 400 + 8 * 40) / 10)
    assert row["time_s"] == pytest.approx(1.0)
    assert row["link"] == "emulated unlimited bandwidth, 5 µs" and not row["baseline"]
    assert (row["matrix_approximation_rank"], row["start_powerSGD_iter"]) == (1, 2)
    # A row carries its own hook's axes only: another hook's value is not this run's setting.
    topk = sw.summarize(records, RunConfig(hook="topk", compress_ratio=0.05).to_dict(), "finished")
    assert topk["compress_ratio"] == 0.05 and topk["label"] == "topk compress_ratio=0.05"
    assert topk["matrix_approximation_rank"] is None and row["compress_ratio"] is None
    table = pareto.by_setting(pd.DataFrame([row, topk], columns=sw.ROW_COLUMNS))
    assert table["compress_ratio"].isna().tolist() == [True, False] and table["compress_ratio"][1] == 0.05


@pytest.mark.slow
def test_a_sweep_whose_process_is_gone_is_lost_and_stops_here(tmp_path):
    sweep = sw.create(sw.SweepSpec(base=RunConfig(runs_dir=str(tmp_path)), matrix_approximation_rank=[1]))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    sw._write_state(sweep, pid=gone.pid, create_time=0.0)
    assert sweep.status() == "lost"
    sweep.request_stop()
    assert sweep.status() == "stopped" and sweep.stop_requested()


# =========================================================================== the model
@pytest.mark.parametrize("nbytes,world,bw,lat", [
    (340_008, 2, 0.05, 20.0), (4_000_000, 3, 10.0, 5.0), (123, 8, 400.0, 0.0), (10**6, 1, 1.0, 9.0)])
def test_the_model_prices_a_collective_as_the_emulated_link_holds_it(nbytes, world, bw, lat):
    assert ring.allreduce_s(nbytes, world, bw, lat) == pytest.approx(
        Link(bw, lat).seconds(nbytes, world))


def test_collectives_issued_together_share_the_emulated_link():
    """Two buckets' collectives handed over at once leave the link one after the other, as on a
    real network card: the second completes no earlier than two transfers after the first began."""
    import torch
    import torch.distributed as dist

    from commlab.engine.teardown import end_process_group
    from commlab.hooks.instrument import CollectiveCounter

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    # The counter prices the link for 2 ranks; one process is enough to hold collectives back.
    counter = CollectiveCounter(Link(bandwidth_gbps=0.08, latency_us=0.0), world_size=2).install()
    try:
        one = Link(0.08, 0.0).seconds(40_000, 2)  # 40 kB over 10 MB/s: 4 ms
        t0 = time.perf_counter()
        works = [dist.all_reduce(torch.zeros(10_000), async_op=True) for _ in range(2)]
        done = []
        for w in works:
            w.wait()
            done.append(time.perf_counter() - t0)
        assert done[0] >= one * 0.999 and done[1] >= 2 * one * 0.999, (done, one)
        assert counter.take()[0]["hook"] == 80_000
    finally:
        counter.uninstall()
        end_process_group()


def test_ring_allreduce_time_by_hand():
    # 2(N-1)·α + 2(N-1)/N·S/β with N=4, α=10 µs, S=1 MB, β=8 Gb/s = 1 GB/s
    assert ring.allreduce_s(1e6, 4, 8.0, 10.0) == pytest.approx(6 * 10e-6 + 1.5 * 1e-3)
    assert ring.allreduce_s(1e6, 4, 8.0, 10.0, collectives=3) == pytest.approx(
        3 * 6 * 10e-6 + 1.5 * 1e-3)


def _records(hook_s, step_s, payload, calls, n=10, start=0):
    return [{"step": i, "loss": 1.0, "step_s": step_s, "hook_s": hook_s,
             "payload_bytes": payload if i >= start else 999_999, "collectives": calls, "t": i}
            for i in range(n)]


def test_profiles_take_the_link_off_the_hook_time_to_leave_the_arithmetic():
    link = ring.allreduce_s(8000, 2, 0.1, 50.0, collectives=3)
    cfg = RunConfig(hook="powersgd", start_powerSGD_iter=4, emulate_bandwidth_gbps=0.1,
                    emulate_latency_us=50.0).to_dict()
    p = whatif.profile_from_records(_records(link + 0.002, 0.010 + link + 0.002, 8000, 3, start=4), cfg)
    assert p.payload_bytes == 8000 and p.collectives == 3  # compressed steps only
    assert p.arithmetic_s == pytest.approx(0.002) and p.compute_s == pytest.approx(0.010)
    assert p.measured_over == "emulated 0.1 Gb/s, 50 µs"

    base_cfg = RunConfig(hook="allreduce").to_dict()
    base = _records(0.004, 0.014, 400_000, 1)
    per_byte = whatif.loopback_s_per_byte(base, base_cfg)
    assert per_byte == pytest.approx(0.004 / 400_000)
    fp16 = whatif.profile_from_records(_records(0.003, 0.013, 200_000, 1),
                                       RunConfig(hook="fp16").to_dict(), loopback_s_per_byte=per_byte)
    assert fp16.arithmetic_s == pytest.approx(0.001)  # 3 ms less 200 kB at the loopback's rate
    with pytest.raises(ValueError, match="no steady steps"):
        whatif.profile_from_records(_records(1, 1, 1, 1, n=6), RunConfig(hook="powersgd",
                                    start_powerSGD_iter=8).to_dict())


def test_predictions_winners_and_break_even():
    allreduce = whatif.HookProfile("allreduce", "allreduce", "none", 0.010, 0.0, 100e6, 1, 2, "a",
                                   "loopback", 5)
    psgd = whatif.HookProfile("powersgd r=1", "powersgd", "none", 0.010, 0.005, 1e6, 3, 2, "b",
                              "loopback", 5)
    rows = whatif.predict([allreduce, psgd], (2, 64), (1, 400), latency_us=5)
    assert len(rows) == 8
    by = {(r["label"], r["world_size"], r["bandwidth_gbps"]): r for r in rows}
    slow = by[("allreduce", 64, 1)]
    assert slow["step_s"] == pytest.approx(0.010 + ring.allreduce_s(100e6, 64, 1, 5))
    best = {(c["world_size"], c["bandwidth_gbps"]): c for c in whatif.winners(rows)}
    assert best[(64, 1)]["best"] == "powersgd r=1" and best[(64, 1)]["speedup"] > 40
    assert best[(2, 400)]["best"] == "allreduce" and best[(2, 400)]["speedup"] == 1
    even = payoff.payoff(allreduce, psgd, 64, 5).break_even_gbps
    assert psgd.step_s(64, even, 5) == pytest.approx(allreduce.step_s(64, even, 5))
    assert psgd.step_s(64, even * 0.9, 5) < allreduce.step_s(64, even * 0.9, 5)
    assert payoff.payoff(allreduce, allreduce, 64, 5).verdict == payoff.ITSELF
    free = whatif.HookProfile("free", "powersgd", "none", 0.010, 0.0, 1e6, 1, 2, "c", "loopback", 5)
    assert payoff.payoff(allreduce, free, 64, 5).verdict == payoff.ALWAYS


class FakeRun:
    """What ``whatif.checks`` reads of a run folder."""

    def __init__(self, run_id: str, cfg: RunConfig, records: list[dict]):
        self.id, self._cfg, self._records = run_id, cfg.to_dict(), records

    def config_dict(self) -> dict:
        return self._cfg

    def metrics_records(self) -> list[dict]:
        return self._records


def test_checks_predict_each_emulated_run_from_its_latest_twin_on_the_real_link():
    job = dict(hook="allreduce", workload="mlp")
    old = FakeRun("20260101-000000-allreduce-aaaa", RunConfig(**job), _records(0.050, 0.150, 400_000, 1))
    twin = FakeRun("20260101-000100-allreduce-bbbb", RunConfig(**job), _records(0.004, 0.014, 400_000, 1))
    slow = FakeRun("20260101-000200-allreduce-cccc", RunConfig(**job, emulate_bandwidth_gbps=0.1),
                   _records(0.033, 0.043, 400_000, 1))
    fast = FakeRun("20260101-000300-allreduce-dddd", RunConfig(**job, emulate_bandwidth_gbps=1.0),
                   _records(0.005, 0.015, 400_000, 1))
    other = FakeRun("20260101-000400-fp16-eeee", RunConfig(hook="fp16", emulate_bandwidth_gbps=1.0),
                    _records(0.005, 0.015, 200_000, 1))
    rows = {r["run_id"]: r for r in whatif.checks([fast, other, slow, twin, old])}
    assert set(rows) == {slow.id, fast.id}  # fp16 has no twin on the real link
    assert {r["calibration_run_id"] for r in rows.values()} == {twin.id}
    link = ring.allreduce_s(400_000, 2, 0.1)
    assert rows[slow.id]["predicted_s"] == pytest.approx(0.010 + link)  # 32 ms of link
    # 3.2 ms of link at 1 Gb/s, but loopback took 4 ms here: the slower of the two counts
    assert rows[fast.id]["predicted_s"] == pytest.approx(0.014)
    assert rows[fast.id]["measured_s"] == pytest.approx(0.015)


# =========================================================================== a real sweep
def _end(proc: subprocess.Popen, runs_dir: Path) -> None:
    """Whatever happened, leave nothing running: stop the sweep, then every run it started."""
    if proc.poll() is None:
        for sweep in sw.list_sweeps(runs_dir):
            sweep.request_stop()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    from commlab.api import list_runs

    for run in list_runs(runs_dir):
        if run.status() in ("starting", "running", "lost"):
            run.stop()


def _wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {text!r}:\n{path.read_text()}")
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} within {timeout} s:\n{path.read_text()[-2000:]}")


def _sweep_cli(runs_dir: Path, log: Path, *extra: str) -> subprocess.Popen:
    """``commlab sweep`` of the mlp, 12 steps on 2 ranks, progress lines to ``log``."""
    argv = [sys.executable, "-m", "commlab", "sweep", "--workload", "mlp", "--steps", "12",
            "--world-size", "2", "--stall-timeout-s", str(RUN_TIMEOUT_S), "--runs-dir", str(runs_dir),
            *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def stopped_sweep(tmp_path_factory):
    """Allreduce and PowerSGD r=1 over an emulated link, with two seeds: seed 0's two runs, then
    seed 1's; stopped once the third starts, through the stop flag the page uses (the last test
    of the module resumes it)."""
    runs_dir = tmp_path_factory.mktemp("sweep_runs")
    log = runs_dir / "stderr.txt"
    proc = _sweep_cli(runs_dir, log, "--matrix-approximation-rank", "1", "--start-powersgd-iter",
                      "4", "--repeats", "2", "--emulate-bandwidth-gbps", str(BANDWIDTH_GBPS),
                      "--emulate-latency-us", str(LATENCY_US))
    try:
        _wait_for_text(log, "[3/4]", proc, 3 * RUN_TIMEOUT_S)
        (sweep,) = sw.list_sweeps(runs_dir)
        sweep.request_stop()
        out, _ = proc.communicate(timeout=120)
    finally:
        _end(proc, runs_dir)
    return {"rc": proc.returncode, "out": out, "stderr": log.read_text(), "sweep": sweep,
            "runs_dir": runs_dir}


# The first test to use the fixture waits for two runs and part of a third.
@pytest.mark.slow
@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_a_stopped_sweep_keeps_its_finished_runs(stopped_sweep):
    sweep = stopped_sweep["sweep"]
    assert stopped_sweep["rc"] == 1, stopped_sweep["stderr"][-3000:]
    assert sweep.status() == "stopped"
    assert [r.status() for r in sweep.runs()] == ["finished", "finished", "stopped"]
    assert [r.config().seed for r in sweep.runs()] == [0, 0, 1]
    assert "[1/4] allreduce [emulated 0.05 Gb/s, 20 µs] seed 0: running, step" in stopped_sweep["stderr"]
    assert "[2/4] powersgd r=1 start=4 [emulated 0.05 Gb/s, 20 µs] seed 0: finished, step 12/12" in \
        stopped_sweep["stderr"]
    assert "\r" not in stopped_sweep["stderr"]  # piped: lines, no bar
    assert "sweep " in stopped_sweep["out"] and "recommendation:" in stopped_sweep["out"]
    p = sweep.progress()
    assert (p.index, p.total, p.sweep_status) == (2, 4, "stopped")
    saved = sweep.saved_report()  # written as it stopped: the table the command printed
    assert saved["status"] == "stopped" and [r["status"] for r in saved["runs"]] == ["finished"] * 2 + ["stopped"]
    assert f"recommendation: {saved['recommendation']['text']}" in stopped_sweep["out"]


@pytest.mark.slow
@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_the_sweep_table_front_and_recommendation(stopped_sweep):
    sweep = stopped_sweep["sweep"]
    runs = sweep.results(cluster=quality.Cluster(64, 10.0, 5.0))
    assert list(runs["status"]) == ["finished", "finished", "stopped"]
    assert (runs["link"] == "emulated 0.05 Gb/s, 20 µs").all()
    assert all(label.endswith("[emulated 0.05 Gb/s, 20 µs]") for label in runs["label"])
    # eval_every's default evaluates after the last step: quality is held out, the target from it.
    assert list(runs["quality_basis"][:2]) == ["held-out"] * 2 and runs["target"].iloc[0] > 0
    assert runs.iloc[0]["quality"] == sweep.runs()[0].evals()[-1]["loss"]
    table = pareto.by_setting(runs)
    assert list(table["seeds"]) == [[0, 1], [0]] and list(table["finished"]) == [1, 1]
    assert table.iloc[0]["bytes_per_step"] > table.iloc[1]["bytes_per_step"]
    assert table["pareto_bytes"].any() and (table["predicted_s"] > 0).all()
    rec = pareto.recommend(runs, 1000)  # any loss is within: but one seed tells nothing
    assert not rec.decided and "1 seed cannot separate these: run 3 or more" in rec.text
    from commlab.figures.sweep import pareto_figure

    fig = pareto_figure(table, "time_s", table.iloc[1]["label"], runs)
    assert "emulated 0.05 Gb/s, 20 µs" in fig.layout.title.text
    assert {t.name for t in fig.data} >= {"Pareto front", "fp32 allreduce baseline", "recommended",
                                          "each seed"}


@pytest.mark.slow
@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_every_hook_collective_waited_for_the_emulated_link(stopped_sweep):
    for run in stopped_sweep["sweep"].runs()[:2]:
        assert run.meta()["emulated_link"] == {"bandwidth_gbps": BANDWIDTH_GBPS,
                                               "latency_us": LATENCY_US}
        link = Link(BANDWIDTH_GBPS, LATENCY_US)
        for row in run.metrics_records():
            # One collective carries the payload (allreduce) or the three together (PowerSGD's
            # uncompressed tensors, P and Q, one after another): the floor is their sum.
            floor = ring.allreduce_s(row["payload_bytes"], 2, BANDWIDTH_GBPS, LATENCY_US,
                                     row["collectives"])
            if row["collectives"] == 1:
                assert floor == pytest.approx(link.seconds(row["payload_bytes"], 2))
            assert row["hook_s"] >= floor * 0.999, (run.id, row)


@pytest.mark.slow
@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_what_if_profiles_from_the_sweep(stopped_sweep):
    runs = stopped_sweep["sweep"].runs()
    profiles = whatif.profiles_from_runs(runs)
    assert [p.run_id for p in profiles] == [r.id for r in runs[:2]]  # the stopped run has no steps
    base, psgd = profiles
    assert base.payload_bytes == runs[0].metrics_records()[-1]["payload_bytes"]
    assert psgd.payload_bytes == runs[1].metrics_records()[-1]["payload_bytes"] < base.payload_bytes
    assert (base.collectives, psgd.collectives) == (1, 3)
    assert base.compute_s == psgd.compute_s > 0  # shared from the baseline
    assert all(p.measured_over == "emulated 0.05 Gb/s, 20 µs" and p.arithmetic_s >= 0 for p in profiles)
    assert psgd.comm_s(1024, 1.0, 0.0) < base.comm_s(1024, 1.0, 0.0) / 10
    rows = whatif.predict(profiles, (2, 1024), (1, 100), latency_us=5.0)
    assert {r["label"] for r in rows} == {base.label, psgd.label} and len(rows) == 8
    assert whatif.checks(runs) == []  # every run is emulated: nothing calibrates a check


@pytest.mark.slow
@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_cli_whatif_on_the_sweep(stopped_sweep, capsys):
    rc = cli.main(["whatif", "--sweep", str(stopped_sweep["sweep"].path), "--world-sizes", "8,1024",
                   "--bandwidths-gbps", "1,100", "--json"])
    payload = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert rc == 0 and len(payload["profiles"]) == 2 and len(payload["predictions"]) == 8
    assert len(payload["break_even"]) == 2
    # the model's measured distance from a real link travels with its figures (commlab.tune.held_to_real)
    assert {r["hook"] for r in payload["held_to_real"]} == {p["hook"] for p in payload["profiles"]} & {
        "allreduce", "powersgd"}


@pytest.mark.slow
@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_pages_show_the_sweep_and_the_model(stopped_sweep, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(stopped_sweep["runs_dir"]))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900).run()
    at.switch_page("pages/sweep.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.get("plotly_chart")) == 3 and any("emulated 0.05 Gb/s" in w.value for w in at.warning)
    assert any("Recommendation" in w.value and "1 seed cannot separate" in w.value for w in at.warning)
    assert any("was stopped with 2 run(s) finished and 2 to go" in i.value for i in at.info)
    assert any(b.label == "Resume sweep" for b in at.button)
    at.switch_page("pages/what_if.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.get("plotly_chart")) == 3
    assert "The model held to a real link" in [h.value for h in at.subheader]
    held = next(d.value for d in at.dataframe if "whatif / real" in d.value.columns)
    assert "powersgd" in set(held["hook"]) and len(held) % 3 == 0  # three measured rates a hook


@pytest.mark.slow
@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_a_resumed_sweep_runs_only_what_is_left(stopped_sweep):
    """Last of the fixture's tests: it changes the sweep.  The two finished runs are kept, the
    stopped one runs anew, the fourth after it."""
    sweep, runs_dir = stopped_sweep["sweep"], stopped_sweep["runs_dir"]
    before = [r.path for r in sweep.runs()]
    out = subprocess.run([sys.executable, "-m", "commlab", "sweep", "--resume", sweep.id,
                          "--runs-dir", str(runs_dir), "--json"], capture_output=True, text=True,
                         cwd=ROOT, timeout=2 * RUN_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    after = sweep.runs()
    assert [r.status() for r in after] == ["finished"] * 4
    assert [r.path for r in after[:2]] == before[:2] and after[2].path != before[2]
    payload = json.loads(out.stdout.splitlines()[-1])
    assert [s["seeds"] for s in payload["settings"]] == [[0, 1], [0, 1]]
    assert "2 seeds cannot separate these: run 3 or more" in payload["recommendation"]["text"]
    assert json.loads(json.dumps(sweep.saved_report())) == payload  # result.json, as printed
    with pytest.raises(ConfigError, match="only a stopped or lost sweep resumes.*--show"):
        sw.resume(sweep)
    # A finished sweep shown again: the same table and recommendation, from its runs.
    shown = subprocess.run([sys.executable, "-m", "commlab", "sweep", "--show", sweep.id,
                            "--runs-dir", str(runs_dir)], capture_output=True, text=True, cwd=ROOT,
                           timeout=RUN_TIMEOUT_S)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert f"sweep {sweep.id}: finished" in shown.stdout
    assert f"recommendation: {payload['recommendation']['text']}" in shown.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ctrl_c_stops_the_sweep_and_its_run(tmp_path):
    log = tmp_path / "stderr.txt"
    proc = _sweep_cli(tmp_path, log, "--matrix-approximation-rank", "1", "--no-baseline", "--repeats", "1")
    try:
        _wait_for_text(log, "[1/1]", proc, 300)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        _end(proc, tmp_path)
    assert proc.returncode == 1 and ": stopped (" in out.splitlines()[0], out
    (sweep,) = sw.list_sweeps(tmp_path)
    assert sweep.status() == "stopped" and [r.status() for r in sweep.runs()] == ["stopped"]


@pytest.mark.timeout(1800)
def test_sweep_page_shows_progress_and_stops_a_running_sweep(tmp_path, monkeypatch):
    """A sweep that this test pretends to execute (its own PID owns it): the page's fragment draws
    the progress bar, and its Stop button raises the stop flag the executor polls."""
    import psutil
    from streamlit.testing.v1 import AppTest

    sweep = sw.create(sw.SweepSpec(base=RunConfig(workload="mlp", steps=10, runs_dir=str(tmp_path)),
                                   matrix_approximation_rank=[1, 2], repeats=1))
    me = psutil.Process()
    sw._write_state(sweep, pid=me.pid, create_time=me.create_time())
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900).run()
    at.switch_page("pages/sweep.py").run()
    assert not at.exception, [e.value for e in at.exception]
    (bar,) = at.get("progress")
    assert "[1/3] allreduce: starting, step 0/10" in bar.proto.text
    next(b for b in at.button if b.label == "Stop sweep").click().run()
    assert sweep.stop_requested()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_start_sweep_on_the_page_shows_its_progress_and_stop_ends_it(tmp_path, monkeypatch):
    """The Start button as a person presses it: a real sweep starts, the same rerun shows its
    progress and Stop (it used to raise StreamlitWidgetAlreadyInstantiatedError), Stop ends it."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900).run()
    at.switch_page("pages/sweep.py").run()
    at.number_input(key="sweep_steps").set_value(200)
    at.number_input(key="sweep_world_size").set_value(1)
    at.text_input(key="sweep_matrix_approximation_rank").set_value("1")
    next(b for b in at.button if b.label == "Start sweep").click().run()
    assert not at.exception, [e.value for e in at.exception]
    (sweep,) = sw.list_sweeps(tmp_path)
    assert at.get("progress"), "a started sweep shows its progress in the same rerun"
    next(b for b in at.button if b.label == "Stop sweep").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert sweep.wait(timeout=300) == "stopped"


# =========================================================================== pages with no runs
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("page,title", [("pages/sweep.py", "Sweep"), ("pages/what_if.py", "What if")])
def test_pages_work_with_no_runs(page, title, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900).run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == title and at.info


@pytest.mark.timeout(1800)
def test_sweep_page_names_every_bad_field_and_starts_nothing(tmp_path, monkeypatch):
    """0 steps, 0 ranks, 0 seeds and a rank that is not a number: each named under its field and
    in one line, as Launch does; no sweep starts."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900).run()
    at.switch_page("pages/sweep.py").run()
    at.number_input(key="sweep_steps").set_value(0)
    at.number_input(key="sweep_world_size").set_value(0)
    at.number_input(key="sweep_repeats").set_value(0)
    at.text_input(key="sweep_matrix_approximation_rank").set_value("1,x")
    next(b for b in at.button if b.label == "Start sweep").click().run()
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    summary = next(e for e in errors if e.startswith("Fix 4 setting(s) before the sweep starts"))
    for name in ("ranks (world_size)", "steps", "seeds per setting (repeats)", "matrix_approximation_rank"):
        assert f"**{name}**" in summary.replace("\\_", "_"), summary
    assert any("got 0" in e and "1 to 64" in e for e in errors)  # the reason, shown, not on hover
    assert any("comma-separated list of int" in e for e in errors)
    assert sw.list_sweeps(tmp_path) == [] and not any(tmp_path.iterdir())


@pytest.mark.timeout(1800)
def test_the_sweep_page_offers_the_chosen_hook_s_own_axes_and_names_a_bad_value(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900).run()
    at.switch_page("pages/sweep.py").run()
    assert at.selectbox(key="sweep_hook").value == "powersgd"
    at.selectbox(key="sweep_hook").set_value("topk").run()
    assert not at.exception, [e.value for e in at.exception]
    keys = {w.key for w in at.text_input} | {w.key for w in at.multiselect}
    assert "sweep_compress_ratio" in keys and "sweep_matrix_approximation_rank" not in keys
    assert "sweep_wrapper" not in keys  # no compress wrapper may wrap top-k
    assert at.text_input(key="sweep_compress_ratio").value == "0.001,0.01,0.1"
    at.text_input(key="sweep_compress_ratio").set_value("0.01,2")
    next(b for b in at.button if b.label == "Start sweep").click().run()
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    assert any(e.startswith("Fix 1 setting(s)") and "compress_ratio" in e.replace("\\_", "_") for e in errors)
    assert any("topk compress_ratio=2: must be at most 1" in e.replace("\\_", "_") for e in errors), errors
    assert sw.list_sweeps(tmp_path) == []
    at.selectbox(key="sweep_hook").set_value("signsgd").run()  # a hook with nothing to sweep
    assert not at.exception, [e.value for e in at.exception]
    assert any("signsgd has no settings to sweep" in c.value for c in at.caption)
    # the job's axis, beside any hook's: the sharding every run (the baselines too) runs at
    assert at.multiselect(key="sweep_sharding").value == ["ddp"]
    at.multiselect(key="sweep_sharding").set_value(["fsdp"])
    next(b for b in at.button if b.label == "Start sweep").click().run()
    errors = [e.value.replace("\\_", "_") for e in at.error]
    assert any("signsgd runs at none of fsdp" in e for e in errors), errors
    assert sw.list_sweeps(tmp_path) == []


def test_the_what_if_measures_a_baseline_with_the_runs_by_default(tmp_path):
    """In runs mode the What-if page's default: the newest baseline run and the newest of its job
    (the newest runs alone may have no baseline, and then no speed-up or break-even)."""
    from commlab.engine import run_folder, store

    def made(name, **cfg):
        (tmp_path / name).mkdir()
        store.write_json(tmp_path / name / "config.json", RunConfig(**{"workload": "mlp", **cfg}).to_dict())
        return run_folder.RunFolder(tmp_path / name)

    newest_first = [made("d", hook="powersgd"), made("c", hook="topk"), made("b", hook="fp16"),
                    made("a"), made("z", hook="powersgd", world_size=4)]
    newest_first.insert(0, made("e", hook="topk", world_size=4))  # another job: not measured with "a"
    assert [r.id for r in whatif.with_a_baseline(newest_first)] == ["a", "d", "c"]
    assert [r.id for r in whatif.with_a_baseline(newest_first, against="fp16")] == ["b", "d", "c"]
    assert [r.id for r in whatif.with_a_baseline(newest_first[:3])] == ["e", "d", "c"]  # no baseline
