"""The what-if model against runs over emulated links on this machine.

    python benchmarks/whatif_check.py [--world-sizes 2,3] [--bandwidths-gbps 0.02,0.05,0.2]
                                      [--hooks allreduce,powersgd,topk,randomk,quantize_pertensor,post_localsgd]

For each world size, bandwidth and hook, two runs back to back: one on the real (loopback) link,
which calibrates the model (compute, arithmetic, bytes), then the same settings over the emulated
link, whose median step time the model predicts without having seen it (post-local SGD's, which
averages the parameters one step in ``--period``: the median over whole periods of the period's
mean step, ``whatif.per_step``).  Pairs alternate hook by
hook (A A' B B' ...): this machine is shared and its load drifts by 2x within minutes, so the
calibration is taken as close in time to the measurement as possible.  Prints predicted against
measured and their ratio; the issue's target is within 20%.

The emulation holds a collective until the link would finish; it cannot make loopback faster, so
on this machine a collective takes the longer of the two, and the prediction here does the same
(the "loopback" column).  Bandwidths are chosen low enough for the link to dominate for allreduce;
PowerSGD's few kilobytes never dominate, so its checks test compute and arithmetic.  The other
hooks cover the model's other collectives: top-k (allgather of values and indices, at
``--compress-ratio``, larger than the default so that its bytes are felt), random-k (allreduce of
the values, the indices shared), the per-tensor quantization hook (two allgathers, uint8 codes)
and post-local SGD (no gradient traffic between averagings, every rank alone, then one allreduce
of the parameters from the worker every ``--period`` steps).  The "emulated" column is what the
link charged the hook's collectives per step (the ``link_s`` the counter records), next to the
model's "link" for the same bytes: the two must agree exactly, whatever the load.

What the check cannot see, named: this machine's "longer of link and loopback" holds per
collective, while the prediction takes it over the step's sum.  The quantization hook issues a
tiny allgather (scales) and waits for it in the body before its large one; the wait for the
slower rank, several ms under load, falls on the tiny one, whose hold hides none of it, so that
hook measures above its prediction here (on a real cluster ranks wait too, and the model, whose
ranks are identical, leaves that out everywhere).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

from commlab.api import RunConfig, run
from commlab.config import link_label
from commlab.tune import whatif
from commlab.tune.sweep import parse_list

HOOKS = ("allreduce", "powersgd", "topk", "randomk", "quantize_pertensor", "post_localsgd")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="mlp")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--world-sizes", default="2,3")
    p.add_argument("--bandwidths-gbps", default="0.02,0.05,0.2")
    p.add_argument("--latency-us", type=float, default=20.0)
    p.add_argument("--rank", type=int, default=1, help="PowerSGD's matrix_approximation_rank")
    p.add_argument("--start", type=int, default=5, help="PowerSGD's start_powerSGD_iter")
    p.add_argument("--compress-ratio", type=float, default=0.1, help="top-k's and random-k's")
    p.add_argument("--period", type=int, default=4, help="post-local SGD's averager_period")
    p.add_argument("--local-start", type=int, default=8,
                   help="post-local SGD's start_localSGD_iter and averager_warmup_steps")
    p.add_argument("--hooks", default=",".join(HOOKS), help=f"some of {', '.join(HOOKS)}")
    p.add_argument("--runs-dir", default=None, help="default: a new temporary folder")
    p.add_argument("--tolerance", type=float, default=0.2)
    args = p.parse_args(argv)

    runs_dir = args.runs_dir or tempfile.mkdtemp(prefix="commlab-whatif-")
    settings_of = {
        "allreduce": {},
        "powersgd": {"matrix_approximation_rank": args.rank, "start_powerSGD_iter": args.start},
        "topk": {"compress_ratio": args.compress_ratio},
        "randomk": {"compress_ratio": args.compress_ratio},
        "quantize_pertensor": {},
        "post_localsgd": {"averager_period": args.period, "start_localSGD_iter": args.local_start,
                          "averager_warmup_steps": args.local_start},
    }
    chosen = parse_list(args.hooks, str, "hooks")
    unknown = [h for h in chosen if h not in settings_of]
    if unknown:
        p.error(f"--hooks: unknown {', '.join(unknown)}; known: {', '.join(HOOKS)}")
    # the plain allreduce calibrates every other hook's loopback, so it runs whatever was asked
    hooks = {h: {"hook": h, **settings_of[h]} for h in dict.fromkeys(["allreduce", *chosen])}
    done = []
    t0 = time.monotonic()
    for n in parse_list(args.world_sizes, int, "world_sizes"):
        for bw in parse_list(args.bandwidths_gbps, float, "bandwidths_gbps"):
            for name, settings in hooks.items():
                for link in ((0.0, 0.0), (bw, args.latency_us)):
                    cfg = RunConfig(workload=args.workload, steps=args.steps, world_size=n,
                                    runs_dir=runs_dir, stall_timeout_s=900,
                                    emulate_bandwidth_gbps=link[0], emulate_latency_us=link[1],
                                    **settings)
                    r = run(cfg)
                    print(f"[{time.monotonic() - t0:6.0f} s] N={n} {name:<9} "
                          f"{link_label(*link) or 'loopback':<28} {r.status()}  {r.id}",
                          file=sys.stderr, flush=True)
                    if r.status() != "finished":
                        print(f"run {r.id} ended {r.status()}: {r.status_record().get('error')}",
                              file=sys.stderr)
                        return 1
                    done.append(r)

    rows = whatif.checks(done)
    print(f"\nruns in {runs_dir}; latency {args.latency_us:g} µs per hop; median of steady steps\n")
    width = max(len(r["label"]) for r in rows)
    print(f"{'N':>2} {'Gb/s':>5} {'hook':<{width}} {'predicted ms':>12} {'measured ms':>12} "
          f"{'ratio':>6} {'emulated ms':>11}   compute + arithmetic + max(link, loopback), ms")
    for r in rows:
        emulated = f"{r['emulated_s'] * 1e3:.2f}" if r["emulated_s"] is not None else "-"
        print(f"{r['world_size']:>2} {r['bandwidth_gbps']:>5g} {r['label']:<{width}} "
              f"{r['predicted_s'] * 1e3:>12.2f} {r['measured_s'] * 1e3:>12.2f} {r['ratio']:>6.2f}"
              f" {emulated:>11}   {r['compute_s'] * 1e3:.1f} + {r['arithmetic_s'] * 1e3:.1f} + "
              f"max({r['link_s'] * 1e3:.2f}, {r['loopback_s'] * 1e3:.1f})")
    within = sum(abs(r["ratio"] - 1) <= args.tolerance for r in rows)
    worst = max(rows, key=lambda r: abs(r["ratio"] - 1))
    print(f"\n{within}/{len(rows)} within {args.tolerance:.0%}; worst {worst['label']} at "
          f"N={worst['world_size']}, {worst['bandwidth_gbps']:g} Gb/s: ratio {worst['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
