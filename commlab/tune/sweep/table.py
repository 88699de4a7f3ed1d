"""A sweep's table: one row per run (``summarize``, ``results``), the settings over their seeds and
the recommendation (``report``, what result.json holds).  Pure but for reading the runs' folders."""
from __future__ import annotations

import collections

from commlab.analysis import metrics
from commlab.config import RunConfig, label_of, link_of
from commlab.engine.run_state import RunStatus
from commlab.tune import baseline as baselines
from commlab.tune import pareto, payoff, quality, whatif
from commlab.tune.sweep.spec import JOB_AXES, baseline_hooks, grid, hook_axes, missing, per_seed

FINAL_WINDOW = quality.WINDOW  # final loss: mean over this many last steps
REACH_COLUMNS = ["reach_step", "reach_time_s", "reach_predicted_s", "reach_bytes"]
ROW_COLUMNS = ["label", "seed", "run_id", "run_dir", "status", "diverged", "baseline", "against",
               "hook", "wrapper", *pareto.AXIS_KEYS, "steps", "quality", "quality_basis", "accuracy",
               "bits_per_char", "final_loss", "bytes_per_step", "time_s", "median_step_s",
               "predicted_s", *pareto.PAYOFF_KEYS, "link", "curve", *REACH_COLUMNS]


def summarize(records: list[dict], cfg: dict, status: str, run_id: str = "", run_dir: str = "",
              final_window: int = FINAL_WINDOW, evals: list[dict] | None = None,
              predicted_step_s: list[float] | None = None, against: str = baselines.DEFAULT) -> dict:
    """One sweep row from a run's metrics and evaluations: its headline
    (``commlab.analysis.metrics.headline``) read over the windows a sweep compares.

    quality: the final held-out loss, else the training loss's mean over the last
    ``final_window`` steps (``quality_basis`` says which; ``commlab.tune.quality``); curve: the
    same by step, for time to quality.  final_loss: that training-loss mean, always.
    The hook's own axes carry its values, the others None.
    bytes_per_step: all the bytes the hook handed over, divided by the steps, not the steady
    median: ``start_powerSGD_iter`` (and ``start_localSGD_iter``) is an axis, and its allreduce
    steps are part of what a setting costs.  time_s: training time to the last step, start-up excluded.  median_step_s: over the
    steady steps, as in the run's headline.  predicted_s: the sum of ``predicted_step_s``, the
    what-if model's step times on the chosen cluster.  baseline: whether it is a run of the
    baseline ``against``.  The reach and payoff columns are filled by the sweep (they need every
    seed's baseline first).
    """
    figures = metrics.headline(records, cfg, final_window, bytes_over_run=True)
    c = quality.curve(evals, records, final_window)
    # the other hooks' axes' values are not this run's; the job's are every run's
    own = {s.name for s in (*hook_axes(cfg.get("hook")), *JOB_AXES)}
    return {
        "label": label_of(cfg, link=True), "seed": cfg.get("seed"), "run_id": run_id, "run_dir": run_dir, "status": status,
        "diverged": status == RunStatus.DIVERGED or quality.diverged(c, records),
        "baseline": baselines.is_baseline(cfg, against), "against": against,
        "hook": cfg.get("hook"), "wrapper": cfg.get("wrapper"),
        **{k: cfg.get(k) if k in own else None for k in pareto.AXIS_KEYS}, "steps": len(records),
        "quality": c.final, "quality_basis": c.basis, "accuracy": c.accuracy,
        "bits_per_char": c.bits_per_char,
        "final_loss": figures["final_loss"], "bytes_per_step": figures["bytes_per_step"],
        "time_s": records[-1]["t"] if records else None, "median_step_s": figures["median_step_s"],
        "predicted_s": sum(predicted_step_s) if predicted_step_s else None,
        "link": link_of(cfg) or "loopback", "curve": c,
        **dict.fromkeys([*pareto.PAYOFF_KEYS, *REACH_COLUMNS]),
    }

