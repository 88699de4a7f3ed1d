"""The sweep decides, or says exactly what would (issue 39 item 5): sequential seeds where a verdict is
open, within the sweep's budget (``--max-repeats``); past it, the baseline kept with its reason and the
command that would narrow it.

The pure tests use made-up tables (``test_recommend._runs``); the slow one a real sweep of the mlp,
20 steps, PowerSGD r=1 and r=2, whose runs are the same bit for bit on every machine: with a 6%
tolerance r=2's three seeds leave its verdict open, by a spread that says five would decide it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commlab.config import ConfigError, RunConfig
from commlab.tune import pareto
from commlab.tune import sweep as sw
from tests.test_recommend import BASE, _runs

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 1200  # eleven 20-step runs take 15 s idle, minutes on a loaded machine

# r=2 4% worse with a paired spread of about 0.014: open at 4 seeds, decided by about 6 at that spread.
OPEN = {"r=2": ([b * 1.04 + d for b, d in zip(BASE, (0.012, -0.012, 0.01, -0.008))], 100.0),
        "r=1": ([b * 1.10 for b in BASE], 50.0)}


def test_an_open_verdict_is_seeded_only_while_its_spread_says_the_budget_may_decide_it():
    needed = pareto.recommend(_runs(OPEN), 5).seeds_needed
    rec = pareto.recommend(_runs(OPEN), 5, most_seeds=needed)
    assert not rec.decided and rec.to_seed(needed) == ["r=2"] and rec.open == ["r=2"]
    assert rec.text.startswith("no decision")
    # r=1 is decided (worse): it gets no seed; with a budget its spread cannot meet, nothing does.
    assert rec.to_seed(needed - 1) == []


def test_past_the_budget_the_baseline_is_kept_with_its_reason():
    needed = pareto.recommend(_runs(OPEN), 5).seeds_needed
    rec = pareto.recommend(_runs(OPEN), 5, most_seeds=needed - 1)
    assert rec.decided and rec.label == "allreduce" and rec.run_id == "allreduce-0"
    assert rec.text.startswith("keep fp32 allreduce: after 4 seeds no setting that sends fewer bytes "
                               "is shown within 5% of its loss")
    assert "r=2: undecided [" in rec.text and "r=1: worse" in rec.text
    assert f"(--max-repeats {needed - 1}) would not decide" in rec.text
    assert rec.open == ["r=2"] and rec.seeds_needed == needed and rec.to_seed(needed) == []
    # At the budget's seeds already: the same, whatever the spread says.
    assert pareto.recommend(_runs(OPEN), 5, most_seeds=4).label == "allreduce"


def test_too_few_or_unfinished_seeds_are_the_plan_s_and_keep_it_open():
    """A sweep planned with fewer seeds than the rule's least is a look, not a decision: its
    verdicts stay open whatever the budget, as does one with an unfinished seed."""
    few = pareto.recommend(_runs({"r=2": (BASE[:2], 10.0)}, base=BASE[:2]), 5, most_seeds=5)
    assert not few.decided and few.to_seed(5) == [] and "run 3 or more" in few.text
    stopped = pareto.recommend(_runs(OPEN, statuses={("r=2", 3): "stopped"}), 5, most_seeds=3)
    assert not stopped.decided and stopped.text.endswith("r=2: unfinished seed")


def test_the_plan_grows_by_appended_runs_each_keeping_its_place():
    spec = sw.SweepSpec(base=RunConfig(workload="mlp", steps=10), matrix_approximation_rank=[1, 2])
    planned = [(c.hook, c.matrix_approximation_rank, c.seed) for c in sw.grid(spec)]
    assert sw.spec.per_seed(spec) == 3 and sw.spec.baseline_hooks(spec) == ["allreduce"]
    grown = sw.spec.next_seed(spec, [0, 2])  # the baseline and r=2
    assert [(c.hook, c.matrix_approximation_rank, c.seed) for c in grown] == \
        planned + [("allreduce", 1, 3), ("powersgd", 2, 3)]
    assert sw.SweepSpec.from_dict(spec.to_dict()).added == [[0, 3], [2, 3]]
    # --repeats 5 appends what the plan lacks: r=1's seed 3, then seed 4 of every setting.
    assert sw.spec.missing(spec, 5) == [[1, 3], [0, 4], [1, 4], [2, 4]]
    full = sw.more_seeds(spec, 5)
    assert full[:11] == grown and len(full) == 15 and sw.plan_label(full[11], spec) == \
        "powersgd r=1 start=20 seed 3"
    with pytest.raises(ConfigError, match="already plans 4"):
        sw.more_seeds(spec, 4)
    with pytest.raises(ConfigError) as e:
        sw.grid(sw.SweepSpec(base=RunConfig(workload="mlp"), added=[[7, 3]]))
    assert "added" in e.value.errors
    with pytest.raises(ConfigError) as e:
        sw.grid(sw.SweepSpec(max_repeats=0))
    assert "max_repeats" in e.value.errors


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_a_sweep_seeds_its_open_verdict_until_it_decides(tmp_path, capsys):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "commlab", "sweep", "--workload", "mlp", "--steps", "20",
                          "--world-size", "2", "--matrix-approximation-rank", "1,2",
                          "--start-powersgd-iter", "4", "--tolerance-pct", "6", "--runs-dir",
                          str(tmp_path), "--json"], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=RUN_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.splitlines()[-1])
    (sweep,) = sw.list_sweeps(tmp_path)
    # After the nine planned runs, seed 3 for the baseline and r=2 alone (r=1 is decided: worse).
    assert [(r.config().hook, r.config().matrix_approximation_rank, r.config().seed)
            for r in sweep.runs()][9:] == [("allreduce", 1, 3), ("powersgd", 2, 3)]
    assert [r.status() for r in sweep.runs()] == ["finished"] * 11
    assert sweep.spec().added == [[0, 3], [2, 3]]
    rec = report["recommendation"]
    assert rec["decided"] and rec["label"] == "powersgd r=2 start=4" and "over 4 seeds" in rec["text"]
    assert [s["seeds"] for s in report["settings"]] == [[0, 1, 2, 3], [0, 1, 2], [0, 1, 2, 3]]
    assert report["next"] is None
    assert sweep.saved_report()["recommendation"] == rec
    # Were r=2's gap within the seed noise, the next step sweeps it again twice as long: a command
    # the CLI plans as the baseline and r=2 with the sweep's four seeds and 40 steps.
    step = sw.table._longer(sweep, pareto.Recommendation("", None, None, "", open=["powersgd r=2 start=4"]))
    assert step["runs"] == 8 and step["command"].startswith("commlab sweep ")
    from commlab import cli

    assert cli.main([*step["command"].split()[1:], "--dry-run", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out.splitlines()[-1])["runs"]
    assert planned == [f"{s} seed {seed}" for seed in range(4) for s in ("allreduce", "powersgd r=2 start=4")]
    assert "--steps 40 " in step["command"] and f"--runs-dir {tmp_path}" in step["command"]
    # Its first estimate, made as its second run ended: nine runs, fifteen were every setting seeded
    # up to the budget (two more seeds of three settings).
    estimate = report["estimate"]
    assert (estimate["runs"], estimate["most_runs"]) == (9, 15) and estimate["first_s"] > estimate["run_s"] > 0


def test_the_estimate_counts_the_start_up_once_and_the_budget_as_a_bound():
    import time

    from commlab.tune.sweep.progress import Estimate

    e = Estimate(runs=21, first_s=40.0, run_s=30.0, most_runs=35)
    assert (e.total_s, e.most_s) == (640.0, 1060.0)
    assert e.line(5) == ("estimate: about 10 min 40 s for its 21 runs (the first took 40.0 s with the "
                         "start-up, the second 30.0 s); at most 17 min 40 s if the seeds cannot tell and "
                         "it seeds the open settings up to 5 seeds (--max-repeats)")
    assert "at most" not in Estimate(4, 5.0, 1.0, 4).line(5)
    # Time left at the pace since the first run ended: the 30 s start-up before it is left out.
    since = {"time": time.time() - 50, "fraction": 0.0, "paced": time.time() - 20, "paced_fraction": 0.25}
    assert sw.eta(0.5, since) == pytest.approx(40, abs=0.5)


def test_the_budget_is_the_plan_s_and_a_resume_keeps_it(tmp_path, capsys):
    from commlab import cli

    assert cli.main(["sweep", "--resume", "any", "--max-repeats", "8", "--runs-dir", str(tmp_path)]) == 2
    assert "max_repeats: a resumed sweep keeps its plan's budget" in capsys.readouterr().err
    assert cli.main(["sweep", "--max-repeats", "0", "--dry-run", "--runs-dir", str(tmp_path)]) == 2
    assert "max_repeats: must be a whole number of seeds from 1 to 100" in capsys.readouterr().err
