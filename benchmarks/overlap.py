"""commlab's PowerSGD overlapping backward against its blocking variant, and against allreduce.

    python benchmarks/overlap.py [--workloads wide,charlm] [--steps 20] [--rounds 2] [--json]

Per workload, 2 ranks, at a batch large enough that backward computes for tens of milliseconds
while the gradients (and so PowerSGD's bytes) stay what they are (``WORKLOADS``): a calibration
run (overlapping PowerSGD, no emulated link) measures backward's compute time B (from its start
to the last hook call, less the hook calls: ``timeline.backward_compute_s``) and the bytes
PowerSGD hands over per compressed step S, from its traced steps; the balanced bandwidth is
the one at which the emulated link carries S in B (a ring allreduce of S,
``commlab.analysis.ring.allreduce_s``).
Then at a quarter of it, at it and at four times it, side by side in alternation (blocking,
overlapping; ``--rounds`` times): the median step time over the compressed steps (commlab's
``t`` column: from the end of one step to the end of the next), the overlap share of the traced
steps (``timeline.run_overlap_share``), and two checks that the configuration is what it says:
``link_over_backward``, what the link charged a step (the metrics' ``link_s``) over that run's
own B, near 1 at the balanced bandwidth however loaded the machine was during calibration; and
``link_share``, the part of the hook collectives' time that only the emulated link held
(``timeline.run_link_share``): well above a half, the link, not loopback Gloo or a late peer,
is what the collectives wait for.

What can overlap: on 2 cores with 2 ranks, each rank has about one core, so the communication
thread's compute (PowerSGD's matrix products and orthogonalization) takes that core from
backward and hides nothing; only waits (the link, a peer) can overlap.  The blocking variant
already hides each bucket's Q allreduce (its hook returns that future), but stops backward for
the uncompressed and P allreduces.  How much can hide depends on when DDP calls the hooks: on
``wide`` the last two of its four buckets are ready at the very end of backward.

Allreduce is measured once on the real link (its step time and overlap share); over these links
it is not run: it hands over hundreds of times PowerSGD's bytes, which at them take tens of
seconds a step (the ring time of its bytes is printed instead, ``allreduce_link_ms``).  Buckets
are capped small enough that each workload has several: with one bucket, DDP calls the hook at
the end of backward and nothing can overlap.  Prints a table and, with --json, one JSON object
last: ``ratio_overlap_vs_blocking``, ``overlap_share``, ``link_share`` and ``link_over_backward``
per workload and bandwidth (the target is a ratio of at most 0.85 at the balanced bandwidth).
On a shared machine the load changes between runs as well: ``ratio_per_round`` and each run's
``link_over_backward`` show by how much.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from commlab.analysis import ring, timeline  # noqa: E402
from commlab.api import RunConfig, run  # noqa: E402

# Buckets: several each (DDP's default cap makes one).  Batch: backward computes for tens of ms.
WORKLOADS = {"wide": dict(bucket_cap_mb=4.0, batch_size=128),
             "charlm": dict(bucket_cap_mb=0.25, batch_size=16)}
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


def _traced(r) -> list[list[dict]]:
    return [events for ranks in r.timeline()["steps"].values() for events in ranks.values()]


def backward_s(r) -> float:
    """The median, over the run's traced steps and ranks, of backward's compute time (without
    the blocking hook's waits)."""
    return statistics.median(map(timeline.backward_compute_s, _traced(r)))


def calibrate(base: RunConfig) -> tuple[float, float]:
    """(backward's compute seconds, hook bytes per step) at PowerSGD's compressed steps."""
    r = _finished(base.with_overrides(**VARIANTS["overlapping"]))
    sent = [sum(e["bytes"] for e in events if e["kind"] == "collective" and e["category"] == "hook")
            for events in _traced(r)]
    return backward_s(r), statistics.median(sent)


def measure(cfg: RunConfig) -> dict:
    r = _finished(cfg)
    link = statistics.median(row["link_s"] for row in r.metrics_records() if row["step"] >= START)
    return {"step_s": median_step(r), "overlap_share": r.timeline().get("overlap_share"),
            "link_share": timeline.run_link_share(r.timeline()["steps"]),
            "link_over_backward": link / backward_s(r)}


def _median(values: list) -> float | None:
    return statistics.median(values) if values and None not in values else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="wide,charlm")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=None, help="instead of WORKLOADS' batch")
    p.add_argument("--rank", type=int, default=16, help=(
        "matrix_approximation_rank: at rank 1 PowerSGD sends so little that the balanced "
        "bandwidth falls below the emulated link's lowest"))
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="commlab-overlap-"))
    result: dict = {"steps": a.steps, "rounds": a.rounds, "load_before": os.getloadavg(),
                    "workloads": {}}
    for workload in a.workloads.split(","):
        traced = list(range(a.steps - 4, a.steps - 1))  # three compressed steps near the end
        setup = {**WORKLOADS.get(workload, dict(bucket_cap_mb=1.0, batch_size=16))}
        if a.batch_size:
            setup["batch_size"] = a.batch_size
        base = RunConfig(workload=workload, steps=a.steps, world_size=2, runs_dir=str(tmp),
                         start_powerSGD_iter=START, trace_steps=traced,
                         matrix_approximation_rank=a.rank, **setup)
        backward, sent = calibrate(base)
        plain = _finished(base.with_overrides(hook="allreduce"))
        plain_bytes = statistics.median(row["plain_bytes"] for row in plain.metrics_records())
        balanced = ring.allreduce_s(sent, 2, 1.0, 0.0) / backward  # Gb/s at which S takes B
        out = {**setup, "backward_ms": backward * 1e3, "powersgd_bytes_per_step": sent,
               "balanced_gbps": balanced, "bandwidths": {},
               "allreduce_real_link": {"median_step_ms": median_step(plain) * 1e3,
                                       "overlap_share": plain.timeline().get("overlap_share")}}
        lowest = RunConfig.__dataclass_fields__["emulate_bandwidth_gbps"].metadata["bounds"].lo
        for name, factor in (("quarter", 0.25), ("balanced", 1.0), ("fourfold", 4.0)):
            gbps = max(balanced * factor, lowest)
            got: dict[str, list[dict]] = {k: [] for k in VARIANTS}
            for i in range(a.rounds):
                for variant, overrides in VARIANTS.items():
                    m = measure(base.with_overrides(emulate_bandwidth_gbps=gbps, **overrides))
                    got[variant].append(m)
                    print(f"{workload} {name} ({gbps:.4g} Gb/s) round {i + 1}: {variant} "
                          f"{m['step_s'] * 1e3:.1f} ms, overlap share {m['overlap_share']:.2f}, "
                          f"link share {m['link_share']:.2f}, link/backward "
                          f"{m['link_over_backward']:.2f}, load {os.getloadavg()[0]:.1f}",
                          file=sys.stderr)
            med = {k: {key: _median([m[key] for m in ms]) for key in ms[0]} for k, ms in got.items()}
            out["bandwidths"][name] = {
                "gbps": gbps,
                "median_step_ms": {k: round(v["step_s"] * 1e3, 2) for k, v in med.items()},
                "ratio_overlap_vs_blocking": med["overlapping"]["step_s"] / med["blocking"]["step_s"],
                "ratio_per_round": [o["step_s"] / b["step_s"]
                                    for b, o in zip(got["blocking"], got["overlapping"])],
                **{key: {k: v[key] for k, v in med.items()}
                   for key in ("overlap_share", "link_share", "link_over_backward")},
                "allreduce_link_ms": ring.allreduce_s(plain_bytes, 2, gbps, 0.0) * 1e3}
        result["workloads"][workload] = out
    result["load_after"] = os.getloadavg()
    if not a.json:
        for workload, out in result["workloads"].items():
            print(f"{workload} (batch {out['batch_size']}): backward {out['backward_ms']:.1f} ms, "
                  f"PowerSGD {out['powersgd_bytes_per_step']:,} B/step, "
                  f"balanced {out['balanced_gbps']:.4g} Gb/s")
            for name, b in out["bandwidths"].items():
                print(f"  {name:9s} {b['gbps']:.4g} Gb/s  step ms {b['median_step_ms']}  "
                      f"overlap/blocking {b['ratio_overlap_vs_blocking']:.3f}  "
                      f"overlap shares {b['overlap_share']}  link shares {b['link_share']}  "
                      f"link/backward {b['link_over_backward']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
