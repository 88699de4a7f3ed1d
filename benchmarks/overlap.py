"""commlab's PowerSGD overlapping backward against its blocking variant, and against allreduce.

    python benchmarks/overlap.py [--workloads wide,charlm] [--steps 24] [--rounds 1] [--json]

Per workload, 2 ranks: a calibration run (overlapping PowerSGD, no emulated link) measures
backward's compute time B and the bytes PowerSGD hands over per compressed step S, from its traced
steps; the balanced bandwidth is the one at which a ring allreduce of S takes B
(``commlab.analysis.ring.allreduce_s``).  Then at a quarter of it, at it and at four times it, side
by side in alternation (blocking, overlapping; ``--rounds`` times): the median step time over
the compressed steps (commlab's ``t`` column: from the end of one step to the end of the next)
and the overlap share of the traced steps (``commlab.analysis.timeline``).  Allreduce is measured
once on the real link (its step time and overlap share); over these links it is not run: it
hands over hundreds of times PowerSGD's bytes, which at them take tens of seconds a step (the
ring time of its bytes is printed instead, ``allreduce_link_ms``).  Buckets are
capped small enough that each workload has several: with one bucket, DDP calls the hook at the
end of backward and nothing can overlap.  Prints a table and, with --json, one JSON object last:
``ratio_overlap_vs_blocking`` and ``overlap_share`` per workload and bandwidth (the target is a
ratio of at most 0.85 at the balanced bandwidth).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from commlab.analysis import ring, timeline  # noqa: E402
from commlab.api import RunConfig, run  # noqa: E402

BUCKET_CAP_MB = {"wide": 4.0, "charlm": 0.25}  # several buckets each (DDP's default cap: one)
START = 4  # PowerSGD compresses from this step; steps before are left out of the medians
VARIANTS = {"blocking": dict(hook="powersgd", impl="commlab", overlap=False),
            "overlapping": dict(hook="powersgd", impl="commlab", overlap=True)}


def _finished(cfg: RunConfig):
    r = run(cfg)
    if r.status() != "finished":
        raise RuntimeError(f"{cfg.label()} ended {r.status()}: {r.status_record().get('error')}")
    return r


def median_step(r) -> float:
    ends = [row["t"] for row in r.metrics_records() if row["step"] >= START]
    return statistics.median(b - a for a, b in zip(ends, ends[1:]))


def calibrate(base: RunConfig) -> tuple[float, float]:
    """(backward's compute seconds, hook bytes per step) at PowerSGD's compressed steps."""
    r = _finished(base.with_overrides(**VARIANTS["overlapping"]))
    steps = r.timeline()["steps"]
    computes, sent = [], []
    for ranks in steps.values():
        for events in ranks.values():
            lo, hi = timeline.backward_compute(events)
            computes.append(hi - lo)
            sent.append(sum(e["bytes"] for e in events
                            if e["kind"] == "collective" and e["category"] == "hook"))
    return statistics.median(computes), statistics.median(sent)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="wide,charlm")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--rank", type=int, default=16, help=(
        "matrix_approximation_rank: at rank 1 PowerSGD sends so little that the balanced "
        "bandwidth falls below the emulated link's lowest"))
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="commlab-overlap-"))
    result: dict = {"steps": a.steps, "rounds": a.rounds, "workloads": {}}
    for workload in a.workloads.split(","):
        traced = list(range(a.steps - 3, a.steps - 1))  # two compressed steps near the end
        base = RunConfig(workload=workload, steps=a.steps, world_size=2, runs_dir=str(tmp),
                         bucket_cap_mb=BUCKET_CAP_MB.get(workload, 1.0), start_powerSGD_iter=START,
                         trace_steps=traced, matrix_approximation_rank=a.rank)
        backward_s, sent = calibrate(base)
        plain = _finished(base.with_overrides(hook="allreduce"))
        plain_bytes = statistics.median(row["plain_bytes"] for row in plain.metrics_records())
        balanced = ring.allreduce_s(sent, 2, 1.0, 0.0) / backward_s  # Gb/s at which S takes B
        out = {"backward_ms": backward_s * 1e3, "powersgd_bytes_per_step": sent,
               "balanced_gbps": balanced, "bandwidths": {},
               "allreduce_real_link": {"median_step_ms": median_step(plain) * 1e3,
                                       "overlap_share": plain.timeline().get("overlap_share")}}
        lowest = RunConfig.__dataclass_fields__["emulate_bandwidth_gbps"].metadata["bounds"].lo
        for name, factor in (("quarter", 0.25), ("balanced", 1.0), ("fourfold", 4.0)):
            gbps = max(balanced * factor, lowest)
            step_s = {k: [] for k in VARIANTS}
            share = {k: [] for k in VARIANTS}
            for i in range(a.rounds):
                for variant, overrides in VARIANTS.items():
                    r = _finished(base.with_overrides(emulate_bandwidth_gbps=gbps, **overrides))
                    step_s[variant].append(median_step(r))
                    share[variant].append(r.timeline().get("overlap_share"))
                    print(f"{workload} {name} ({gbps:.4g} Gb/s) round {i + 1}: {variant} "
                          f"{step_s[variant][-1] * 1e3:.1f} ms, overlap share {share[variant][-1]}",
                          file=sys.stderr)
            med = {k: statistics.median(v) for k, v in step_s.items()}
            out["bandwidths"][name] = {
                "gbps": gbps, "median_step_ms": {k: round(v * 1e3, 2) for k, v in med.items()},
                "overlap_share": {k: statistics.median(v) if None not in v else None
                                  for k, v in share.items()},
                "ratio_overlap_vs_blocking": med["overlapping"] / med["blocking"],
                "allreduce_link_ms": ring.allreduce_s(plain_bytes, 2, gbps, 0.0) * 1e3}
        result["workloads"][workload] = out
    if not a.json:
        for workload, out in result["workloads"].items():
            print(f"{workload}: backward {out['backward_ms']:.1f} ms, PowerSGD "
                  f"{out['powersgd_bytes_per_step']:,} B/step, balanced {out['balanced_gbps']:.4g} Gb/s")
            for name, b in out["bandwidths"].items():
                print(f"  {name:9s} {b['gbps']:.4g} Gb/s  step ms {b['median_step_ms']}  "
                      f"overlap/blocking {b['ratio_overlap_vs_blocking']:.3f}  "
                      f"shares {b['overlap_share']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
