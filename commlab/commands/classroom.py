"""``commlab allreduce`` and ``commlab broadcast``: one real collective on N Gloo processes.

    commlab allreduce --world-size 3 --op sum            # rank r holds tensor([r]); all get 3.0
    commlab allreduce --world-size 2 --op max --values 1,5 4,2
    commlab broadcast --world-size 4 --src 2 --json
"""
from __future__ import annotations

import argparse
import json
import sys

VALUES_HELP = ("each rank's tensor, one argument per rank, numbers split by commas (e.g. "
               "--values 1,2 3,4 5,6); a single argument may separate ranks with ';'. Quote a "
               "tensor that starts with a minus sign with a leading space (' -1,2') or write "
               "all in one: --values='-1,2;3,4'. "
               "Default: rank r holds [r]")


def _values(args: argparse.Namespace):
    if args.values is None:
        return None
    return ";".join(args.values)


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{x:g}" for x in values) + "]"


def _text(result) -> str:
    from commlab.teach.classroom import ARRIVAL_NOTE

    what = (f"all_reduce({result.op.upper()})" if result.kind == "all_reduce"
            else f"broadcast(src={result.src})")
    lines = [f"{what} on {result.world_size} real Gloo process(es)",
             f"{'rank':>4}  {'before':<24}  after"]
    lines += [f"{r.rank:>4}  {_fmt(r.before):<24}  {_fmt(r.after)}" for r in result.ranks]
    finished = {r.rank: r.finished_ms for r in result.ranks}
    lines.append("ranks reported back in the order " + ", ".join(
        f"{rank} (+{finished[rank]:.2f} ms)" for rank in result.arrival_order))
    lines.append(ARRIVAL_NOTE)
    return "\n".join(lines)


def _run(args: argparse.Namespace, job) -> int:
    from commlab.commands import emit
    from commlab.teach import classroom

    try:
        result = classroom.run_collectives([job], timeout_s=args.timeout)[0]
    except (RuntimeError, TimeoutError) as e:
        if args.json:
            print(json.dumps({"error": str(e)}))
        else:
            print(f"commlab: {e}", file=sys.stderr)
        return 1
    emit(args, result.to_dict(), _text(result))
    return 0


def _allreduce(args: argparse.Namespace) -> int:
    from commlab.teach.classroom import all_reduce_job

    return _run(args, all_reduce_job(args.world_size, args.op, _values(args)))


def _broadcast(args: argparse.Namespace) -> int:
    from commlab.teach.classroom import broadcast_job

    return _run(args, broadcast_job(args.world_size, args.src, _values(args)))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--world-size", type=int, default=3, help="number of ranks, 1 to 8 (default 3)")
    p.add_argument("--values", nargs="+", metavar="TENSOR", help=VALUES_HELP)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before giving up")
    p.add_argument("--json", action="store_true")


def register(sub) -> None:
    p = sub.add_parser("allreduce", help="dist.all_reduce on N real processes: before and after")
    _common(p)
    p.add_argument("--op", default="sum", type=str.lower, help="sum, avg, max, min or product")
    p.set_defaults(func=_allreduce)

    p = sub.add_parser("broadcast", help="dist.broadcast from one rank on N real processes")
    _common(p)
    p.add_argument("--src", type=int, default=0, help="the rank whose tensor everyone receives")
    p.set_defaults(func=_broadcast)
