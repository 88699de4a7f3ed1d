"""``commlab sweep``: a PowerSGD grid beside a plain allreduce baseline, one run after another.

    commlab sweep --workload mlp --steps 100 --matrix-approximation-rank 1,2,4 \
        --start-powersgd-iter 10,50 [--min-compression-rate 2,4] [--wrapper none,fp16] [--json]

Every other run option (``commlab run``'s) sets the job all runs share.  Ctrl-C stops the current
run and starts no other; finished runs are kept.  Exit 0 when every planned run has ended.
"""
from __future__ import annotations

import argparse
import signal
import sys

from commlab.commands.run import add_run_options, config_from_args
from commlab.config import POWERSGD_HOOKS, ConfigError
from commlab.tune.sweep import AXES, SweepSpec, axis_values

AXIS_NAMES = tuple(s.name for s in AXES)


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    if args.hook is not None and args.hook not in POWERSGD_HOOKS:
        raise ConfigError({"hook": f"a sweep varies PowerSGD's settings: --hook must be one of "
                                   f"{', '.join(POWERSGD_HOOKS)} (the allreduce baseline is added "
                                   f"by itself), got {args.hook!r}"})
    # The axes given are lists; the others keep the spec's defaults.
    lists = {s.name: axis_values(s, getattr(args, s.name)) for s in AXES
             if getattr(args, s.name) is not None}
    return SweepSpec(base=config_from_args(args, axes=AXIS_NAMES), baseline=not args.no_baseline,
                     tolerance_pct=args.tolerance_pct, **lists)


def _payload(sweep) -> dict:
    from commlab.tune.pareto import recommend

    table = sweep.results()
    rec = recommend(table, sweep.spec().tolerance_pct)
    rows = table.astype(object).where(table.notna(), None).to_dict(orient="records")
    return {"sweep_id": sweep.id, "sweep_dir": str(sweep.path), "status": sweep.status(),
            "runs": rows, "recommendation": rec.to_dict(),
            "pareto_bytes": table[table["pareto_bytes"]]["run_id"].tolist(),
            "pareto_time": table[table["pareto_time"]]["run_id"].tolist()}


def _text(payload: dict) -> str:
    lines = [f"sweep {payload['sweep_id']}: {payload['status']} ({payload['sweep_dir']})",
             f"{'setting':<48} {'status':<9} {'final loss':>11} {'bytes/step':>12} {'time s':>8}  front"]
    for r in payload["runs"]:
        front = ("bytes " if r["pareto_bytes"] else "") + ("time" if r["pareto_time"] else "")
        loss = "" if r["final_loss"] is None else f"{r['final_loss']:.4f}"
        nbytes = "" if r["bytes_per_step"] is None else f"{r['bytes_per_step']:,.0f}"
        secs = "" if r["time_s"] is None else f"{r['time_s']:.2f}"
        lines.append(f"{r['label']:<48} {r['status']:<9} {loss:>11} {nbytes:>12} {secs:>8}  {front}")
    rec = payload["recommendation"]
    lines += [f"rule: {rec['rule']}", f"recommendation: {rec['text']}"]
    return "\n".join(lines)


def _sweep(args: argparse.Namespace) -> int:
    from commlab.commands import emit
    from commlab.tune.sweep import create, execute, grid

    spec = spec_from_args(args)
    configs = grid(spec)
    if args.dry_run:
        from commlab.tune.sweep import run_label

        labels = [run_label(c.to_dict()) for c in configs]
        emit(args, {"runs": labels}, "\n".join(f"{i + 1}. {lab}" for i, lab in enumerate(labels)))
        return 0
    sweep = create(spec)
    interrupted: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: interrupted.append(signum))
    if not args.json:
        print(f"sweep {sweep.id}: {len(configs)} run(s), one after another -> {sweep.path}",
              file=sys.stderr)

    def on_progress(p) -> None:
        end = "\n" if p.run_status not in ("starting", "running") else ""
        print(f"\r{p.line()}   ", end=end, file=sys.stderr, flush=True)

    execute(sweep, None if args.json else on_progress, should_stop=lambda: bool(interrupted))
    payload = _payload(sweep)
    emit(args, payload, _text(payload))
    return 0 if payload["status"] == "finished" else 1


def register(sub) -> None:
    p = sub.add_parser("sweep", help="a PowerSGD grid beside an allreduce baseline, run by run")
    add_run_options(p, axes=AXIS_NAMES)
    p.add_argument("--no-baseline", action="store_true", help="leave out the allreduce baseline")
    p.add_argument("--tolerance-pct", type=float, default=5.0,
                   help="the recommendation: fewest bytes within this %% of allreduce's final loss")
    p.add_argument("--dry-run", action="store_true", help="print the planned runs, start nothing")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_sweep)
