"""``commlab rule``: PowerSGD's per-layer decisions and the compression ratio, from shapes alone."""
from __future__ import annotations


def _rule(args) -> int:
    from commlab.analysis import shapes
    from commlab.analysis.rule import apply_rule
    from commlab.commands import emit
    from commlab.config import ConfigError, settings
    from commlab.engine import workload_probe

    table = {s.name: s for s in settings()}
    errors = {name: msg for name in ("matrix_approximation_rank", "min_compression_rate")
              if (msg := table[name].bounds.error(getattr(args, name)))}
    if errors:  # the settings table's bounds, as for a run
        raise ConfigError(errors)
    try:
        if args.checkpoint:
            named = shapes.from_checkpoint(args.checkpoint)
        elif args.module:
            named = workload_probe.shapes(args.module)  # a person's code runs in a child
        else:
            named = shapes.from_workload(args.workload)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError({"checkpoint" if args.checkpoint else "workload": str(e)}) from None
    summary = apply_rule(named, args.matrix_approximation_rank, args.min_compression_rate)
    lines = [f"{'layer':<40} {'shape':<18} {'n':>7} {'m':>8} {'r':>3} {'(n+m)r*c':>12} {'n*m':>12}  decision"]
    for d in summary.layers:
        lines.append(f"{d.name:<40} {str(list(d.shape)):<18} {d.n:>7} {d.m:>8} {d.r:>3} "
                     f"{d.lhs:>12.0f} {d.rhs:>12}  {'compressed' if d.compressed else 'allreduced'}")
    lines.append(f"{summary.compressed_count}/{len(summary.layers)} layers compressed; "
                 f"{summary.numel_before} -> {summary.numel_after} elements; "
                 f"compression ratio {summary.compression_ratio:.2f}")
    emit(args, summary.as_dict(), "\n".join(lines))
    return 0


def register(sub) -> None:
    p = sub.add_parser("rule", help="which layers PowerSGD compresses, from shapes alone")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="a built-in workload (built on the meta device)")
    src.add_argument("--module", help="your module:function workload")
    src.add_argument("--checkpoint", help="a state_dict file (memory-mapped, not loaded)")
    p.add_argument("--matrix-approximation-rank", type=int, required=True)
    p.add_argument("--min-compression-rate", type=float, default=2.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_rule)
