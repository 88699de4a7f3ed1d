"""``commlab rule``: PowerSGD's per-layer decisions and the compression ratio, from shapes alone."""
from __future__ import annotations


def _rule(args) -> int:
    from commlab.analysis import shapes
    from commlab.analysis.rule import IN_BY_OUT, IN_BY_OUT_NOTE, apply_rule
    from commlab.commands import emit
    from commlab.config import ConfigError, settings
    from commlab.engine import workload_probe

    table = {s.name: s for s in settings()}
    errors = {name: msg for name in ("matrix_approximation_rank", "min_compression_rate")
              if (msg := table[name].bounds.error(getattr(args, name)))}
    if errors:  # the settings table's bounds, as for a run
        raise ConfigError(errors)
    layouts: dict[str, str] = {}
    try:
        if args.checkpoint:
            named = shapes.from_checkpoint(args.checkpoint)
        elif args.module:
            named, layouts = workload_probe.described(args.module)  # a person's code runs in a child
        else:
            named = shapes.from_workload(args.workload)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError({"checkpoint" if args.checkpoint else "workload": str(e)}) from None
    summary = apply_rule(named, args.matrix_approximation_rank, args.min_compression_rate, layouts)
    lines = [f"{'layer':<40} {'shape':<18} {'n':>9} {'m':>11} {'r':>4} {'(n+m)r*c':>14} "
             f"{'n*m':>14}  decision"]
    for d in summary.layers:
        lines.append(f"{d.name:<40} {'x'.join(map(str, d.shape)) or 'scalar':<18} {d.n:>9,} "
                     f"{d.m:>11,} {d.r:>4} {d.lhs:>14,.0f} {d.rhs:>14,}  "
                     f"{'compressed' if d.compressed else 'allreduced'}"
                     + (" (n × m is in × out)" if d.layout == IN_BY_OUT else ""))
    lines.append(f"{summary.compressed_count:,}/{len(summary.layers):,} layers compressed; "
                 f"{summary.numel_before:,} -> {summary.numel_after:,} elements; "
                 f"predicted compression ratio {summary.predicted_ratio:.2f}")
    if any(d.layout == IN_BY_OUT for d in summary.layers):
        lines.append(IN_BY_OUT_NOTE)
    emit(args, summary.as_dict(), "\n".join(lines))
    return 0


def register(sub) -> None:
    from commlab.workload_names import BUILTIN_NAMES  # the parser of every command: no torch

    p = sub.add_parser("rule", help="which layers PowerSGD compresses, from shapes alone")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", choices=list(BUILTIN_NAMES),
                     help="a built-in workload (built on the meta device)")
    src.add_argument("--module", metavar="MODULE:FUNCTION", help="your module:function workload")
    src.add_argument("--checkpoint", metavar="FILE",
                     help="a state_dict file, torch.save(model.state_dict(), FILE) (memory-mapped, "
                          "not loaded)")
    p.add_argument("--matrix-approximation-rank", metavar="N", type=int, required=True,
                   help="PowerSGD's rank r")
    p.add_argument("--min-compression-rate", metavar="X", type=float, default=2.0,
                   help="compress when (n + m)·r·rate < n·m")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=_rule)
