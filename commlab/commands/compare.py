"""``commlab compare``: every algorithm side by side on one workload (``commlab.tune.compare``).

    commlab compare RUN [RUN ...] [--predict-world-size 64 --predict-bandwidth-gbps 10] [--json]
    commlab compare --workload charlm --hooks allreduce,topk,qsgd --steps 60 [any run flag]
    commlab compare ... --against bf16      (judged against bf16 allreduce instead of fp32)

Given runs (folders or the ids ``commlab runs`` prints), it tabulates them; given ``--hooks``, it
first runs each hook with the other flags' settings, one run after another (runs together would
share the cores and spoil each other's timings), a plain allreduce first unless it is listed, and
the ``--against`` baseline after it.  Each row says whether it pays on the cluster named
(``commlab.tune.payoff``).
"""
from __future__ import annotations

import argparse
import sys

from commlab.commands.run import add_run_options, config_from_args
from commlab.config import ConfigError
from commlab.engine.run_state import RunStatus
from commlab.hook_specs import BASELINE, HOOKS
from commlab.tune import baseline as baselines
from commlab.tune.quality import Cluster


def _runs(args: argparse.Namespace) -> list:
    from commlab.api import open_run
    from commlab.commands import resolve_run

    if args.run_dirs and args.hook:
        raise ConfigError({"run_dirs": "give runs to compare or --hooks to run, not both"})
    if args.run_dirs:
        return [open_run(resolve_run(d, args.runs_dir)) for d in args.run_dirs]
    if not args.hook:
        raise ConfigError({"run_dirs": "give runs (folders or the ids `commlab runs` prints) or "
                                       "--hooks HOOK,HOOK,... to run"})
    return _run_hooks(args)


def _hooks(text: str, against: str = baselines.DEFAULT) -> list[str]:
    from commlab.tune.sweep import parse_list

    hooks = parse_list(text, str, "hook")
    unknown = [h for h in hooks if h not in HOOKS]
    if unknown or not hooks:
        raise ConfigError({"hook": f"unknown hook(s) {', '.join(unknown) or '(none given)'}; "
                                   f"known: {', '.join(HOOKS)}"})
    first = [b for b in dict.fromkeys((BASELINE, against)) if b not in hooks]
    return first + list(dict.fromkeys(hooks))


def _run_hooks(args: argparse.Namespace) -> list:
    from commlab.engine.launchers.warm import Batch

    base = config_from_args(args, axes=("hook",))
    # Every configuration is checked before the first run starts.
    configs = [base.with_overrides(hook=h).check() for h in _hooks(args.hook, args.against)]
    done = []
    with Batch("comparison", warm=len(configs) > 1) as batch:
        for i, cfg in enumerate(configs, 1):
            print(f"[{i}/{len(configs)}] {cfg.label()}: {cfg.steps} steps on {cfg.world_size} ranks",
                  file=sys.stderr, flush=True)
            r = batch.start(cfg)
            r.wait()
            if r.status() != RunStatus.FINISHED:
                print(f"  {r.id} ended {r.status()}: {r.status_record().get('error')}", file=sys.stderr)
            done.append(r)
    return done


def _text(rows: list[dict], cluster: Cluster, basis: str, against: str) -> str:
    from commlab.analysis.units import human_bytes, number, seconds
    from commlab.tune import compare

    w = max([len("algorithm"), *(len(r["label"]) for r in rows)])  # labels are never cut
    head = (f"{'algorithm':<{w}} {'quality':>8} {'bytes/step':>11} {'ratio':>7} "
            f"{'wire@N':>11} {'step here':>10} {'predicted':>10} {'speed-up':>8} {'overlap':>7}")
    lines = [f"quality: {basis}; wire@N and predicted: on {cluster.text()} (what-if model)",
             f"ratio, speed-up and pays: against {baselines.title(against)}", head]
    for r in rows:
        ratio = f"{r['compression_ratio']:.1f}x" if r["compression_ratio"] else "–"
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "–"
        quality = RunStatus.DIVERGED if r["diverged"] else number(r["quality"])
        lines.append(f"{r['label']:<{w}} {quality:>8} {human_bytes(r['bytes_per_step']):>11} "
                     f"{ratio:>7} {human_bytes(r['wire_bytes']):>11} {seconds(r['median_step_s']):>10} "
                     f"{seconds(r['predicted_step_s']):>10} {speedup:>8} {number(r['overlap_share'], 2):>7}")
    lines += [f"{r['label']}: {r['pays']}" for r in rows if r["pays"]]
    if why := compare.missing(rows, against):
        lines.append(why)
    return "\n".join(lines)


def _compare(args: argparse.Namespace) -> int:
    from commlab.commands import emit
    from commlab.tune import compare

    cluster = Cluster(args.predict_world_size, args.predict_bandwidth_gbps, args.predict_latency_us)
    errs = cluster.errors()
    try:
        baselines.check(args.against)
    except ConfigError as e:
        errs |= e.errors
    if errs:
        raise ConfigError(errs)
    runs = _runs(args)
    for r in runs:
        if damage := r.damage():
            print(f"commlab compare: left out run {r.id}: {damage}", file=sys.stderr)
    runs = [r for r in runs if not r.damage()]
    if not runs:
        raise ConfigError({"run_dirs": "no run left to compare"})
    try:
        rows = compare.compare_runs(runs, cluster, args.against)
    except ValueError as e:
        raise ConfigError({"run_dirs": str(e)}) from None
    basis = compare.bases(rows)
    emit(args, {"cluster": cluster.text(), "quality_basis": basis, "against": args.against,
                "missing_baseline": compare.missing(rows, args.against), "rows": rows},
         _text(rows, cluster, basis, args.against))
    return 0 if all(r.status() == RunStatus.FINISHED for r in runs) else 1


def register(sub) -> None:
    p = sub.add_parser("compare", help="algorithms side by side on one workload: quality, bytes, "
                                       "measured and predicted step time")
    p.add_argument("run_dirs", nargs="*", metavar="RUN",
                   help="run folders or run ids (as `commlab runs` prints them), of one workload")
    p.add_argument("--hooks", dest="hook", metavar="HOOK,HOOK,...",
                   help="instead of runs: run these hooks, one after another, with the settings "
                        "the other flags give (a plain allreduce first unless listed)")
    p.add_argument("--predict-world-size", type=int, default=Cluster.world_size, metavar="N",
                   help="the cluster the step time is predicted for")
    p.add_argument("--predict-bandwidth-gbps", type=float, default=Cluster.bandwidth_gbps,
                   metavar="GBPS", help="its link")
    p.add_argument("--predict-latency-us", type=float, default=Cluster.latency_us, metavar="US",
                   help="its per-hop latency")
    p.add_argument("--against", default=baselines.DEFAULT, metavar="BASELINE",
                   help="the baseline the ratio, speed-up and break-even are judged against: "
                        + ", ".join(f"{b} ({baselines.title(b)})" for b in baselines.BASELINES)
                        + f" (default: {baselines.DEFAULT}); with --hooks it runs first")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_run_options(p, axes=("hook",))  # its --runs-dir is also where run ids are looked up
    p.set_defaults(func=_compare)
