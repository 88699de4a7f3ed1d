"""``commlab whatif``: predicted step time at other scales, from measured runs.

    commlab whatif RUN [RUN ...] [--world-sizes 8,64,1024] [--bandwidths-gbps 10,100]
    commlab whatif --sweep SWEEP --latency-us 5

A RUN is a run folder or the run id ``commlab runs`` prints; a SWEEP a sweep folder or its id.
"""
from __future__ import annotations

import argparse
import statistics
import sys

from commlab.tune.sweep import parse_list


def _runs(args: argparse.Namespace) -> list:
    """The runs to measure; a damaged one is named on stderr and left out."""
    runs = _given_runs(args)
    for run in runs:
        if damage := run.damage():
            print(f"commlab whatif: left out run {run.id}: {damage}", file=sys.stderr)
    return [r for r in runs if not r.damage()]


def _given_runs(args: argparse.Namespace) -> list:
    from commlab.api import open_run
    from commlab.commands import resolve_run, resolve_sweep
    from commlab.config import ConfigError
    from commlab.tune.sweep import Sweep

    if args.sweep:
        sweep = Sweep(resolve_sweep(args.sweep, args.runs_dir))
        if sweep.damage():
            raise ConfigError({"sweep": sweep.damage()})
        return sweep.runs()
    if not args.run_dirs:
        raise ConfigError({"run_dirs": "give runs (folders or the ids `commlab runs` prints) or "
                                       "--sweep SWEEP"})
    return [open_run(resolve_run(d, args.runs_dir)) for d in args.run_dirs]


WIDTH = 100  # lines wrap here, each setting's continuing indented


def _wrapped(text: str) -> list[str]:
    import textwrap

    return textwrap.wrap(text, WIDTH, subsequent_indent="    ", break_on_hyphens=False)


def _short(p) -> str:
    """A setting's break-even as a cell: "<6.47 [4.9-9]" (Gb/s; its seeds' range), "always", "never"."""
    from commlab.tune import payoff

    if p.verdict not in (payoff.BELOW, payoff.ABOVE):
        return p.verdict + (f" ({p.agree}/{p.seeds} seeds)" if p.agree < p.seeds else "")
    spread = f" [{p.low_gbps:.3g}-{p.high_gbps:.3g}]" if p.agree > 1 else ""
    sign = "<" if p.verdict == payoff.BELOW else ">"
    return f"{sign}{p.break_even_gbps:.3g}{spread}" + (f" ({p.agree}/{p.seeds} seeds)" if p.agree < p.seeds else "")


def _text(profiles, folded, best, even: dict, latency_us: float, against: str) -> list[str]:
    from commlab.tune import baseline as baselines

    settings: dict[str, list] = {}
    for p in profiles:
        settings.setdefault(p.setting or p.label, []).append(p)
    w = max(len(name) for name in settings)
    lines = ["measured, one line per setting (median over its seeds):",
             f"{'setting':<{w}} {'seeds':>5} {'compute ms':>10} {'arith ms':>9} {'bytes/step':>12} "
             f"{'calls':>6}  measured over"]
    for name, group in settings.items():
        med = {k: statistics.median(getattr(p, k) for p in group)
               for k in ("compute_s", "arithmetic_s", "payload_bytes", "collectives")}
        over = sorted({p.measured_over for p in group})
        lines.append(f"{name:<{w}} {len(group):>5} {med['compute_s'] * 1e3:>10.2f} "
                     f"{med['arithmetic_s'] * 1e3:>9.2f} {med['payload_bytes']:>12,.0f} "
                     f"{med['collectives']:>6g}  {', '.join(over)}")
    lines += ["", *_wrapped(f"predicted step (ms), latency {latency_us:g} µs per hop, one entry per "
                            "setting (median over its seeds); fastest marked *")]
    for cell in best:
        here = [r for r in folded if (r["world_size"], r["bandwidth_gbps"]) ==
                (cell["world_size"], cell["bandwidth_gbps"])]
        parts = "  ".join(f"{r['label']}{'*' if r['label'] == cell['best'] else ''} "
                          f"{r['step_s'] * 1e3:.1f}" for r in here)
        lines += _wrapped(f"N={cell['world_size']:<5} {cell['bandwidth_gbps']:>6g} Gb/s  {parts}")
    title = baselines.title(against)
    if not even:
        return lines + [f"no {title} run among these: no break-even to say"]
    lines += ["", *_wrapped(f"where each setting beats {title} in step time, by workers: on links below "
                            "(<) or above (>) the break-even in Gb/s, median over its seeds [their range]")]
    for name, cells in even.items():
        lines += _wrapped(f"{name}: " + ", ".join(f"N={p.world_size} {_short(p)}" for p in cells))
    return lines