def results(sweep, tolerance_pct: float | None = None, cluster: quality.Cluster = quality.Cluster(),
            against: str | None = None):
    """One row per run started, in plan order (a pandas DataFrame, ``ROW_COLUMNS``): its
    quality, bytes, measured time, the time the what-if model predicts on ``cluster``, and
    where it first reached the target (the baseline's mean final quality plus
    ``tolerance_pct``, default the spec's); judged against the baseline ``against`` (default
    the spec's; ConfigError for a name that is none): whether it pays on ``cluster``
    (``commlab.tune.payoff``, against the baseline's run of its seed) and its predicted speed-up
    there.  ``commlab.tune.pareto.by_setting`` folds the seeds."""
    against = baselines.check(sweep.spec().against if against is None else against)
    runs = sweep.runs()
    loaded = [(r, r.config_dict(), r.metrics_records(), r.evals()) for r in runs]
    profiles = {p.run_id: p for p in whatif.profiles_from_runs(runs)}
    plain, based = _by_seed(loaded, profiles, baselines.BASELINE), _by_seed(loaded, profiles, against)
    rows, extra = [], []
    for r, cfg, recs, evals in loaded:
        seed = cfg.get("seed")
        per_step = quality.predicted_step_s(recs, cfg, profiles.get(r.id), plain[seed], cluster)
        rows.append({**summarize(recs, cfg, r.status(), r.id, str(r.path), evals=evals,
                                 predicted_step_s=per_step, against=against),
                     **payoff.judged(based[seed], profiles.get(r.id), cluster, against)})
        extra.append((recs, per_step))
    table = _frame(rows)
    # With a job axis (sharding) a seed runs the baseline at each of its values: the first planned is
    # the one judged against, the others are settings like any (FSDP's plain run judged against
    # plain HSDP's), so that every figure has one baseline.
    first = next(iter(table.loc[table["baseline"], "label"]), None)
    table["baseline"] = table["baseline"] & (table["label"] == first)
    table["against"] = against
    goal = pareto.target(table, sweep.spec().tolerance_pct if tolerance_pct is None else tolerance_pct)
    for i, (recs, per_step) in enumerate(extra):
        got = quality.reach(table.at[i, "curve"], recs, per_step, goal) if goal is not None \
            else quality.Reached()
        for key in ("step", "time_s", "predicted_s", "bytes"):
            table.at[i, f"reach_{key}"] = getattr(got, key)
    table["target"] = goal
    table["cluster"] = cluster.text()
    return table


def report(sweep, cluster: quality.Cluster = quality.Cluster(), against: str | None = None) -> dict:
    """Every run, every setting over its seeds, the recommendation: what ``commlab sweep``
    prints (``--json``) and ``result.json`` holds; judged against ``against`` (default the spec's)."""
    tolerance = sweep.spec().tolerance_pct
    runs = results(sweep, tolerance, cluster, against)
    table = pareto.by_setting(runs)
    rec = sweep.recommend(runs)
    return {"sweep_id": sweep.id, "sweep_dir": str(sweep.path), "status": sweep.status(),
            "error": sweep.state().get("error"), "estimate": sweep.state().get("estimate"),
            "cluster": cluster.text(), "against": pareto.against(runs), "tolerance_pct": tolerance,
            "target": runs["target"].iloc[0] if len(runs) else None,
            "runs": _records(runs.drop(columns=["curve", "payoff"])), "settings": _records(table),
            "recommendation": rec.to_dict(), "next": next_step(sweep, rec),
            "pareto_bytes": table[table["pareto_bytes"]]["label"].tolist(),
            "pareto_predicted": table[table["pareto_predicted"]]["label"].tolist()}


