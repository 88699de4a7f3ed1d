"""``commlab allreduce``, ``broadcast``, ``reduce``, ``allgather``, ``reducescatter``: one real
collective on N Gloo processes.

    commlab allreduce --world-size 3 --op sum    # rank r holds [r, r+10, r+20]; all get [3, 33, 63]
    commlab allreduce --world-size 2 --op max --values 1,5 4,2
    commlab broadcast --world-size 4 --src 2 --json
    commlab reducescatter --world-size 2 --values 1,2 3,4
"""
from __future__ import annotations

import argparse
import json
import sys

VALUES_HELP = ("each rank's tensor, one argument per rank, numbers split by commas (e.g. "
               "--values 1,2 3,4 5,6); a single argument may separate ranks with ';'. Quote a "
               "tensor that starts with a minus sign with a leading space (' -1,2') or write "
               "all in one: --values='-1,2;3,4'. "
               "Default: rank r holds N elements, r + 10 i (element 0 is the textbook's [r])")


def _values(args: argparse.Namespace):
    if args.values is None:
        return None
    return ";".join(args.values)


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{x:g}" for x in values) + "]"


def _text(result) -> str:
    from commlab.teach.classroom import ARRIVAL_NOTE

    op = (result.op or "").upper()
    what = {"all_reduce": f"all_reduce({op})", "broadcast": f"broadcast(src={result.src})",
            "reduce": f"reduce(dst={result.dst}, {op}), the other ranks' buffers are scratch",
            "all_gather": "all_gather", "reduce_scatter": f"reduce_scatter({op})"}[result.kind]
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


def _reduce(args: argparse.Namespace) -> int:
    from commlab.teach.classroom import reduce_job

    return _run(args, reduce_job(args.world_size, args.op, args.dst, _values(args)))


def _all_gather(args: argparse.Namespace) -> int:
    from commlab.teach.classroom import all_gather_job

    return _run(args, all_gather_job(args.world_size, _values(args)))


def _reduce_scatter(args: argparse.Namespace) -> int:
    from commlab.teach.classroom import reduce_scatter_job

    return _run(args, reduce_scatter_job(args.world_size, args.op, _values(args)))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--world-size", type=int, default=3, help="number of ranks, 1 to 8 (default 3)")
    p.add_argument("--values", nargs="+", metavar="TENSOR", help=VALUES_HELP)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before giving up")
    p.add_argument("--json", action="store_true")


def _op(p: argparse.ArgumentParser) -> None:
    p.add_argument("--op", default="sum", type=str.lower,
                   help="sum, avg, max, min or product (default sum)")


def register(sub) -> None:
    p = sub.add_parser("allreduce", help="dist.all_reduce on N real processes: before and after")
    _common(p)
    _op(p)
    p.set_defaults(func=_allreduce)

    p = sub.add_parser("broadcast", help="dist.broadcast from one rank on N real processes")
    _common(p)
    p.add_argument("--src", type=int, help="the rank whose tensor everyone receives (default: "
                                           "the last rank)")
    p.set_defaults(func=_broadcast)

    p = sub.add_parser("reduce", help="dist.reduce to one rank on N real processes")
    _common(p)
    _op(p)
    p.add_argument("--dst", type=int, default=0, help="the rank that receives the result "
                                                      "(default 0)")
    p.set_defaults(func=_reduce)

    p = sub.add_parser("allgather", help="dist.all_gather_single on N real processes: every "
                                         "rank gets every tensor")
    _common(p)
    p.set_defaults(func=_all_gather)

    p = sub.add_parser("reducescatter", help="dist.reduce_scatter_single on N real processes: "
                                             "rank r gets chunk r of the reduction")
    _common(p)
    _op(p)
    p.set_defaults(func=_reduce_scatter)