def _whatif(args: argparse.Namespace) -> int:
    from commlab.commands import emit
    from commlab.config import ConfigError
    from commlab.tune import baseline as baselines
    from commlab.tune import held_to_real, payoff, whatif

    baselines.check(args.against)
    world_sizes = parse_list(args.world_sizes, int, "world_sizes")
    bandwidths = parse_list(args.bandwidths_gbps, float, "bandwidths_gbps")
    if any(n < 1 for n in world_sizes) or any(b <= 0 for b in bandwidths):
        raise ConfigError({"world_sizes": "world sizes must be 1 or more and bandwidths above 0"})
    profiles = whatif.profiles_from_runs(_runs(args))
    if not profiles:
        raise ConfigError({"run_dirs": "no run has steady steps to measure (runs too short, or "
                                       "PowerSGD never started compressing)"})
    rows = whatif.predict(profiles, world_sizes, bandwidths, args.latency_us)
    folded = whatif.over_seeds(rows)
    best = whatif.winners(folded, args.against)
    even: dict[str, list] = {}
    for n in world_sizes:
        for p in payoff.by_setting(profiles, n, args.latency_us, args.against):
            even.setdefault(p.label, []).append(p)
    lines = _text(profiles, folded, best, even, args.latency_us, args.against)
    # the model's measured distance from a real link, beside its figures: a difference that stays is said
    hooks = list(dict.fromkeys(p.hook for p in profiles))
    lines += ["", *[line for h in hooks for line in _wrapped(held_to_real.beside(h, None, "whatif"))]]
    emit(args, {"profiles": [p.to_dict() for p in profiles], "predictions": rows, "settings": folded,
                "winners": best, "break_even": [p.to_dict() for cells in even.values() for p in cells],
                "held_to_real": held_to_real.table(hooks)},
         "\n".join(lines))
    return 0


def register(sub) -> None:
    from commlab.tune import baseline as baselines
    from commlab.tune.whatif import BANDWIDTHS_GBPS, DEFAULT_LATENCY_US, WORLD_SIZES

    p = sub.add_parser("whatif", help="predicted step time against workers and bandwidth, per hook")
    p.add_argument("run_dirs", nargs="*", metavar="RUN",
                   help="run folders or run ids (as `commlab runs` prints them); a plain allreduce "
                        "run calibrates")
    p.add_argument("--sweep", metavar="SWEEP", help="a sweep folder or sweep id: its runs")
    p.add_argument("--runs-dir", metavar="DIR",
                   help="where run and sweep ids are looked up (default: $COMMLAB_RUNS_DIR, else ./runs)")
    p.add_argument("--world-sizes", metavar="N,N,...", default=",".join(map(str, WORLD_SIZES)),
                   help="worker counts to predict for")
    p.add_argument("--bandwidths-gbps", metavar="X,X,...", default=",".join(map(str, BANDWIDTHS_GBPS)),
                   help="link bandwidths to predict for, in Gb/s")
    p.add_argument("--latency-us", metavar="X", type=float, default=DEFAULT_LATENCY_US,
                   help="link latency per ring hop, in µs")
    p.add_argument("--against", default=baselines.DEFAULT, metavar="BASELINE",
                   help="the baseline the speed-ups and break-evens are against: "
                        + ", ".join(f"{b} ({baselines.title(b)})" for b in baselines.BASELINES)
                        + "; its run must be among those measured")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=_whatif)
