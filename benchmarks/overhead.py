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
interval (``_interval_95``): single rounds on a shared machine spread by ±5%, so a ratio is
read with its interval.
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

from commlab.api import RunConfig, run  # noqa: E402
from commlab.engine.launch import worker_env  # noqa: E402
from ratios import median_ratio_interval  # noqa: E402  (benchmarks/)

SIDES = ("bare", "off", "default", "powersgd_commlab", "powersgd_stock")
RATIOS = (("ratio_off", ("off", "bare"), 1.03), ("ratio_default", ("default", "bare"), 1.10),
          ("ratio_powersgd_vs_stock", ("powersgd_commlab", "powersgd_stock"), 1.00))


def median_step(ends: list[float]) -> float:
    return statistics.median(b - a for a, b in zip(ends[1:], ends[2:]))


def bare(cfg: RunConfig, out: Path) -> float:
    # The workers' environment is commlab's own (loopback, threads per rank), so that only the
    # lab's own work differs between the two.
    proc = subprocess.run(
        [sys.executable, "-m", "commlab.engine.torchrun", "--nproc-per-node", str(cfg.world_size),
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1",
         str(ROOT / "benchmarks" / "bare_ddp.py"), "--workload", cfg.workload,
         "--steps", str(cfg.steps), "--batch-size", str(cfg.batch_size), "--lr", str(cfg.lr),
         "--seed", str(cfg.seed), "--bucket-cap-mb", str(cfg.bucket_cap_mb), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, env=worker_env(cfg))
    if proc.returncode != 0:
        raise RuntimeError(f"bare DDP failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return median_step(json.loads(out.read_text()))


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
    p.add_argument("--only", default=",".join(SIDES), help=f"the sides to run, of {','.join(SIDES)}")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    sides = a.only.split(",")
    if unknown := set(sides) - set(SIDES):
        p.error(f"--only: unknown sides {sorted(unknown)}; the sides are {', '.join(SIDES)}")
    tmp = Path(tempfile.mkdtemp(prefix="commlab-bench-"))
    base = RunConfig(workload=a.workload, steps=a.steps, world_size=2, runs_dir=str(tmp))
    one_bucket = dict(hook="powersgd", bucket_cap_mb=1000.0, start_powerSGD_iter=2, instrument=False)
    measure = {"bare": lambda i: bare(base, tmp / f"bare{i}.json"),
               "off": lambda i: lab(base.with_overrides(instrument=False)),
               "default": lambda i: lab(base),
               "powersgd_commlab": lambda i: lab(base.with_overrides(impl="commlab", **one_bucket)),
               "powersgd_stock": lambda i: lab(base.with_overrides(impl="stock", **one_bucket))}
    t: dict[str, list[float]] = {k: [] for k in SIDES if k in sides}
    for i in range(a.rounds):
        # ABBA: a load that grows (or falls) through a round weighs on every side alike.
        for k in list(t) if i % 2 == 0 else reversed(list(t)):
            t[k].append(measure[k](i))
        print(f"round {i + 1}/{a.rounds}: " + ", ".join(f"{k} {v[-1] * 1e3:.1f} ms" for k, v in t.items())
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
    if not a.json:
        print(f"median step (ms): {result['median_step_ms']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
