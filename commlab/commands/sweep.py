"""``commlab sweep``: a grid of one hook's own settings beside a plain allreduce baseline, each
setting with N seeds, one run after another.

    commlab sweep --workload mlp --steps 100 --matrix-approximation-rank 1,2,4 \
        --start-powersgd-iter 10,50 --repeats 3 [--min-compression-rate 2,4] [--wrapper none,fp16]
        [--predict-world-size 64 --predict-bandwidth-gbps 10] [--json]
    commlab sweep --hook topk --compress-ratio 0.01,0.05      (any hook, over its own axes)
    commlab sweep --against bf16 ...  (judged against bf16 allreduce: it runs after fp32's)
    commlab sweep --resume SWEEP      (a stopped or lost sweep: its id or folder)
    commlab sweep --resume SWEEP --repeats N   (any sweep that ended, with N seeds per setting)
    commlab sweep ... --max-repeats N   (open verdicts get seeds one at a time up to N; default 5)
    commlab sweep --show SWEEP [--against fp16]   (any sweep's table and recommendation, again)

``--hook`` names the hook swept (default PowerSGD); its axes are the settings it reads that the
settings table marks sweepable (``commlab.tune.sweep.hook_axes``), each a comma-separated list,
and an axis the hook does not read is refused by name.  Every other run option (``commlab
run``'s) sets the job all runs share.  A progress bar (tqdm;
plain lines when the output is not a terminal) shows the time left.  Ctrl-C stops the current
run and starts no other; finished runs are kept, and ``--resume`` runs the rest.  Exit 0 when
every planned run has ended.  The sweep's folder keeps what it found (result.json); ``--show``
prints it again from the runs, with times predicted on the cluster named, judged against the
baseline named (default the sweep's own).  Each setting says whether it pays on that cluster
(``commlab.tune.payoff``), and the recommendation its time to the target loss there.
"""
from __future__ import annotations

import argparse
import signal
import sys

from commlab.commands import Progress
from commlab.commands.run import add_launcher_options, add_run_options, config_from_args, slurm_from_args
from commlab.config import ConfigError, RunConfig, default_runs_dir
from commlab.engine.run_state import RunStatus
from commlab.hook_specs import BASELINE
from commlab.tune import baseline as baselines
from commlab.tune.quality import BASIS_TEXT, Cluster
from commlab.tune.sweep import (
    AXES,
    DEFAULT_MAX_REPEATS,
    DEFAULT_REPEATS,
    DEFAULT_TOLERANCE_PCT,
    SWEPT_HOOKS,
    SweepSpec,
    axis_values,
)

AXIS_NAMES = tuple(s.name for s in AXES)


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    if args.hook == BASELINE:
        raise ConfigError({"hook": f"{BASELINE} is the baseline, which every sweep runs first by "
                                   "itself: name the hook to sweep, one of "
                                   f"{', '.join(SWEPT_HOOKS)}"})
    # The axes given are lists; the others keep the spec's defaults.
    lists = {s.name: axis_values(s, getattr(args, s.name)) for s in AXES
             if getattr(args, s.name) is not None}
    return SweepSpec(base=config_from_args(args, axes=AXIS_NAMES), baseline=not args.no_baseline,
                     tolerance_pct=args.tolerance_pct,
                     repeats=DEFAULT_REPEATS if args.repeats is None else args.repeats,
                     max_repeats=DEFAULT_MAX_REPEATS if args.max_repeats is None else args.max_repeats,
                     against=baselines.DEFAULT if args.against is None else args.against, **lists)


def cluster_from_args(args: argparse.Namespace) -> Cluster:
    cluster = Cluster(args.predict_world_size, args.predict_bandwidth_gbps, args.predict_latency_us)
    if cluster.errors():
        raise ConfigError(cluster.errors())
    return cluster


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


WIDTH = 100  # the prose lines wrap here; a setting's row is as wide as its label needs


