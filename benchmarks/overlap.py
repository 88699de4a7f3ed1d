"""commlab's PowerSGD overlapping backward against its blocking variant, and against allreduce.

    python benchmarks/overlap.py [--workloads wide,charlm] [--links quarter,balanced,fourfold]
        [--steps 20] [--ab-steps 90] [--rounds 2] [--json]

Per workload, 2 ranks, at a batch large enough that backward computes for tens of milliseconds
while the gradients (and so PowerSGD's bytes) stay what they are (``WORKLOADS``): a calibration
run (overlapping PowerSGD, no emulated link) measures backward's compute time B (from its start
to the last hook call, less the hook calls: ``timeline.backward_compute_s``) and the bytes
PowerSGD hands over per compressed step S, from its traced steps; the balanced bandwidth is
the one at which the emulated link carries S in B (a ring allreduce of S,
``commlab.analysis.ring.allreduce_s``).  Then at a quarter of it, at it and at four times it:

- the ratio, from ``--rounds`` A/B runs (``benchmarks/overlap_ab.py``) that switch between the
  two variants step by step (ABCCBA, with the third side below), so that the machine's load,
  which on a shared machine moves whole runs by ±10%, weighs on each alike: the median step time
  of each variant over the compressed steps (from the end of one step to the end of the next),
  their ratio with a 95% bootstrap interval over the steps (``ratio_interval_95``) and each
  run's own ratio;
- the floor of that ratio, ``ratio_unlinked_vs_blocking``: the third side of the same A/B runs
  is the overlapping variant with the link off, the step of a variant that hid all of the
  link's time; and ``hidden_share``, of the time the link added to the blocking variant's step,
  the part the overlapping one hid;
- from one lab run of each variant (``commlab run``, traced): its median step time, the overlap
  share of its traced steps (``timeline.run_overlap_share``), and two checks that the
  configuration is what it says: ``link_over_backward``, what the link charged a step (the
  metrics' ``link_s``) over that run's own B, near 1 at the balanced bandwidth however loaded the
  machine was during calibration; and ``link_share``, the part of the hook collectives' time
  that only the emulated link held (``timeline.run_link_share``).

What can overlap: on 2 cores with 2 ranks, each rank has about one core, so the communication
thread's compute (PowerSGD's matrix products, orthogonalization and error feedback) takes that
core from backward and hides nothing; only waits (the link, a peer) can overlap.  The blocking
variant already hides each bucket's Q allreduce (its hook returns that future), but stops
backward for the uncompressed and P allreduces.  The overlapping one cannot start before DDP
calls the first hook, so at the balanced link its last collective ends at least that long after
backward's compute (on ``wide``, one of four equal buckets: about a fifth of B).

Allreduce is measured once on the real link (its step time and overlap share); over these links
it is not run: it hands over hundreds of times PowerSGD's bytes, which at them take tens of
seconds a step (the ring time of its bytes is printed instead, ``allreduce_link_ms``).  Buckets
are capped small enough that each workload has several: with one bucket, DDP calls the hook at
the end of backward and nothing can overlap.  Prints a table and, with --json, one JSON object
last: ``ratio_overlap_vs_blocking``, ``ratio_interval_95``, ``ratio_unlinked_vs_blocking``,
``hidden_share``, ``overlap_share``, ``link_share`` and ``link_over_backward`` per workload and
bandwidth (the target is a ratio of at most 0.85 at the balanced bandwidth; below its floor no
overlapping variant can go).
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

from commlab.analysis import ring, timeline  # noqa: E402
from commlab.api import RunConfig, run  # noqa: E402
from commlab.engine.commands import torchrun_argv, worker_env  # noqa: E402

# Buckets: several each (DDP's default cap makes one).  Batch: backward computes for tens of ms.
WORKLOADS = {"wide": dict(bucket_cap_mb=4.0, batch_size=128),
             "charlm": dict(bucket_cap_mb=0.25, batch_size=16)}
START = 4  # PowerSGD compresses from this step; steps before are left out of the medians
LINKS = {"quarter": 0.25, "balanced": 1.0, "fourfold": 4.0}  # bandwidth over the balanced one
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


def ab(cfg: RunConfig, out: Path) -> dict[str, list[float]]:
    """Step times of a run that alternates the variants and the unlinked floor step by step
    (``overlap_ab.py``), by side, over its compressed steps."""
    out.with_suffix(".config.json").write_text(cfg.to_json())
    proc = subprocess.run(
        torchrun_argv(cfg.world_size, [str(ROOT / "benchmarks" / "overlap_ab.py"),
                                       str(out.with_suffix(".config.json")), str(out)]),
        cwd=ROOT, capture_output=True, text=True, env=worker_env(cfg))
    if proc.returncode != 0:
        raise RuntimeError(f"the A/B run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rec = json.loads(out.read_text())
    # From the step after the first compressed one, which draws P and Q afresh.
    return step_times_by_side(rec["ends"], rec["sides"], START + 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="wide,charlm")
    p.add_argument("--steps", type=int, default=20, help="of each run of one variant (traced)")
    p.add_argument("--ab-steps", type=int, default=90, help="of each A/B run (a third per side)")
    p.add_argument("--rounds", type=int, default=2, help="A/B runs per bandwidth")
    p.add_argument("--batch-size", type=int, default=None, help="instead of WORKLOADS' batch")
    p.add_argument("--rank", type=int, default=16, help=(
        "matrix_approximation_rank: at rank 1 PowerSGD sends so little that the balanced "
        "bandwidth falls below the emulated link's lowest"))
    p.add_argument("--links", default=",".join(LINKS), help="of " + ", ".join(LINKS))
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="commlab-overlap-"))
    result: dict = {"steps": a.steps, "ab_steps": a.ab_steps, "rounds": a.rounds,
                    "load_before": os.getloadavg(), "workloads": {}}
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
        for name in a.links.split(","):
            gbps = max(balanced * LINKS[name], lowest)
            linked = base.with_overrides(emulate_bandwidth_gbps=gbps)
            steps: dict[str, list[float]] = {}
            per_round = []
            for i in range(a.rounds):
                got = ab(linked.with_overrides(hook="powersgd", impl="commlab", steps=a.ab_steps,
                                               trace_steps=[]), tmp / f"ab-{workload}-{name}-{i}.json")
                per_round.append(statistics.median(got["overlapping"]) / statistics.median(got["blocking"]))
                for k, v in got.items():
                    steps.setdefault(k, []).extend(v)
                print(f"{workload} {name} ({gbps:.4g} Gb/s) A/B run {i + 1}: "
                      + ", ".join(f"{k} {statistics.median(v) * 1e3:.1f} ms" for k, v in got.items())
                      + f", ratio {per_round[-1]:.3f}, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
            lab = {k: measure(linked.with_overrides(**v)) for k, v in VARIANTS.items()}
            print(f"{workload} {name}: lab runs " + ", ".join(
                f"{k} {m['step_s'] * 1e3:.1f} ms (overlap share {m['overlap_share']:.2f}, link share "
                f"{m['link_share']:.2f}, link/backward {m['link_over_backward']:.2f})"
                for k, m in lab.items()), file=sys.stderr)
            med = {k: statistics.median(v) for k, v in steps.items()}
            out["bandwidths"][name] = {
                "gbps": gbps,
                "median_step_ms": {k: round(v * 1e3, 2) for k, v in med.items()},
                "ratio_overlap_vs_blocking": med["overlapping"] / med["blocking"],
                "ratio_interval_95": median_ratio_interval(steps["overlapping"], steps["blocking"], paired=False),
                # The floor: the ratio of a variant that hid all of the link's time.
                "ratio_unlinked_vs_blocking": med["unlinked"] / med["blocking"],
                # Of what the link added to the blocking step, the part the overlapping one hid.
                "hidden_share": ((med["blocking"] - med["overlapping"]) / (med["blocking"] - med["unlinked"])
                                 if med["blocking"] > med["unlinked"] else None),
                "ratio_per_round": per_round,
                "steps_per_side": len(steps["blocking"]),
                "lab_runs_median_step_ms": {k: round(m["step_s"] * 1e3, 2) for k, m in lab.items()},
                **{key: {k: m[key] for k, m in lab.items()}
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
                lo, hi = b["ratio_interval_95"]
                print(f"  {name:9s} {b['gbps']:.4g} Gb/s  A/B step ms {b['median_step_ms']}  "
                      f"overlap/blocking {b['ratio_overlap_vs_blocking']:.3f} [{lo:.3f}, {hi:.3f}]  "
                      f"floor {b['ratio_unlinked_vs_blocking']:.3f}  hidden {b['hidden_share']}  "
                      f"overlap shares {b['overlap_share']}  link shares {b['link_share']}  "
                      f"link/backward {b['link_over_backward']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