def next_step(sweep, rec: pareto.Recommendation) -> dict | None:
    """What to run when verdicts are open (None when none is, or while the sweep runs): ``text``
    says it; ``command`` runs the sweep's unfinished runs and the seeds its open verdicts need
    (``Recommendation.seeds_needed``), ``runs`` it adds, ``estimate_s`` its time at this sweep's
    pace (``Sweep.seconds_per_run``).  A sweep that kept the baseline when its budget of seeds ran
    out is told what would narrow it.  No command when no number of seeds would decide."""
    from commlab.analysis.units import seconds

    if not rec.open or sweep.status() == RunStatus.RUNNING:
        return None
    spec = sweep.spec()
    repeats = max(len({c.seed for c in grid(spec)}), rec.seeds_needed or 0)
    lacking = missing(spec, repeats) if rec.seeds_needed else []
    runs = len(grid(spec)) + len(lacking) - sum(r.status() == RunStatus.FINISHED for r in sweep.runs())
    if runs <= 0:
        return _longer(sweep, rec)
    more = bool(lacking)
    command = (f"commlab sweep --resume {sweep.id} --runs-dir {sweep.runs_root}"
               + (f" --repeats {repeats}" if more else ""))
    pace = sweep.seconds_per_run()
    estimate = pace * runs if pace else None
    took = f", about {seconds(estimate)} at this sweep's pace" if estimate else ""
    what = f"run {repeats} seeds per setting" if more else "finish the planned runs"
    if rec.decided:
        what = f"to narrow it, {what}"
    return {"text": f"{what}: {command}  ({runs} run(s){took})", "command": command,
            "repeats": repeats, "runs": runs, "estimate_s": estimate}


def _longer(sweep, rec: pareto.Recommendation) -> dict:
    """The next step when no number of seeds would decide (the gap to the tolerance is within the
    seed noise): the open settings swept again with twice the steps and as many seeds, beside the
    baselines (the command, its runs and their time at this sweep's pace, each run twice as long);
    or another tolerance, which judges the same runs."""
    from commlab.analysis.units import seconds
    from commlab.config import settings

    spec = sweep.spec()
    open_ = [c for c in grid(spec)[:per_seed(spec)] if label_of(c.to_dict(), link=True) in rec.open]
    axes = {name: list(dict.fromkeys(getattr(c, name) for c in open_)) for name in spec.axes()}
    axes |= spec.job_axes()  # the baselines run at each job again
    default, base = RunConfig(), spec.base.with_overrides(steps=2 * spec.base.steps)
    flags = [_flag(st, getattr(base, st.name)) for st in settings()
             if st.name not in axes and st.name != "runs_dir" and getattr(base, st.name) != getattr(default, st.name)]
    if spec.hook != base.hook:
        flags.append(f"--hook {spec.hook}")
    flags += [_flag(next(st for st in settings() if st.name == name), values) for name, values in axes.items()]
    seeds = len({c.seed for c in grid(spec)})
    command = " ".join(["commlab sweep", *flags, f"--repeats {seeds}", f"--runs-dir {sweep.runs_root}"])
    runs = (len(baseline_hooks(spec)) * len(spec.jobs()) + len(open_)) * seeds
    pace = sweep.seconds_per_run()
    took = f", about {seconds(2 * pace * runs)} at this sweep's pace" if pace else ""
    return {"text": f"more seeds would not decide within {pareto.MAX_SEEDS_ASKED} per setting: the gap to "
                    f"the tolerance is within the seed noise; to narrow it, train the open setting(s) "
                    f"twice as long: {command}  ({runs} run(s){took}); or judge the same runs with "
                    "another --tolerance-pct", "command": command, "runs": runs,
            "estimate_s": 2 * pace * runs if pace else None}


def _flag(setting, value) -> str:
    """A setting as ``commlab sweep`` takes it (a list comma-separated: a sweep axis's or a list's)."""
    if setting.kind == "bool":
        return setting.flag if value else f"--no-{setting.flag[2:]}"
    return f"{setting.flag} {','.join(map(str, value)) if isinstance(value, list) else value}"


def _by_seed(loaded, profiles: dict, against: str) -> collections.defaultdict:
    """The profile of the baseline ``against``'s run of each seed; a seed without one gets the
    first seed's that has one (None when no seed has)."""
    found: dict = {}
    for r, cfg, _, _ in loaded:  # the first of a seed's, in plan order: the first job's (``results``)
        if baselines.is_baseline(cfg, against):
            found.setdefault(cfg.get("seed"), profiles.get(r.id))
    fallback = next((p for p in found.values() if p), None)
    return collections.defaultdict(lambda: fallback, {k: v for k, v in found.items() if v})


def _records(df) -> list[dict]:
    return df.astype(object).where(df.notna(), None).to_dict(orient="records")


def _frame(rows: list[dict]):
    import pandas as pd

    return pd.DataFrame(rows, columns=ROW_COLUMNS).astype({c: object for c in REACH_COLUMNS})