def _wrapped(text: str, indent: str = "") -> list[str]:
    import textwrap

    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False)


def _legend(p: dict, against: str) -> list[str]:
    bases = sorted({s["quality_basis"] for s in p["settings"] if s["quality_basis"]})
    loss = " / ".join(BASIS_TEXT.get(b, b) for b in bases) or "final loss"
    tolerance = p.get("tolerance_pct")  # result.json of older sweeps: not recorded
    return _wrapped(f"Each setting judged against {against}" + (
        f", within a tolerance of {tolerance:g}% of its loss (--tolerance-pct)" if tolerance is not None
        else "") + f"; predicted times on {p['cluster']} (--predict-world-size, "
        f"--predict-bandwidth-gbps, --predict-latency-us).") + _wrapped(
        f"Columns: seeds = finished / planned; loss = {loss}, mean over the seeds, ± their standard "
        f"deviation (lower is better); bytes/step = what each rank sends per step; x fewer = "
        f"{against}'s bytes over the setting's; measured s = training time here; predicted s = the "
        f"same steps on that cluster; front = nothing beats it on both loss and bytes, or loss and "
        f"predicted time.")


def _setting_lines(s: dict, w: int, verdicts: dict, target) -> list[str]:
    front = ", ".join(name for name, key in (("bytes", "pareto_bytes"), ("time", "pareto_predicted")) if s[key])
    seeds = f"{s['finished']}/{s['runs']}"
    lines = [f"{s['label']:<{w}} {seeds:>5} {_num(s['quality_mean'], '#.4g'):>7} "
             f"{_num(s['quality_std'], '#.4g'):>8} {_num(s['bytes_per_step'], ',.0f'):>11} "
             f"{_num(s.get('bytes_ratio'), '.1f'):>7} {_num(s['time_s'], '.3g'):>10} "
             f"{_num(s['predicted_s'], '.3g'):>11}  {front or '-'}"]
    pad = " " * 4
    lines += _wrapped("losses by seed: " + ", ".join(
        f"{seed}: {_num(q, '#.4g')}" for seed, q in zip(s["seeds"], s["qualities"]))
        + (f"; BROKEN: {'; '.join(s['broken'])}" if s["broken"] else ""), pad)
    if s["label"] in verdicts:
        v = verdicts[s["label"]]
        lines += _wrapped(f"verdict: {v['verdict']}: {v['reason']}", pad)
    if target is not None:
        lines += _wrapped(f"target loss {target:.4g}: reached by {s['reached']} finished seed(s)"
                          + (f", at step {s['reach_step']:.0f} (predicted {s['reach_predicted_s']:.3g} s)"
                             if s["reach_step"] is not None and s["reach_predicted_s"] is not None else ""), pad)
    if s.get("pays") and not s["baseline"]:
        lines += _wrapped(f"pays here? it {s['pays']}", pad)
    return lines


def _text(p: dict) -> str:
    w = max([7, *(len(s["label"]) for s in p["settings"])])  # labels whole: they name the values
    against = baselines.title(p.get("against", baselines.DEFAULT))  # result.json of older sweeps: fp32
    # a sweep over the job's sharding judges against the baseline at the first value it lists
    sharded = next((s.get("sharding") for s in p["settings"] if s["baseline"] and s.get("sharding")), None)
    against += f" ({sharded})" if sharded and sharded != RunConfig().sharding else ""
    verdicts = {v["setting"]: v for v in p["recommendation"].get("verdicts", [])}
    lines = [f"sweep {p['sweep_id']}: {p['status']} ({p['sweep_dir']})",
             *([f"error: {p['error']}"] if p.get("error") else []), *_legend(p, against), "",
             f"{'setting':<{w}} {'seeds':>5} {'loss':>7} {'± sd':>8} {'bytes/step':>11} {'x fewer':>7} "
             f"{'measured s':>10} {'predicted s':>11}  front"]
    for s in p["settings"]:
        lines += _setting_lines(s, w, verdicts, p["target"])
    rec = p["recommendation"]
    # Whole lines: a person greps them, and each reads as one sentence.
    lines += ["", f"rule: {rec['rule']}", f"recommendation: {rec['text']}"]
    if rec.get("here"):
        lines.append(f"on the cluster: {rec['here']}")
    if p.get("next"):
        lines += _wrapped(f"next: {p['next']['text']}")
    return "\n".join(lines)


