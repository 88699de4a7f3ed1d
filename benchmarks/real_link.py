"""The lab's models of a slower network held to a real one: the real link, the emulated link and
the what-if, side by side in one run.

    python benchmarks/real_link.py [--rates-mbps 50,200,1000] [--hooks allreduce,fp16,powersgd,topk,diloco]
                                   [--workload mlp] [--steps 80] [--passes 3] [--json-out FILE]

Needs root or an unprivileged user namespace (``commlab.engine.launchers.reallink``).  For each hook,
one run on loopback calibrates the what-if (compute, arithmetic, bytes: ``whatif.profile_from_records``,
the plain allreduce's loopback time per byte); then for each rate, back to back, the same settings
over the emulated link (``emulate_bandwidth_gbps``) and on the real link (each rank in a network
namespace, veths shaped by tc tbf at the rate).  The what-if predicts the step for a link of the
rate from the loopback run alone (``whatif.check``, with no latency: the real link has a veth's and
a bridge's, some µs, and the emulated one is given none).  Every figure is the median of a run's
steady steps (for DiLoCo, over whole periods).  Printed: the three step times and the emulated's
and the what-if's ratio to the real link's (``--latency-us`` gives the two models a latency per
ring hop, the real link keeping its own); then each real run's bytes as the kernel counted them
against its ledger (``commlab.analysis.kernel_bytes``).

``--passes K`` measures every (hook, rate) pair K times, the passes one after another (so that a
spell of load on this shared machine falls on one pass of every row, not on every pass of one),
and prints per row the median over the passes and the range of each ratio: the ratios
``commlab.tune.held_to_real`` stores come from that range.  The machine's load average is printed
beside each run and with the table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from commlab.analysis import kernel_bytes, metrics
from commlab.api import RunConfig, run
from commlab.engine import procs, store
from commlab.tune import whatif
from commlab.tune.sweep import parse_list

HOOKS = {
    "allreduce": {},
    "fp16": {},
    "powersgd": {"matrix_approximation_rank": 2, "start_powerSGD_iter": 5},
    "topk": {"compress_ratio": 0.1},
    "diloco": {"sync_every": 8},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="mlp")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--rates-mbps", default="50,200,1000")
    p.add_argument("--hooks", default=",".join(HOOKS), help=f"some of {', '.join(HOOKS)}")
    p.add_argument("--latency-us", type=float, default=0.0,
                   help="the emulated link's and the what-if's latency per ring hop (the real link has its own)")
    p.add_argument("--passes", type=int, default=3, help="measurements of each (hook, rate) pair, one pass after another")
    p.add_argument("--json-out", default=None, help="also write every pass's figures here")
    p.add_argument("--runs-dir", default=None, help="default: a new temporary folder")
    args = p.parse_args(argv)
    runs_dir = args.runs_dir or tempfile.mkdtemp(prefix="commlab-real-link-")
    rates = parse_list(args.rates_mbps, float, "rates_mbps")
    chosen = parse_list(args.hooks, str, "hooks")
    if unknown := [h for h in chosen if h not in HOOKS]:
        p.error(f"--hooks: unknown {', '.join(unknown)}; known: {', '.join(HOOKS)}")
    t0, loads = time.monotonic(), []

    def one(name: str, **link) -> object:
        cfg = RunConfig(workload=args.workload, steps=args.steps, world_size=2, eval_every=0,
                        runs_dir=runs_dir, stall_timeout_s=900, hook=name, **HOOKS[name], **link)
        r = run(cfg)
        loads.append(os.getloadavg()[0])
        print(f"[{time.monotonic() - t0:6.0f} s] {name:<9} {link or 'loopback'}  {r.status()}  {r.id}  "
              f"load {loads[-1]:.1f}", file=sys.stderr, flush=True)
        if r.status() != "finished":
            raise SystemExit(f"run {r.id} ended {r.status()}: {r.status_record().get('error')}")
        return r

    # the plain allreduce's loopback run prices loopback's own bytes for every hook's prediction
    plain = one("allreduce")
    per_byte = whatif.loopback_s_per_byte(plain.metrics_records(), plain.config_dict())
    profiles, counted = {}, []
    for name in chosen:
        base = plain if name == "allreduce" else one(name)
        profiles[name] = whatif.profile_from_records(base.metrics_records(), base.config_dict(), base.id, name,
                                                     loopback_s_per_byte=per_byte)
    passes: dict[tuple, list[dict]] = {}
    for _ in range(args.passes):
        for name in chosen:
            for rate in rates:
                emulated = one(name, emulate_bandwidth_gbps=rate / 1000, emulate_latency_us=args.latency_us)
                real = one(name, real_link_mbps=rate)
                row = {"rate": rate, "hook": name, "real": step_s(real), "emulated": step_s(emulated),
                       "run": real, "profile": profiles[name], "per_byte": per_byte}
                row["whatif"] = predicted(row, args.latency_us)
                passes.setdefault((name, rate), []).append(row)
                counted.append((rate, name, kernel_against_ledger(real)))
    table = [summary(rows) for rows in passes.values()]
    print_table(table, runs_dir, args.latency_us, args.passes, loads)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"passes": args.passes, "steps": args.steps, "workload": args.workload, "load": loads,
                       "rows": [{k: v for k, v in t.items() if k != "passes"} for t in table]}, f, indent=1)
    print("\nkernel against ledger, bytes each rank sent (rank 0 | rank 1): kernel = ledger + DDP's "
          "broadcast + headers + control")
    for rate, name, rows in counted:
        cells = " | ".join(f"{r['kernel_bytes']} = {r['ledger_bytes']:.0f} + {r['ddp_broadcast']} + "
                           f"{r['headers']} + {r['control']:.0f} (≤ {r['control_bound']})" for r in rows)
        print(f"{rate:>5g} {name:<9} {'agree' if kernel_bytes.agree(rows) else 'DISAGREE'}  {cells}")
    return 0


def predicted(row: dict, latency_us: float) -> float:
    """The what-if's step for the real run's link (its rate, ``latency_us`` a hop), priced from the
    loopback run's profile."""
    r = row["run"]
    at_rate = {**r.config_dict(), "real_link_mbps": 0.0, "emulate_bandwidth_gbps": row["rate"] / 1000,
               "emulate_latency_us": latency_us}
    got = whatif.check(row["profile"], r.metrics_records(), at_rate, loopback_s_per_byte=row["per_byte"])
    return got["predicted_s"]


