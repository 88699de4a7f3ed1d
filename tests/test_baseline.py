"""The baseline as a choice (fp32, fp16 or bf16 allreduce: commlab.tune.baseline) and "does it pay
here?" (commlab.tune.payoff): the break-even against the what-if model's own step-time curve, the
sweep's and the comparison's tables and the recommendation judged against a 16-bit baseline (pure,
on made-up profiles and tables), then one real tiny sweep judged against fp16 that the commands and
the Sweep and Compare pages are pressed on."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from commlab import cli
from commlab.config import ConfigError, RunConfig
from commlab.figures.compare import short_pays
from commlab.tune import baseline as baselines
from commlab.tune import compare, pareto, payoff, quality, whatif
from commlab.tune import sweep as sw
from commlab.tune.quality import Cluster

ROOT = Path(__file__).resolve().parents[1]


def _profile(label, hook, arithmetic_s, payload, calls=1, collective="all_reduce", overlap=0.0,
             run_id=None):
    return whatif.HookProfile(label, hook, "none", 0.010, arithmetic_s, payload, calls, 2,
                              run_id or label, "loopback", 5, overlap_share=overlap, collective=collective)


FP32 = _profile("allreduce", "allreduce", 0.0, 100e6)
FP16 = _profile("fp16", "fp16", 0.001, 50e6)
PSGD = _profile("powersgd r=1", "powersgd", 0.005, 1e6, calls=3)
HIDDEN = _profile("powersgd r=1 overlapped", "powersgd", 0.005, 1e6, calls=3, overlap=0.6)
GATHER = _profile("topk", "topk", 0.0, 1e6, collective="all_gather")
# On 64 workers this allgather sends more than allreduce's 197 MB (63 x 5 MB), but pays N-1
# latencies to the ring allreduce's 2(N-1): it wins on fast links only.
WIDE = _profile("topk wide", "topk", 0.0, 5e6, collective="all_gather")


# ============================================================================ the break-even
@pytest.mark.parametrize("base,against,other,world,latency,verdict", [
    (FP32, "allreduce", PSGD, 64, 5.0, payoff.BELOW),
    (FP16, "fp16", PSGD, 64, 5.0, payoff.BELOW),
    (FP16, "fp16", HIDDEN, 8, 5.0, payoff.BELOW),  # overlap hides part of each side's communication
    (FP16, "fp16", FP32, 64, 5.0, payoff.ABOVE),  # no casts: fp32 wins where the bytes cost little
    (FP32, "allreduce", WIDE, 64, 2000.0, payoff.ABOVE),
])
def test_the_break_even_is_where_the_models_own_curves_cross(base, against, other, world, latency, verdict):
    got = payoff.payoff(base, other, world, latency, against)
    assert got.verdict == verdict
    bw = got.break_even_gbps
    assert base.step_s(world, bw, latency) == pytest.approx(other.step_s(world, bw, latency), rel=1e-9)
    below, above = bw * 0.99, bw * 1.01
    faster_below = other.step_s(world, below, latency) < base.step_s(world, below, latency)
    faster_above = other.step_s(world, above, latency) < base.step_s(world, above, latency)
    assert (faster_below, faster_above) == ((True, False) if verdict == payoff.BELOW else (False, True))
    said = got.sentence()
    assert said == (f"beats {baselines.title(against)} in step time on links {verdict} {bw:.3g} Gb/s "
                    f"({world} workers, {latency:g} µs per hop)")


def test_always_never_and_the_baseline_itself():
    free = _profile("free", "powersgd", 0.0, 1e6)  # fewer bytes, nothing extra: faster everywhere
    heavy = _profile("heavy", "powersgd", 0.005, 200e6)  # more bytes and more arithmetic
    grid = [10.0 ** k for k in range(-3, 7)]
    always = payoff.payoff(FP16, free, 64, 5.0, "fp16")
    assert always.verdict == payoff.ALWAYS and always.break_even_gbps is None
    assert all(free.step_s(64, bw, 5.0) < FP16.step_s(64, bw, 5.0) for bw in grid)
    assert always.sentence().startswith("always beats fp16 allreduce in step time, at every bandwidth")
    never = payoff.payoff(FP16, heavy, 64, 5.0, "fp16")
    assert never.verdict == payoff.NEVER and never.break_even_gbps is None
    assert all(heavy.step_s(64, bw, 5.0) >= FP16.step_s(64, bw, 5.0) for bw in grid)
    assert never.sentence() == ("never beats fp16 allreduce in step time at this size, at any bandwidth "
                                "(64 workers, 5 µs per hop)")
    # A hook that pays on 8 workers may not on 1,024: an allgather's bytes grow with the workers.
    gather = _profile("g", "topk", 0.010, 2e6, collective="all_gather")
    assert payoff.payoff(FP32, gather, 8, 5.0).verdict == payoff.BELOW
    assert payoff.payoff(FP32, gather, 1024, 5.0).verdict == payoff.NEVER
    itself = payoff.payoff(FP16, FP16, 64, 5.0, "fp16")
    assert itself.verdict == payoff.ITSELF and itself.sentence() == "is the baseline (fp16 allreduce)"
    assert payoff.speedup(FP16, PSGD, 64, 1.0, 5.0) == pytest.approx(
        FP16.step_s(64, 1.0, 5.0) / PSGD.step_s(64, 1.0, 5.0))


# ============================================================================ the choice
def test_the_baseline_is_one_of_three_and_a_bad_one_is_named():
    assert baselines.BASELINES == ("allreduce", "fp16", "bf16")
    assert [baselines.title(b) for b in baselines.BASELINES] == ["fp32 allreduce", "fp16 allreduce",
                                                                 "bf16 allreduce"]
    with pytest.raises(ConfigError) as e:
        baselines.check("fp8")
    assert set(e.value.errors) == {"against"}
    assert "'fp8'" in e.value.errors["against"] and "bf16 (bf16 allreduce)" in e.value.errors["against"]
    fp16 = RunConfig(hook="fp16").to_dict()
    wrapped = RunConfig(hook="allreduce", wrapper="fp16").to_dict()
    plain = RunConfig(hook="allreduce").to_dict()
    assert baselines.is_baseline(fp16, "fp16") and baselines.is_baseline(wrapped, "fp16")
    assert not baselines.is_baseline(wrapped, "allreduce") and baselines.is_baseline(plain, "allreduce")
    assert not baselines.is_baseline(RunConfig(hook="powersgd", wrapper="fp16").to_dict(), "fp16")


def test_a_sweep_judged_against_fp16_runs_fp32_then_fp16_first_in_every_seed():
    spec = sw.SweepSpec(base=RunConfig(workload="mlp", steps=10), repeats=2, against="bf16",
                        matrix_approximation_rank=[1, 2])
    plan = [(c.hook, c.seed) for c in sw.grid(spec)]
    assert plan == [(h, s) for s in (0, 1) for h in ("allreduce", "bf16", "powersgd", "powersgd")]
    assert sw.SweepSpec.from_dict(spec.to_dict()).against == "bf16"
    assert sw.SweepSpec.from_dict({k: v for k, v in spec.to_dict().items() if k != "against"}).against == \
        "allreduce"  # a sweep planned before the choice
    with pytest.raises(ConfigError, match="unknown baseline 'fp8'"):
        sw.SweepSpec.from_dict({**spec.to_dict(), "against": "fp8"})  # a sweep.json changed by hand
    with pytest.raises(ConfigError) as e:
        sw.grid(sw.SweepSpec(against="fp8"))
    assert "unknown baseline 'fp8'" in e.value.errors["against"]
    with pytest.raises(ConfigError) as e:
        sw.grid(sw.SweepSpec(base=RunConfig(hook="fp16"), against="fp16"))
    assert "fp16 is the hook swept" in e.value.errors["against"]


def test_a_stored_plan_with_an_unknown_baseline_is_named_damaged(tmp_path):
    sweep = sw.create(sw.SweepSpec(base=RunConfig(runs_dir=str(tmp_path)), against="fp16"))
    plan = json.loads(sweep.file("sweep.json").read_text())
    assert plan["spec"]["against"] == "fp16"
    plan["spec"]["against"] = "fp8"
    sweep.file("sweep.json").write_text(json.dumps(plan))
    assert sweep.damage().startswith("damaged: sweep.json") and "unknown baseline 'fp8'" in sweep.damage()


def test_the_commands_refuse_a_bad_baseline_before_starting_anything(tmp_path, capsys):
    assert cli.main(["sweep", "--against", "fp8", "--runs-dir", str(tmp_path), "--dry-run", "--json"]) == 2
    assert "unknown baseline 'fp8'" in json.loads(capsys.readouterr().out.splitlines()[-1])["errors"]["against"]
    assert cli.main(["compare", "--hooks", "topk", "--against", "fp8", "--runs-dir", str(tmp_path)]) == 2
    assert "unknown baseline 'fp8'" in capsys.readouterr().err
    assert cli.main(["whatif", "x", "--against", "fp8", "--runs-dir", str(tmp_path)]) == 2
    assert "unknown baseline 'fp8'" in capsys.readouterr().err
    assert cli.main(["sweep", "--resume", "x", "--against", "fp16", "--runs-dir", str(tmp_path)]) == 2
    assert "keeps its plan's baseline" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    assert cli.main(["sweep", "--against", "fp16", "--dry-run", "--json", "--runs-dir", str(tmp_path)]) == 0
    runs = json.loads(capsys.readouterr().out.splitlines()[-1])["runs"]
    assert runs[:3] == ["allreduce seed 0", "fp16 seed 0", "powersgd r=1 start=20 seed 0"]
    from commlab.commands.compare import _hooks

    assert _hooks("topk", "fp16") == ["allreduce", "fp16", "topk"]
    assert _hooks("fp16,topk", "fp16") == ["allreduce", "fp16", "topk"]


# ============================================================================ the recommendation
SEEDS = [1.00, 1.10, 0.95, 1.05]


def _runs(against: str, settings: dict[str, tuple[str, float, float]], cluster: str | None = None,
          pays: dict[str, str] | None = None) -> pd.DataFrame:
    """A sweep's runs table judged against ``against``: label -> (hook, loss factor, bytes per step),
    the same factor on every seed (the paired rule sees no noise); fp32 allreduce at 2,000 B and
    fp16 at 1,000 B first."""
    rows = []
    table = {"allreduce": ("allreduce", 1.0, 2000.0), "fp16": ("fp16", 1.0, 1000.0), **settings}
    for label, (hook, factor, nbytes) in table.items():
        for seed, loss in enumerate(SEEDS):
            rows.append({c: None for c in sw.ROW_COLUMNS} | {
                "label": label, "seed": seed, "run_id": f"{label}-{seed}", "status": "finished",
                "diverged": False, "baseline": baselines.is_baseline({"hook": hook}, against),
                "against": against, "hook": hook, "wrapper": "none", "quality": loss * factor,
                "quality_basis": quality.HELD_OUT, "bytes_per_step": nbytes, "time_s": 10.0,
                "predicted_s": nbytes / 100, "link": "loopback", "reach_predicted_s": nbytes / 200,
                "reach_step": 10, "pays": (pays or {}).get(label)})
    df = pd.DataFrame(rows, columns=sw.ROW_COLUMNS)
    df["target"], df["cluster"] = 1.1, cluster
    return df


def test_the_recommendation_names_its_baseline_and_never_picks_more_bytes_than_it():
    runs = _runs("fp16", {"r=2": ("powersgd", 1.01, 400.0)}, cluster="64 workers, 10 Gb/s, 5 µs",
                 pays={"r=2": "beats fp16 allreduce in step time on links below 12 Gb/s (...)"})
    rec = pareto.recommend(runs, 5)
    assert rec.decided and rec.label == "r=2" and rec.against == "fp16"
    assert "2.5x fewer than fp16 allreduce" in rec.text and "against fp16 allreduce's" in rec.text
    assert "as good as fp16 allreduce" in rec.rule and "if fewer than fp16 allreduce's" in rec.rule
    assert rec.here == ("on 64 workers, 10 Gb/s, 5 µs: r=2 reaches the target loss 1.1 in 2.00 s predicted, "
                        "fp16 allreduce in 5.00 s predicted; it beats fp16 allreduce in step time on "
                        "links below 12 Gb/s (...)")
    table = pareto.by_setting(runs).set_index("label")
    assert table.loc["r=2", "bytes_ratio"] == pytest.approx(2.5)
    assert table.loc["allreduce", "bytes_ratio"] == pytest.approx(0.5)
    assert table.loc["r=2", "pays"].startswith("beats fp16") and table["against"].eq("fp16").all()
    # fp32 allreduce is as good as fp16, but sends twice the bytes: the baseline is kept.
    keep = pareto.recommend(_runs("fp16", {"r=2": ("powersgd", 1.5, 400.0)}), 5)
    by = {v["setting"]: v["verdict"] for v in keep.verdicts}
    assert by == {"allreduce": pareto.AS_GOOD, "r=2": pareto.WORSE}
    assert keep.label == "fp16" and keep.text.startswith("keep fp16 allreduce") and keep.here is None
    # The same runs judged against fp32: r=2 is 5x fewer than fp32 allreduce; fp16 is a setting.
    fp32 = pareto.recommend(_runs("allreduce", {"r=2": ("powersgd", 1.01, 400.0)}), 5)
    assert fp32.label == "r=2" and "5.0x fewer than fp32 allreduce" in fp32.text
    assert "fp16" in {v["setting"] for v in fp32.verdicts}
    none = _runs("bf16", {"r=2": ("powersgd", 1.01, 400.0)})
    assert "no bf16 allreduce baseline to compare with" in pareto.recommend(none, 5).text


# ============================================================================ the comparison
def _records(payload: float, n: int = 12) -> list[dict]:
    return [{"step": i, "loss": 2.0 - 0.05 * i, "step_s": 0.010, "hook_s": 0.004, "t": 0.01 * (i + 1),
             "payload_bytes": payload, "plain_bytes": 4000.0, "collectives": 1} for i in range(n)]


def _entries():
    made = []
    for run_id, hook, payload in (("ar", "allreduce", 4000.0), ("h", "fp16", 2000.0), ("tk", "topk", 800.0)):
        cfg = RunConfig(hook=hook, workload="mlp").to_dict()
        made.append(compare.Entry(run_id, cfg, _records(payload), [{"step": 12, "loss": 1.25}]))
    return made


def test_the_comparison_judges_against_the_chosen_baseline():
    entries = _entries()
    profiles = [whatif.profile_from_records(e.records, e.cfg, e.run_id) for e in entries]
    cluster = Cluster(8, 1.0, 5.0)
    rows = {r["run_id"]: r for r in compare.table(entries, profiles, cluster, "fp16")}
    assert [r["baseline"] for r in rows.values()] == [False, True, False]
    assert {r["against"] for r in rows.values()} == {"fp16"}
    assert rows["tk"]["compression_ratio"] == pytest.approx(2000 / 800)
    assert rows["ar"]["compression_ratio"] == pytest.approx(0.5) and rows["h"]["speedup"] == 1
    by = {p.run_id: p for p in profiles}
    want = payoff.payoff(by["h"], by["tk"], 8, 5.0, "fp16")
    assert rows["tk"]["pays"] == want.sentence() and rows["tk"]["break_even_gbps"] == want.break_even_gbps
    assert rows["tk"]["speedup"] == pytest.approx(by["h"].step_s(8, 1.0, 5.0) / by["tk"].step_s(8, 1.0, 5.0))
    assert rows["h"]["pays"] == "is the baseline (fp16 allreduce)"
    assert compare.missing(list(rows.values()), "fp16") is None
    fp32 = {r["run_id"]: r for r in compare.table(entries, profiles, cluster)}
    assert fp32["tk"]["compression_ratio"] == pytest.approx(4000 / 800) and fp32["ar"]["baseline"]
    assert "fp32 allreduce" in fp32["tk"]["pays"]
    bf16 = compare.table(entries, profiles, cluster, "bf16")
    assert all(r["speedup"] is None and r["pays"] is None for r in bf16)
    assert bf16[2]["compression_ratio"] is None  # a 16-bit ratio needs its run
    assert "no bf16 allreduce run among these" in compare.missing(bf16, "bf16")
    with pytest.raises(ConfigError, match="against"):
        compare.table(entries, profiles, cluster, "fp8")
    assert not math.isnan(rows["tk"]["break_even_gbps"] or 0)


# ============================================================================ a real sweep
RUN_TIMEOUT_S = 1200  # a run reaches its first step in 5 s idle, minutes on a loaded machine


@pytest.fixture(scope="module")
def fp16_sweep(tmp_path_factory):
    """Top-k at k = 1% judged against fp16 allreduce, one seed, 2 ranks, 6 steps of the mlp: three
    real runs (fp32 allreduce, fp16, top-k) on one set of warm ranks."""
    runs_dir = tmp_path_factory.mktemp("fp16_sweep")
    base = RunConfig(hook="topk", workload="mlp", steps=6, world_size=2, runs_dir=str(runs_dir),
                     stall_timeout_s=RUN_TIMEOUT_S)
    sweep = sw.run_sweep(sw.SweepSpec(base=base, compress_ratio=[0.01], repeats=1, against="fp16"))
    return {"sweep": sweep, "runs_dir": runs_dir}


@pytest.mark.slow
@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_a_real_sweep_is_judged_against_fp16_and_again_against_fp32(fp16_sweep, capsys):
    sweep, runs_dir = fp16_sweep["sweep"], fp16_sweep["runs_dir"]
    assert sweep.status() == "finished" and [r.status() for r in sweep.runs()] == ["finished"] * 3
    cluster = Cluster(64, 10.0, 5.0)
    runs = sweep.results(cluster=cluster)
    assert list(runs["hook"]) == ["allreduce", "fp16", "topk"] and list(runs["baseline"]) == [False, True, False]
    fp32, fp16, topk = runs.to_dict(orient="records")
    assert fp16["bytes_per_step"] == pytest.approx(fp32["bytes_per_step"] / 2, rel=0.01)  # 2 bytes for 4
    profiles = {p.run_id: p for p in whatif.profiles_from_runs(sweep.runs())}
    want = payoff.payoff(profiles[fp16["run_id"]], profiles[topk["run_id"]], 64, 5.0, "fp16")
    assert topk["pays"] == want.sentence() and "fp16 allreduce" in topk["pays"]
    assert fp16["pays"] == "is the baseline (fp16 allreduce)"
    table = pareto.by_setting(runs).set_index("hook")
    assert table.loc["topk", "bytes_ratio"] == pytest.approx(fp16["bytes_per_step"] / topk["bytes_per_step"])
    saved = sweep.saved_report()
    assert saved["against"] == "fp16" and "as good as fp16 allreduce" in saved["recommendation"]["rule"]
    again = sweep.report(cluster, against="allreduce")
    assert [r["baseline"] for r in again["runs"]] == [True, False, False]
    assert "fp32 allreduce" in again["recommendation"]["rule"]
    with pytest.raises(ConfigError, match="against"):
        sweep.results(against="fp8")
    # The command: judged against the plan's baseline, or another named.
    assert cli.main(["sweep", "--show", sweep.id, "--runs-dir", str(runs_dir)]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the table's prose wraps at 100 columns
    assert "judged against fp16 allreduce" in text and f"pays here? it {want.sentence()}" in text
    assert cli.main(["sweep", "--show", sweep.id, "--runs-dir", str(runs_dir), "--against", "allreduce",
                     "--json"]) == 0
    shown = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert shown["against"] == "allreduce" and shown["settings"][0]["baseline"]
    ids = [r.id for r in sweep.runs()]
    assert cli.main(["compare", *ids, "--runs-dir", str(runs_dir), "--against", "fp16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["against"] == "fp16" and [r["baseline"] for r in out["rows"]] == [False, True, False]
    assert out["missing_baseline"] is None and "fp16 allreduce" in out["rows"][2]["pays"]
    assert cli.main(["compare", *ids, "--runs-dir", str(runs_dir), "--against", "bf16"]) == 0
    assert "no bf16 allreduce run among these" in capsys.readouterr().out


def _app(monkeypatch, runs_dir):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(runs_dir))
    return AppTest.from_file(str(ROOT / "app.py"), default_timeout=900).run()


def _ok(at):
    assert not at.exception, [e.value for e in at.exception]


@pytest.mark.slow
@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_the_sweep_page_judges_against_the_baseline_chosen(fp16_sweep, monkeypatch):
    sweep = fp16_sweep["sweep"]
    at = _app(monkeypatch, fp16_sweep["runs_dir"])
    at.switch_page("pages/sweep.py").run()
    _ok(at)
    judge = at.selectbox(key=f"judge_{sweep.id}")
    assert judge.value == "fp16"
    said = " ".join(m.value for m in (*at.warning, *at.success, *at.info))
    assert "Recommendation** (against fp16 allreduce)" in said
    settings = at.dataframe[0].value.set_index("label")
    assert "fp16 allreduce" in settings.loc["topk compress_ratio=0.01", "pays"]
    assert settings.loc["fp16", "pays"] == "is the baseline (fp16 allreduce)"
    judge.set_value("allreduce").run()
    _ok(at)
    said = " ".join(m.value for m in (*at.warning, *at.success, *at.info))
    assert "Recommendation** (against fp32 allreduce)" in said
    assert "fp32 allreduce" in at.dataframe[0].value.set_index("label").loc["topk compress_ratio=0.01", "pays"]
    # The form: a hook judged against itself is refused under the field, and nothing starts.
    at.selectbox(key="sweep_hook").set_value("fp16").run()
    at.selectbox(key="sweep_against").set_value("fp16")
    next(b for b in at.button if b.label == "Start sweep").click().run()
    _ok(at)
    assert any("fp16 is the hook swept" in e.value for e in at.error)
    assert [s.id for s in sw.list_sweeps(fp16_sweep["runs_dir"])] == [sweep.id]


@pytest.mark.slow
@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_the_compare_and_what_if_pages_judge_against_the_baseline_chosen(fp16_sweep, monkeypatch):
    at = _app(monkeypatch, fp16_sweep["runs_dir"])
    at.switch_page("pages/compare.py").run()
    _ok(at)
    against = next(s for s in at.selectbox if s.label == "Judged against")
    assert against.value == "allreduce"
    against.set_value("fp16").run()
    _ok(at)
    rows = at.dataframe[0].value.set_index("hook")
    assert rows.loc["fp16", "pays"] == "is the baseline (fp16 allreduce)"
    # the verdict in a cell's words (figures.compare.short_pays), judged against fp16 on the page's
    # cluster (64 workers, 5 µs per hop): the baseline the caption names
    by_hook = {p.hook: p for p in whatif.profiles_from_runs(fp16_sweep["sweep"].runs())}
    want = payoff.payoff(by_hook["fp16"], by_hook["topk"], 64, 5.0, "fp16")
    assert rows.loc["topk", "pays"] == short_pays({"verdict": want.verdict, "pays": want.sentence(),
                                                   "break_even_gbps": want.break_even_gbps})
    assert rows.loc["fp16", "compression_ratio"] == 1
    assert any("against **fp16 allreduce**" in c.value for c in at.caption)
    next(s for s in at.selectbox if s.label == "Judged against").set_value("bf16").run()
    _ok(at)
    assert any("no bf16 allreduce run among these" in w.value for w in at.warning)
    at.switch_page("pages/what_if.py").run()
    _ok(at)
    at.selectbox(key="whatif_against").set_value("fp16").run()
    _ok(at)
    pays = next(d.value for d in at.dataframe if "pays here?" in d.value.columns)
    assert set(pays["hook"]) == {"allreduce", "topk compress_ratio=0.01"}
    assert pays["pays here?"].str.contains("fp16 allreduce").all()
    at.selectbox(key="whatif_against").set_value("bf16").run()
    _ok(at)
    assert any("No bf16 allreduce run among these" in i.value for i in at.info)


def test_a_recommendation_predicted_slower_on_the_cluster_says_so_in_the_same_sentence():
    runs = _runs("allreduce", {"r=2": ("powersgd", 1.01, 400.0)}, cluster="64 workers, 10 Gb/s, 5 µs",
                 pays={"r=2": "beats fp32 allreduce in step time on links below 2.64 Gb/s (...)"})
    runs["step_s"] = [0.197 if b else 0.298 for b in runs["baseline"]]
    runs["baseline_step_s"] = 0.197
    rec = pareto.recommend(runs, 5)
    assert rec.decided and rec.label == "r=2"
    assert ("; but per step it is predicted SLOWER there than fp32 allreduce: 298 ms against 197 ms "
            "(chosen on loss and bytes); it beats fp32 allreduce in step time on links below 2.64 Gb/s") in rec.here
    runs["step_s"] = [0.197 if b else 0.150 for b in runs["baseline"]]
    faster = pareto.recommend(runs, 5).here
    assert "SLOWER" not in faster and "per step 150 ms predicted against fp32 allreduce's 197 ms" in faster


def test_pays_here_over_seeds_is_the_median_with_its_range_and_says_when_seeds_differ():
    each = [payoff.Payoff("r=1", "allreduce", 64, 5.0, payoff.BELOW, g) for g in (6.47, 9.0, 4.9)]
    over = payoff.over_seeds(each)
    assert over.break_even_gbps == 6.47 and (over.low_gbps, over.high_gbps) == (4.9, 9.0)
    assert over.sentence() == ("beats fp32 allreduce in step time on links below 6.47 Gb/s (64 workers, "
                               "5 µs per hop, median of 3 seeds: 4.9 to 9 Gb/s)")
    mixed = payoff.over_seeds(each[:2] + [payoff.Payoff("r=1", "allreduce", 64, 5.0, payoff.NEVER)])
    assert mixed.sentence().endswith("median of 2 seeds: 6.47 to 9 Gb/s); 1 of 3 seeds say otherwise")
    assert payoff.over_seeds(each[:1]).sentence() == each[0].sentence() and payoff.over_seeds([]) is None


def test_the_what_if_answers_once_per_setting_each_seed_against_its_own_baseline():
    import dataclasses

    def seed(p, k, arithmetic_s):
        return dataclasses.replace(p, label=f"{p.label} #{k + 1}" if k else p.label, setting=p.label,
                                   seed=k, run_id=f"{p.label}-{k}", arithmetic_s=arithmetic_s)

    profiles = [seed(FP32, k, 0.0) for k in range(3)] + [seed(PSGD, k, a) for k, a in enumerate((0.004, 0.005, 0.007))]
    rows = whatif.over_seeds(whatif.predict(profiles, (64,), (1.0, 10.0), 5.0))
    assert [(r["label"], r["seeds"]) for r in rows] == [("allreduce", 3), ("powersgd r=1", 3)] * 2
    each = [whatif.predict([p], (64,), (1.0,), 5.0)[0]["step_s"] for p in profiles[3:]]
    (psgd,) = [r for r in rows if r["label"] == "powersgd r=1" and r["bandwidth_gbps"] == 1.0]
    assert psgd["step_s"] == sorted(each)[1] and (psgd["step_s_low"], psgd["step_s_high"]) == (min(each), max(each))
    (said,) = payoff.by_setting(profiles, 64, 5.0)
    alone = [payoff.payoff(profiles[k], profiles[3 + k], 64, 5.0) for k in range(3)]
    assert said.label == "powersgd r=1" and said.seeds == said.agree == 3
    assert said.break_even_gbps == sorted(p.break_even_gbps for p in alone)[1]
    assert payoff.by_setting(profiles[3:], 64, 5.0) == []  # no baseline among them