PIPED_EVERY_S = 10.0  # piped, a running run's line this often


def _on_progress(bar, configs):
    import time

    shown: dict = {"key": None, "at": 0.0, "runs": len(configs)}

    def on_progress(p) -> None:
        if p.total > shown["runs"]:  # the sequential seeds: one job, so each run has the same steps
            bar.grow((p.total - shown["runs"]) * p.steps)
            shown["runs"] = p.total
        at = p.index * p.steps + min(p.step, p.steps)
        bar.update(max(at, bar.done))
        bar.describe(f"[{p.index + 1}/{p.total}] {p.label}")
        changed = shown["key"] != (p.index, p.run_status)
        ended = p.run_status not in (RunStatus.STARTING, RunStatus.RUNNING)
        due = bar.piped and time.monotonic() - shown["at"] >= PIPED_EVERY_S
        if changed and (ended or bar.piped) or due:
            shown.update(key=(p.index, p.run_status), at=time.monotonic())
            bar.write(p.line())
        if p.estimate:
            bar.write(p.estimate)

    return on_progress


def _sweep(args: argparse.Namespace) -> int:
    from commlab.commands import emit
    from commlab.tune import sweep as sw

    errors: dict[str, str] = {}
    try:
        cluster = cluster_from_args(args)
    except ConfigError as e:
        errors |= e.errors
    try:
        if args.against is not None:
            baselines.check(args.against)
    except ConfigError as e:
        errors |= e.errors
    if args.resume and args.against is not None:
        errors.setdefault("against", "a resumed sweep keeps its plan's baseline; judge it against "
                                     "another when it ends: --show SWEEP --against BASELINE")
    if args.resume and args.max_repeats is not None:
        errors.setdefault("max_repeats", "a resumed sweep keeps its plan's budget of seeds; give it "
                                         "more seeds with --repeats N")
    if args.show:
        if errors:
            raise ConfigError(errors)
        out = _find(args.show, args.runs_dir, "show").report(cluster, args.against)
        emit(args, out, _text(out))
        return 0
    try:  # every bad field is named at once
        slurm = slurm_from_args(args)
        if args.resume:
            sweep = _find(args.resume, args.runs_dir)
            configs = sw.more_seeds(sweep.spec(), args.repeats) if args.repeats is not None else sweep.configs()
        else:
            spec = spec_from_args(args)
            configs = sw.grid(spec)
    except ConfigError as e:
        errors |= e.errors
    if errors:
        raise ConfigError(errors)
    if not args.resume:
        if args.dry_run:
            labels = [sw.plan_label(c, spec) for c in configs]
            emit(args, {"runs": labels}, "\n".join(f"{i + 1}. {lab}" for i, lab in enumerate(labels)))
            return 0
        sweep = sw.create(spec, slurm)
    out = _execute(args, sweep, configs, cluster)
    emit(args, out, _text(out))
    return 0 if out["status"] == RunStatus.FINISHED else 1


