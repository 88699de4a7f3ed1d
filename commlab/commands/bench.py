"""``commlab bench``: collective bandwidth against message size; ``commlab headroom``: the noop test.

    commlab bench --world-size 2 --sizes 1KB,1MB,16MB --collectives all_reduce,broadcast
    commlab headroom --workload mlp --steps 40 --world-size 2
"""
from __future__ import annotations

import argparse
import json
import sys

from commlab.analysis.metrics import WARMUP_STEPS
from commlab.analysis.ring import COLLECTIVES

HEADER = (("#" + " " * 33 + f"{'out-of-place':^36}{'in-place':^36}").rstrip() + "\n"
          f"{'collective':>14} {'size':>8} {'count':>9} "
          + f"{'time (us)':>11} {'algbw':>8} {'busbw':>8} {'#wrong':>6}" * 2 + f" {'memcpy':>8}")


def _line(row) -> str:
    def group(t) -> str:
        return f"{t.time_us:>11.1f} {t.algbw_gbytes_s:>8.3f} {t.busbw_gbytes_s:>8.3f} {t.wrong:>6}"

    return (f"{row.collective:>14} {row.size:>8} {row.count:>9} {group(row.out_of_place)}"
            f"{group(row.in_place)} {row.memcpy_gbytes_s:>8.3f}")


def _failed(args: argparse.Namespace, e: Exception) -> int:
    if args.json:
        print(json.dumps({"error": str(e)}))
    else:
        print(f"commlab: {e}", file=sys.stderr)
    return 1


def _bench(args: argparse.Namespace) -> int:
    from commlab.analysis.ring import bus_factor
    from commlab.commands import emit
    from commlab.teach.bench import DEFAULT_SIZES, bench_plan, run_plan

    plan = bench_plan(args.world_size, args.sizes or DEFAULT_SIZES, args.backend, args.iters,
                      args.warmup, args.collectives)
    if not args.json:
        factors = ", ".join(f"{c} {bus_factor(c, plan.world_size):.2f}" for c in plan.collectives)
        print(f"{plan.world_size} rank(s), {plan.backend}; busbw = algbw x bus factor ({factors}); "
              "#wrong: elements off the exact answer; memcpy: rank 0 copying the same bytes, "
              "the ceiling", flush=True)
        print(HEADER, flush=True)
    on_row = None if args.json else (lambda row: print(_line(row), flush=True))
    try:
        result = run_plan(plan, args.timeout, on_row=on_row)
    except (RuntimeError, TimeoutError) as e:
        return _failed(args, e)
    emit(args, result.to_dict(), "(time in us; algbw, busbw and memcpy in GB/s, 1e9 bytes per "
                                 "second, as nccl-tests prints)")
    return 0


def _headroom(args: argparse.Namespace) -> int:
    from commlab.commands import emit
    from commlab.teach.headroom import SAVED_HELP, SAVED_LABEL, measure_headroom

    try:
        h = measure_headroom(args.workload, args.steps, args.world_size, args.skip, args.timeout)
    except (RuntimeError, TimeoutError) as e:
        return _failed(args, e)
    emit(args, h.to_dict(), "\n".join([
        f"{h.workload} on {h.world_size} rank(s), median of steps {h.skip}..{h.steps - 1}:",
        f"  allreduce hook: {h.step_s_allreduce * 1e3:.2f} ms per step",
        f"  noop hook:      {h.step_s_noop * 1e3:.2f} ms per step",
        f"  {SAVED_LABEL}: {h.saved:.0%}  ({SAVED_HELP})",
        f"  {h.verdict}"]))
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench", help="collective time, algbw, busbw and #wrong by message size, "
                                     "out-of-place and in-place, as nccl-tests prints them")
    p.add_argument("--world-size", type=int, default=2, help="number of ranks, 1 to 8")
    p.add_argument("--sizes", help="comma-separated message sizes; K, M, G are powers of 1024 "
                                   "(default: 1KB to 64MB)")
    p.add_argument("--backend", default="auto", help="auto (NCCL with a GPU per rank), gloo, nccl")
    p.add_argument("--iters", type=int, help="timed iterations per size (default: by size)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations per size")
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help=f"comma-separated, from {', '.join(COLLECTIVES)} (default: all)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before giving up")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_bench)

    p = sub.add_parser("headroom", help="the same workload with noop and with allreduce: is "
                                        "communication the bottleneck?")
    p.add_argument("--workload", default="mlp")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--skip", type=int, default=WARMUP_STEPS,
                   help=f"first steps left out (start-up; default {WARMUP_STEPS})")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run before giving up")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_headroom)
