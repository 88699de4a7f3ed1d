"""``commlab bench``: allreduce bandwidth against message size; ``commlab headroom``: the noop test.

    commlab bench --world-size 2 --sizes 1KB,1MB,16MB
    commlab headroom --workload mlp --steps 40 --world-size 2
"""
from __future__ import annotations

import argparse
import json
import sys

from commlab.analysis.metrics import WARMUP_STEPS

HEADER = (f"{'size':>8} {'iters':>6} {'time (us)':>12} {'algbw GB/s':>11} {'busbw GB/s':>11} "
          f"{'memcpy GB/s':>12}")


def _line(row) -> str:
    return (f"{row.size:>8} {row.iters:>6} {row.time_us:>12.1f} {row.algbw_gbps:>11.3f} "
            f"{row.busbw_gbps:>11.3f} {row.memcpy_gbps:>12.3f}")


def _failed(args: argparse.Namespace, e: Exception) -> int:
    if args.json:
        print(json.dumps({"error": str(e)}))
    else:
        print(f"commlab: {e}", file=sys.stderr)
    return 1


def _bench(args: argparse.Namespace) -> int:
    from commlab.commands import emit
    from commlab.teach.bench import bench_plan, bus_factor, run_plan

    plan = bench_plan(args.world_size, args.sizes, args.backend, args.iters, args.warmup)
    if not args.json:
        print(f"allreduce on {plan.world_size} rank(s), {plan.backend}; busbw = algbw x 2(N-1)/N "
              f"= algbw x {bus_factor(plan.world_size):.2f}; memcpy: rank 0 copying the same "
              "bytes, the ceiling", flush=True)
        print(HEADER, flush=True)
    on_row = None if args.json else (lambda row: print(_line(row), flush=True))
    try:
        result = run_plan(plan, args.timeout, on_row=on_row)
    except (RuntimeError, TimeoutError) as e:
        return _failed(args, e)
    emit(args, result.to_dict(), "(GB/s: 1e9 bytes per second, as nccl-tests prints)")
    return 0


def _headroom(args: argparse.Namespace) -> int:
    from commlab.commands import emit
    from commlab.teach.headroom import measure_headroom

    try:
        h = measure_headroom(args.workload, args.steps, args.world_size, args.skip, args.timeout)
    except (RuntimeError, TimeoutError) as e:
        return _failed(args, e)
    emit(args, h.to_dict(), "\n".join([
        f"{h.workload} on {h.world_size} rank(s), median of steps {h.skip}..{h.steps - 1}:",
        f"  allreduce hook: {h.step_s_allreduce * 1e3:.2f} ms per step",
        f"  noop hook:      {h.step_s_noop * 1e3:.2f} ms per step",
        f"  communication is {h.comm_share:.0%} of an allreduce step",
        f"  {h.verdict}"]))
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench", help="allreduce time, algbw and busbw by message size")
    p.add_argument("--world-size", type=int, default=2, help="number of ranks, 1 to 8")
    p.add_argument("--sizes", default="1KB,16KB,256KB,1MB,4MB,16MB,64MB",
                   help="comma-separated message sizes; K, M, G are powers of 1024")
    p.add_argument("--backend", default="auto", help="auto (NCCL with a GPU per rank), gloo, nccl")
    p.add_argument("--iters", type=int, help="timed iterations per size (default: by size)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations per size")
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