def _execute(args: argparse.Namespace, sweep, configs: list, cluster: Cluster) -> dict:
    """Execute (or resume) the sweep here, its progress on stderr; Ctrl-C stops it. Returns its report."""
    from commlab.tune import sweep as sw

    interrupted: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: interrupted.append(signum))
    on_progress, bar = None, None
    if not args.json:
        where = " (each a Slurm job)" if sweep.slurm() else ""
        print(f"sweep {sweep.id}: {len(configs)} run(s), one after another{where} -> {sweep.path}; "
              "its time is estimated once its first two runs have timed this machine", file=sys.stderr)
        bar = Progress(sum(c.steps for c in configs), "step", lines=0)  # piped: the runs' own lines
        on_progress = _on_progress(bar, configs)
    try:
        if args.resume:
            sw.resume(sweep, on_progress, lambda: bool(interrupted), cluster, args.repeats)
        else:
            sw.execute(sweep, on_progress, lambda: bool(interrupted), cluster=cluster)
    finally:
        if bar is not None:
            bar.close()
    return sweep.saved_report() or sweep.report(cluster)


def _find(given: str, runs_dir: str | None, field: str = "resume"):
    """A sweep named by its id (as ``commlab runs`` lists it) or its folder."""
    from pathlib import Path

    from commlab.tune.sweep import SWEEPS, Sweep

    for path in (Path(given), Path(runs_dir or default_runs_dir()) / SWEEPS / given):
        sweep = Sweep(path)
        if sweep.exists():
            return sweep
    raise ConfigError({field: f"no sweep {given!r}: give a sweep id from "
                                 f"{Path(runs_dir or default_runs_dir()) / SWEEPS} or its folder"})


def register(sub) -> None:
    p = sub.add_parser("sweep", help="a grid of one hook's settings (--hook, default PowerSGD) "
                                     "beside an allreduce baseline, run by run")
    add_run_options(p, axes=AXIS_NAMES)
    p.add_argument("--no-baseline", action="store_true", help="leave out the baselines' runs")
    p.add_argument("--against", metavar="BASELINE",
                   help="the baseline the recommendation, ratios and break-evens are judged against: "
                        + ", ".join(f"{b} ({baselines.title(b)})" for b in baselines.BASELINES)
                        + f" (default: {baselines.DEFAULT}; a 16-bit one runs after fp32 allreduce, "
                          "which calibrates the what-if model); with --show, judge that sweep again")
    p.add_argument("--tolerance-pct", type=float, default=DEFAULT_TOLERANCE_PCT,
                   help="the recommendation's X: a setting qualifies when its loss is within X%% of "
                        f"allreduce's, beyond the seed noise (default: {DEFAULT_TOLERANCE_PCT:g})")
    p.add_argument("--repeats", type=int, metavar="N",
                   help=f"seeds per setting, the baseline's included (default: {DEFAULT_REPEATS}, the "
                        "fewest with which the recommendation can tell a difference from seed noise); "
                        "with --resume, more seeds than the sweep planned: its runs are kept, the new "
                        "seeds' run after them")
    p.add_argument("--max-repeats", type=int, metavar="N",
                   help="the budget of sequential seeds: while the seeds cannot tell, the settings whose "
                        "verdict one more seed may decide get one, with the baseline, up to N seeds "
                        f"per setting (default: {DEFAULT_MAX_REPEATS}); then, still open, the baseline is "
                        "kept and the command that would narrow it printed")
    p.add_argument("--predict-world-size", type=int, default=Cluster.world_size, metavar="N",
                   help=f"the cluster times are predicted for (default: {Cluster.world_size} workers)")
    p.add_argument("--predict-bandwidth-gbps", type=float, default=Cluster.bandwidth_gbps,
                   metavar="GBPS", help=f"its link (default: {Cluster.bandwidth_gbps:g} Gb/s)")
    p.add_argument("--predict-latency-us", type=float, default=Cluster.latency_us, metavar="US",
                   help=f"its per-hop latency (default: {Cluster.latency_us:g} µs)")
    p.add_argument("--resume", metavar="SWEEP",
                   help="run the unfinished runs of a stopped or lost sweep (its id or folder)")
    p.add_argument("--show", metavar="SWEEP",
                   help="print a sweep's table and recommendation again (its id or folder), start nothing")
    p.add_argument("--dry-run", action="store_true", help="print the planned runs, start nothing")
    add_launcher_options(p, nodes_flag=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_sweep)