def step_s(r) -> float:
    cfg = r.config_dict()
    return metrics.per_step(whatif.steady_rows(r.metrics_records(), cfg), cfg, "step_s")


def kernel_against_ledger(r) -> list[dict]:
    procs.wait_until(lambda: len(list(r.path.glob("link.rank*.json"))) == 2, 30)
    link = [store.read_json(p) for p in r.path.glob("link.rank*.json")]
    return kernel_bytes.compare(link, store.read_json(r.file("ledger.json"))["rows"], 2,
                                store.read_json(r.file("meta.json"))["num_parameters"])


def summary(rows: list[dict]) -> dict:
    """One (hook, rate) pair over its passes: the medians of the step times, and each ratio's
    median and range over the passes."""
    out = {"rate": rows[0]["rate"], "hook": rows[0]["hook"], "passes": len(rows)}
    for key in ("real", "emulated", "whatif"):
        out[key] = statistics.median(r[key] for r in rows)
    for key in ("emulated", "whatif"):
        ratios = [r[key] / r["real"] for r in rows]
        out[f"{key}_ratio"] = statistics.median(ratios)
        out[f"{key}_ratios"] = ratios  # every pass's, in order
        out[f"{key}_steps"] = [r[key] for r in rows]
        out[f"{key}_range"] = (min(ratios), max(ratios))
    out["real_steps"] = [r["real"] for r in rows]
    return out


def print_table(table: list[dict], runs_dir: str, latency_us: float, passes: int, loads: list[float]) -> None:
    print(f"\nruns in {runs_dir}; median steady step, ms, median of {passes} pass(es); 2 ranks; the models' "
          f"latency {latency_us:g} µs a hop; load average {min(loads):.1f}–{max(loads):.1f} over the runs\n")
    print("| rate | hook | real link | emulated | what-if | emulated / real (range) | what-if / real (range) |")
    print("|---|---|---|---|---|---|---|")
    for t in table:
        (elo, ehi), (wlo, whi) = t["emulated_range"], t["whatif_range"]
        print(f"| {t['rate']:g} Mb/s | {t['hook']} | {t['real'] * 1e3:.1f} | {t['emulated'] * 1e3:.1f} | "
              f"{t['whatif'] * 1e3:.1f} | {t['emulated_ratio']:.2f} ({elo:.2f}–{ehi:.2f}) | "
              f"{t['whatif_ratio']:.2f} ({wlo:.2f}–{whi:.2f}) |")
    off = [t for t in table if max(abs(t["emulated_ratio"] - 1), abs(t["whatif_ratio"] - 1)) > 0.2]
    print(f"\n{len(table) - len(off)}/{len(table)} with both models' median ratio within 20% of the real link")


if __name__ == "__main__":
    raise SystemExit(main())
