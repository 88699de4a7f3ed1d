"""commlab's overhead, measured as ratios of median step times taken side by side.

    python benchmarks/overhead.py [--steps 100] [--rounds 5] [--only bare,off] [--json]

Per round, in alternation (in reverse order every other round): a bare torchrun DDP script
(benchmarks/bare_ddp.py), ``commlab run`` with instrumentation off, and ``commlab run`` at its
defaults, all on the same workload, hook (allreduce), seed and ranks; then commlab's PowerSGD
and PyTorch's powerSGD_hook on one bucket (where PyTorch's works on Gloo).  A step's time is the time from the end of one step to the end
of the next (commlab's ``t`` column), so whatever the lab does between steps counts; steps 0
and 1 are left out (DDP builds its buckets in the first and rebuilds them after it).  Prints the
medians and, with --json, one JSON object last: ratio_off, ratio_default,
ratio_powersgd_vs_stock (those whose sides ``--only`` kept: on a busy machine, more rounds of
the two that matter most in the same time), each with its rounds' ratios and a 95% bootstrap
interval (``_interval_95``): single rounds on a shared machine spread by ±5% and more, so a
ratio is read with its interval.  The side ``lab_steps`` measures, in one bare run per round,
what the worker adds to every step with its instrumentation off (the mean-loss allreduce and
rank 0's metrics line, ``bare_ddp.py --lab-steps alternate``) step by step, ABBA, as
``ratio_lab_steps``: the run-to-run noise that the other ratios carry cancels there.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ratios import median_ratio_interval, step_times_by_side  # noqa: E402  (benchmarks/)

from commlab.api import RunConfig, run  # noqa: E402
from commlab.engine.commands import torchrun_argv, worker_env  # noqa: E402

SIDES = ("bare", "off", "default", "powersgd_commlab", "powersgd_stock")
AB = "lab_steps"  # not a run of its own: one bare run that alternates the worker's additions
RATIOS = (("ratio_off", ("off", "bare"), 1.03), ("ratio_default", ("default", "bare"), 1.10),
          ("ratio_powersgd_vs_stock", ("powersgd_commlab", "powersgd_stock"), 1.00))


def median_step(ends: list[float]) -> float:
    return statistics.median(b - a for a, b in zip(ends[1:], ends[2:]))


def bare_run(cfg: RunConfig, out: Path, lab_steps: str = "never") -> dict:
    """benchmarks/bare_ddp.py's record: per step, when it ended and whether it was a lab step."""
    # The torchrun command and the workers' environment are commlab's own (loopback, threads per
    # rank, the agent's polling), so that only the lab's own work differs between the two.
    proc = subprocess.run(
        torchrun_argv(cfg.world_size, [
            str(ROOT / "benchmarks" / "bare_ddp.py"), "--workload", cfg.workload,
            "--steps", str(cfg.steps), "--batch-size", str(cfg.batch_size), "--lr", str(cfg.lr),
            "--seed", str(cfg.seed), "--bucket-cap-mb", str(cfg.bucket_cap_mb), "--out", str(out),
            "--lab-steps", lab_steps]),
        cwd=ROOT, capture_output=True, text=True, env=worker_env(cfg))
    if proc.returncode != 0:
        raise RuntimeError(f"bare DDP failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def bare(cfg: RunConfig, out: Path) -> float:
    return median_step(bare_run(cfg, out)["ends"])


def lab_steps_ab(cfg: RunConfig, out: Path) -> dict[bool, list[float]]:
    """Step times of one bare run whose every other pair of steps does the worker's additions
    (``--lab-steps alternate``), by whether the step did; steps 0 and 1 left out."""
    rec = bare_run(cfg, out, "alternate")
    return step_times_by_side(rec["ends"], rec["lab_steps"], 2)


def lab(cfg: RunConfig) -> float:
    r = run(cfg)
    if r.status() != "finished":
        raise RuntimeError(f"{cfg.label()} ended {r.status()}: {r.status_record().get('error')}")
    return median_step([row["t"] for row in r.metrics_records()])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workload", default="charlm")
    p.add_argument("--only", default=",".join((*SIDES, AB)),
                   help=f"the sides to run, of {','.join((*SIDES, AB))}")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    sides = a.only.split(",")
    if unknown := set(sides) - set(SIDES) - {AB}:
        p.error(f"--only: unknown sides {sorted(unknown)}; the sides are {', '.join(SIDES)}, {AB}")
    tmp = Path(tempfile.mkdtemp(prefix="commlab-bench-"))
    base = RunConfig(workload=a.workload, steps=a.steps, world_size=2, runs_dir=str(tmp))
    one_bucket = dict(hook="powersgd", bucket_cap_mb=1000.0, start_powerSGD_iter=2, instrument=False)
    measure = {"bare": lambda i: bare(base, tmp / f"bare{i}.json"),
               "off": lambda i: lab(base.with_overrides(instrument=False)),
               "default": lambda i: lab(base),
               "powersgd_commlab": lambda i: lab(base.with_overrides(impl="commlab", **one_bucket)),
               "powersgd_stock": lambda i: lab(base.with_overrides(impl="stock", **one_bucket))}
    t: dict[str, list[float]] = {k: [] for k in SIDES if k in sides}
    ab: dict[bool, list[float]] = {True: [], False: []}
    ab_per_round = []
    for i in range(a.rounds):
        # ABBA: a load that grows (or falls) through a round weighs on every side alike.
        for k in list(t) if i % 2 == 0 else reversed(list(t)):
            t[k].append(measure[k](i))
        if AB in sides:
            got = lab_steps_ab(base, tmp / f"ab{i}.json")
            ab_per_round.append(statistics.median(got[True]) / statistics.median(got[False]))
            for k, v in got.items():
                ab[k] += v
        print(f"round {i + 1}/{a.rounds}: " + ", ".join(f"{k} {v[-1] * 1e3:.1f} ms" for k, v in t.items())
              + (f", lab steps / plain steps {ab_per_round[-1]:.3f}" if ab_per_round else "")
              + f", load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in t.items()}
    result = {"workload": a.workload, "steps": a.steps, "rounds": a.rounds,
              "median_step_ms": {k: round(v * 1e3, 2) for k, v in med.items()}}
    for key, (num, den), target in RATIOS:
        if num in med and den in med:
            result[key] = med[num] / med[den]
            result[key + "_per_round"] = [x / y for x, y in zip(t[num], t[den])]
            result[key + "_interval_95"] = median_ratio_interval(t[num], t[den], paired=True)
            if not a.json:
                lo, hi = result[key + "_interval_95"]
                print(f"{num} / {den}: {result[key]:.3f} [{lo:.3f}, {hi:.3f}]  (target <= {target})")
    if ab_per_round:
        result["ratio_lab_steps"] = statistics.median(ab[True]) / statistics.median(ab[False])
        result["ratio_lab_steps_per_round"] = ab_per_round
        result["ratio_lab_steps_interval_95"] = median_ratio_interval(ab[True], ab[False], paired=False)
        if not a.json:
            lo, hi = result["ratio_lab_steps_interval_95"]
            print(f"lab steps / plain steps: {result['ratio_lab_steps']:.3f} [{lo:.3f}, {hi:.3f}]  "
                  "(target <= 1.03)")
    if not a.json:
        print(f"median step (ms): {result['median_step_ms']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
