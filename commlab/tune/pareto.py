"""Reading a sweep's table: per setting over its seeds, which settings nothing beats, and the one to
recommend, decided with the seed-to-seed noise in view (pure).

The runs table has one row per run (``commlab.tune.sweep.summarize``): a setting (``label``)
run with several seeds (``seed``), each with its quality (held-out loss, ``quality_basis`` says
when it is the training loss instead).  ``by_setting`` folds the seeds of each setting into one
row: mean and spread of the quality, every seed's value, bytes, times and time to quality.

The rule (``RULE``): a setting is *as good as the baseline* (fp32 allreduce, or a 16-bit one:
``commlab.tune.baseline``; the runs table's ``against`` names it and its ``baseline`` column marks
its runs) when the upper end of the 95% t-interval of its loss minus the baseline's, paired seed by
seed, lies at or below X% of the baseline's loss; of those, the fewest bytes per step wins, if
fewer than the baseline's (judged against fp16, fp32 allreduce may be as good, never worth its
bytes).  Paired, because the runs of one seed share their initial weights and their batches across
settings (``commlab.tune.sweep``): a seed's
luck is in both losses and cancels in their difference, so the interval measures what the setting
changes, not how lucky the seed was (Welch's interval on two independent samples would count the
seed spread twice and need more seeds for the same decision).  The interval is the test: its
upper end below the tolerance says the loss is within it *and* the spread allows no larger
difference; its lower end above says the setting is worse; between, the noise is larger than the
gap and nothing is decided.  Fewer than ``MIN_SEEDS`` paired seeds decide nothing, and a setting
with a failed or diverged seed is never recommended.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from commlab.config import settings
from commlab.engine.run_state import RunStatus
from commlab.tune import baseline as baselines

MIN_SEEDS = 3  # with 2, the t-interval's factor is 12.7: no real gap can be told from noise
MAX_SEEDS_ASKED = 12  # the most seeds the next step proposes: beyond, more steps or a tolerance decide
CONFIDENCE = 0.95
RULE = ("as good as {base}: the upper end of the {conf:.0%} t-interval of (its loss - {base}'s "
        "loss), paired by seed, is at most {x:g}% of {base}'s loss; of those, the fewest bytes per "
        "step, if fewer than {base}'s. At least {k} seeds; never a setting with a failed or diverged seed")

# Verdicts, one per compressed setting
AS_GOOD, WORSE, UNDECIDED, TOO_FEW, FAILED, INCOMPLETE = (
    "as good", "worse", "undecided", "too few seeds", "failed seed", "unfinished seed")

# The hooks' own sweep axes, as the settings table marks them (the wrapper has its own column).
AXIS_KEYS = tuple(s.name for s in settings() if s.sweepable and s.group != "hook")
SETTING_KEYS = ["label", "baseline", "against", "hook", "wrapper", *AXIS_KEYS, "link"]
# What the what-if model says of a run on the chosen cluster (``commlab.tune.payoff.judged``): each
# against its own seed's baseline run; ``by_setting`` folds them over the seeds (``SEED_PAYOFF``).
PAYOFF_KEYS = ["pays", "break_even_gbps", "speedup", "step_s", "baseline_step_s", "payoff"]
SEED_PAYOFF = ["pays", "break_even_gbps", "break_even_low", "break_even_high", "speedup", "speedup_low",
               "speedup_high", "step_s", "baseline_step_s"]


def against(runs) -> str:
    """The baseline a runs table is judged against (its ``against`` column; fp32 allreduce without one)."""
    named = runs["against"].dropna() if "against" in runs else ()
    return named.iloc[0] if len(named) else baselines.DEFAULT


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def usable(row) -> bool:
    """A run that counts: finished, with a finite quality."""
    return row["status"] == RunStatus.FINISHED and not row.get("diverged", False) and _finite(row["quality"])


def broken(row) -> bool:
    """A run whose seed rules its setting out: it failed, diverged, or ended with a loss that is not
    a number (stopped and still-going runs are unfinished, not broken)."""
    return row["status"] not in (RunStatus.FINISHED, RunStatus.STOPPED, RunStatus.STARTING, RunStatus.RUNNING) or bool(
        row.get("diverged", False)) or (row["status"] == RunStatus.FINISHED and not _finite(row["quality"]))


def _mean(xs):
    xs = [float(x) for x in xs if _finite(x)]
    return sum(xs) / len(xs) if xs else None


def _std(xs):
    xs = [float(x) for x in xs if _finite(x)]
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def by_setting(runs):
    """One row per setting in plan order: its seeds and their qualities, mean and sample standard
    deviation (``quality_std``, None with one seed), means over the finished seeds of bytes per
    step, measured and predicted time, and of time to quality over the seeds that reached it
    (``reached``: how many did); ``broken``: the seeds that rule it out; ``bytes_ratio``: the
    baseline's bytes per step over its own; whether it pays on the cluster over its seeds
    (``payoff_over_seeds``).  Fronts marked."""
    import pandas as pd

    base_bytes = _mean(r.get("bytes_per_step") for r in runs.to_dict(orient="records")
                       if r["baseline"] and usable(r))
    out = []
    for _, group in runs.groupby("label", sort=False):
        rows = group.to_dict(orient="records")
        ok = [r for r in rows if usable(r)]
        first = rows[0]
        reached = [r for r in ok if r.get("reach_step") is not None and _finite(r["reach_step"])]
        nbytes = _mean(r.get("bytes_per_step") for r in ok)
        out.append({
            **{k: first.get(k) for k in SETTING_KEYS}, "run_id": first.get("run_id"),
            "seeds": [r["seed"] for r in rows], "finished": len(ok), "runs": len(rows),
            "qualities": [r["quality"] for r in rows],
            "quality_basis": ", ".join(sorted({r["quality_basis"] for r in ok})) or None,
            "quality_mean": _mean(r["quality"] for r in ok),
            "quality_std": _std(r["quality"] for r in ok),
            "accuracy_mean": _mean(r.get("accuracy") for r in ok),
            "broken": [f"seed {r['seed']}: {'diverged' if r.get('diverged') else r['status']}"
                       for r in rows if broken(r)],
            **{k: _mean(r.get(k) for r in ok) for k in ("bytes_per_step", "time_s", "predicted_s")},
            "bytes_ratio": base_bytes / nbytes if base_bytes and nbytes else None,
            **payoff_over_seeds(ok),
            "reached": f"{len(reached)}/{len(ok)}",
            **{k: _mean(r.get(k) for r in reached) for k in
               ("reach_step", "reach_time_s", "reach_predicted_s", "reach_bytes")}})
    return mark(pd.DataFrame(out, columns=SETTINGS_COLUMNS))


SETTINGS_COLUMNS = [*SETTING_KEYS, "run_id", "seeds", "finished", "runs", "qualities", "quality_basis",
                    "quality_mean", "quality_std", "accuracy_mean", "broken", "bytes_per_step",
                    "time_s", "predicted_s", "bytes_ratio", *SEED_PAYOFF, "reached", "reach_step", "reach_time_s",
                    "reach_predicted_s", "reach_bytes"]


def payoff_over_seeds(rows: list[dict]) -> dict:
    """``SEED_PAYOFF`` of a setting's finished seeds: whether it pays (``payoff.over_seeds``: the
    verdict most seeds give, the median break-even and its range), the median speed-up and its
    range, the median predicted step times."""
    from commlab.tune import payoff

    over = payoff.over_seeds([r["payoff"] for r in rows if r.get("payoff") is not None])
    fast = sorted(float(r["speedup"]) for r in rows if _finite(r.get("speedup")))
    # A table without the seeds' Payoffs (made by hand) keeps its first sentence.
    said = over.sentence() if over else next((r["pays"] for r in rows if r.get("pays")), None)
    return {"pays": said,
            "break_even_gbps": over.break_even_gbps if over else None,
            "break_even_low": over.low_gbps if over else None,
            "break_even_high": over.high_gbps if over else None,
            "speedup": _median(fast), "speedup_low": fast[0] if fast else None,
            "speedup_high": fast[-1] if fast else None,
            **{k: _median([float(r[k]) for r in rows if _finite(r.get(k))]) for k in ("step_s", "baseline_step_s")}}


def _median(xs: list[float]) -> float | None:
    import statistics

    return statistics.median(xs) if xs else None


def comparable(df):
    """Settings that may enter the front: no broken seed, a finished one, its bytes counted."""
    import numpy as np

    mean = df["quality_mean"].astype(float)
    return (df["broken"].str.len() == 0) & (df["finished"] > 0) & np.isfinite(mean) & \
        df["bytes_per_step"].notna()


def pareto_front(xs: list[float], ys: list[float]) -> list[bool]:
    """Which points no other point beats on both (smaller is better on both axes)."""
    return [not any((xj <= xi and yj <= yi) and (xj < xi or yj < yi)
                    for j, (xj, yj) in enumerate(zip(xs, ys)) if j != i)
            for i, (xi, yi) in enumerate(zip(xs, ys))]


FRONTS = {"pareto_bytes": "bytes_per_step", "pareto_time": "time_s", "pareto_predicted": "predicted_s"}


def mark(df):
    """Add a front column per axis (``FRONTS``): on the front of mean quality against that axis."""
    df = df.copy()
    for col in FRONTS:
        df[col] = False
    if not len(df):
        return df
    ok = comparable(df)
    for col, axis in FRONTS.items():
        sub = df[ok & df[axis].notna()]
        if len(sub):
            df.loc[sub.index, col] = pareto_front(sub[axis].astype(float).tolist(),
                                                  sub["quality_mean"].astype(float).tolist())
    return df


def target(runs, tolerance_pct: float) -> float | None:
    """The default quality target: the baseline's mean final quality plus the tolerance."""
    base = [r["quality"] for r in runs.to_dict(orient="records") if r["baseline"] and usable(r)]
    m = _mean(base)
    return None if m is None else m + abs(m) * tolerance_pct / 100


# ============================================================================ the rule
@dataclass
class Verdict:
    setting: str
    verdict: str  # AS_GOOD, WORSE, UNDECIDED, TOO_FEW, FAILED or INCOMPLETE
    reason: str
    pairs: int = 0
    mean_diff: float | None = None  # its loss - the baseline's, mean over paired seeds
    low: float | None = None  # the interval's ends
    high: float | None = None
    tolerance: float | None = None  # X% of the baseline's loss, in loss units
    seeds_needed: int | None = None  # seeds per setting that would decide an open verdict, as far as its spread says


def paired_interval(diffs: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean, low, high): the t-interval of the mean of paired differences: Student's t quantile
    (scipy.special.stdtrit, what scipy.stats.t.ppf computes, at half the import time)."""
    from scipy.special import stdtrit

    n = len(diffs)
    m = sum(diffs) / n
    sd = _std(diffs) or 0.0
    half = float(stdtrit(n - 1, (1 + confidence) / 2)) * sd / math.sqrt(n)
    return m, m - half, m + half


def verdicts(runs, tolerance_pct: float, confidence: float = CONFIDENCE,
             min_seeds: int = MIN_SEEDS) -> list[Verdict]:
    """Each compressed setting against the baseline, by ``RULE``; [] without a usable baseline."""
    rows = runs.to_dict(orient="records")
    base = {r["seed"]: float(r["quality"]) for r in rows if r["baseline"] and usable(r)}
    if not base:
        return []
    base_mean = sum(base.values()) / len(base)
    tol = abs(base_mean) * tolerance_pct / 100
    out = []
    for setting in dict.fromkeys(r["label"] for r in rows if not r["baseline"]):
        mine = [r for r in rows if r["label"] == setting]
        bad = [r for r in mine if broken(r)]
        if bad:
            why = ", ".join(f"seed {r['seed']} {'diverged' if r.get('diverged') else r['status']}"
                            for r in bad)
            out.append(Verdict(setting, FAILED, f"{why}: never recommended", tolerance=tol))
            continue
        unfinished = [r for r in mine if not usable(r)]
        if unfinished:
            out.append(Verdict(setting, INCOMPLETE, "seed(s) " + ", ".join(
                str(r["seed"]) for r in unfinished) + " did not finish: resume the sweep", tolerance=tol))
            continue
        diffs = [float(r["quality"]) - base[r["seed"]] for r in mine if r["seed"] in base]
        if len(diffs) < min_seeds:
            n = len(diffs)
            out.append(Verdict(setting, TOO_FEW, f"{n} seed{'s' if n != 1 else ''} cannot separate "
                               f"these: run {min_seeds} or more", n, _mean(diffs), tolerance=tol))
            continue
        m, lo, hi = paired_interval(diffs, confidence)
        if hi <= tol:
            verdict, why = AS_GOOD, "within the tolerance, and the seeds allow no larger difference"
        elif lo > tol:
            verdict, why = WORSE, "worse than the tolerance allows, beyond the seed noise"
        else:
            verdict, why = UNDECIDED, ("the seed-to-seed spread is larger than the gap to the "
                                       "tolerance: run more seeds")
        out.append(Verdict(setting, verdict, f"{why} (difference {m:+.4g}, interval [{lo:+.4g}, "
                                             f"{hi:+.4g}], tolerance {tol:.4g})", len(diffs), m, lo, hi, tol,
                           seeds_to_decide(diffs, tol, confidence) if verdict == UNDECIDED else None))
    return out


def seeds_to_decide(diffs: list[float], tolerance: float, confidence: float = CONFIDENCE,
                    most: int = MAX_SEEDS_ASKED) -> int | None:
    """The fewest seeds whose interval, were the mean difference and its spread what these seeds
    show, would leave the tolerance on one side; None when even ``most`` would not (the gap to the
    tolerance is within the noise: a tolerance or more steps decide it, not seeds)."""
    from scipy.special import stdtrit

    m, sd = sum(diffs) / len(diffs), _std(diffs) or 0.0
    gap = abs(tolerance - m)
    return next((n for n in range(len(diffs) + 1, most + 1)
                 if float(stdtrit(n - 1, (1 + confidence) / 2)) * sd / math.sqrt(n) < gap), None)


@dataclass
class Recommendation:
    rule: str
    run_id: str | None  # the first seed's run of the setting recommended
    label: str | None  # the setting recommended; None when nothing is decided
    text: str
    decided: bool = False
    bytes_per_step: float | None = None
    final_loss: float | None = None  # its mean quality over seeds
    verdicts: list[dict] = field(default_factory=list)
    against: str = baselines.DEFAULT  # the baseline it was judged against
    here: str | None = None  # on the runs' cluster: its time to the target loss, whether it pays
    seeds_needed: int | None = None  # undecided: seeds per setting that would decide the open verdicts
    open: list[str] = field(default_factory=list)  # the settings whose open verdicts it was made without

    def to_dict(self) -> dict:
        return asdict(self)

    def to_seed(self, most: int) -> list[str]:
        """The open settings one more seed may decide, within ``most`` seeds (``to_seed``)."""
        return [] if self.decided else to_seed([Verdict(**v) for v in self.verdicts
                                                if v["setting"] in self.open], most)


def to_seed(verdicts: list[Verdict], most: int) -> list[str]:
    """The settings one more seed may decide: undecided at fewer than ``most`` seeds, with a spread
    at which ``most`` seeds or fewer would leave the tolerance on one side (``seeds_to_decide``).
    The others' gap to the tolerance is within the noise as far as their seeds show, or their
    seeds are fewer than the rule's least (the plan's choice) or unfinished (a resume's)."""
    return [v.setting for v in verdicts if v.verdict == UNDECIDED and v.pairs < most
            and v.seeds_needed is not None and v.seeds_needed <= most]


def _cannot_compare(runs, table, name: str, title: str) -> str | None:
    """Why the sweep's runs cannot be judged against its baseline yet, or None."""
    if table is None or not table["baseline"].any():
        return f"the sweep has no {title} baseline to compare with: run it with that baseline (against {name})"
    if not table[table["baseline"]].iloc[0]["finished"]:
        state = ", ".join(sorted(set(runs[runs["baseline"]]["status"])))
        return (f"nothing to compare with yet: the {title} baseline has no finished seed ({state}); "
                "resume the sweep to finish it")
    if len({r["quality_basis"] for r in runs.to_dict(orient="records") if usable(r)}) > 1:
        # a held-out loss and a training loss do not subtract
        return ("no decision: some runs were evaluated on held-out data and some were not (eval_every), "
                "so their losses do not compare; run the sweep again with one eval_every")
    return None


def _budget_spent(title: str, found: list, open_: list, tolerance_pct: float, base_loss: float,
                  most_seeds: int) -> str:
    """Keeping the baseline once the sweep's budget of seeds cannot decide an open verdict."""
    verdicts_said = "; ".join(
        f"{v.setting}: {v.verdict}" + (f" [{v.low:+.4g}, {v.high:+.4g}] against tolerance {v.tolerance:.4g}"
                                       if v.verdict == UNDECIDED else "") for v in found)
    return (f"keep {title}: after {max(v.pairs for v in open_)} seeds no setting that sends fewer bytes is "
            f"shown within {tolerance_pct:g}% of its loss {base_loss:.4g} at the seeds' spread ({verdicts_said}); "
            f"more seeds within the sweep's budget (--max-repeats {most_seeds}) would not decide")


def recommend(runs, tolerance_pct: float, confidence: float = CONFIDENCE,
              min_seeds: int = MIN_SEEDS, most_seeds: int | None = None) -> Recommendation:
    """The fewest bytes per step among the settings ``RULE`` calls as good as the baseline
    (``against``), if fewer than the baseline's.  ``most_seeds``: the seeds the sweep may give an
    open verdict (its budget of sequential seeds); once none of them may decide one more
    (``to_seed``), no setting was shown as good: keep the baseline, saying after how many seeds and
    which verdicts stayed open (``open``, the next step narrows them).  Without it, open verdicts
    decide nothing."""
    name = against(runs)
    title = baselines.title(name)
    rule = RULE.format(base=title, conf=confidence, x=tolerance_pct, k=min_seeds)

    def said(*args, **kwargs) -> Recommendation:
        return Recommendation(rule, *args, **kwargs, against=name)

    table = by_setting(runs) if len(runs) else None
    if why := _cannot_compare(runs, table, name, title):
        return said(None, None, why)
    base = table[table["baseline"]].iloc[0]
    found = verdicts(runs, tolerance_pct, confidence, min_seeds)
    kept = [asdict(v) for v in found]
    base_loss, base_bytes = float(base["quality_mean"]), base["bytes_per_step"]
    # A setting that sends no fewer bytes than the baseline is never worth recommending over it.
    cheaper = set(table[~(table["bytes_per_step"] >= base_bytes)]["label"]) if _finite(base_bytes) \
        else set(table["label"])
    good = table[table["label"].isin([v.setting for v in found
                                      if v.verdict == AS_GOOD and v.setting in cheaper])]
    if len(good):
        best = good.sort_values(["bytes_per_step", "quality_mean"]).iloc[0]
        v = next(v for v in found if v.setting == best["label"])
        fewer = (f", {base_bytes / best['bytes_per_step']:.1f}x fewer than {title}"
                 if base_bytes and best["bytes_per_step"] else "")
        return said(
            best["run_id"], best["label"],
            f"{best['label']}: {best['bytes_per_step']:,.0f} bytes per step{fewer}; loss "
            f"{best['quality_mean']:.4g} against {title}'s {base_loss:.4g} over {v.pairs} seeds "
            f"(difference {v.mean_diff:+.4g}, {confidence:.0%} interval [{v.low:+.4g}, {v.high:+.4g}], "
            f"tolerance {v.tolerance:.4g})", True, float(best["bytes_per_step"]),
            float(best["quality_mean"]), kept, here=_here(runs, best, base))
    open_ = [v for v in found if v.verdict in (UNDECIDED, TOO_FEW, INCOMPLETE) and v.setting in cheaper]
    spent = most_seeds is not None and all(v.verdict == UNDECIDED for v in open_) and \
        not to_seed(open_, most_seeds)
    if open_ and spent:
        return said(base["run_id"], base["label"],
                    _budget_spent(title, found, open_, tolerance_pct, base_loss, most_seeds),
                    True, base_bytes, base_loss, kept, here=_here(runs, base, base),
                    seeds_needed=_seeds_needed(open_, min_seeds), open=[v.setting for v in open_])
    if open_:
        few = [v for v in open_ if v.verdict == TOO_FEW]
        head = few[0].reason if few else "the seeds cannot tell yet"
        return said(None, None, f"no decision: {head}. " + "; ".join(
            f"{v.setting}: {v.verdict}" for v in open_), False, verdicts=kept,
            seeds_needed=_seeds_needed(open_, min_seeds), open=[v.setting for v in open_])
    if not found:
        return said(base["run_id"], base["label"], f"keep {title}: the sweep has no compressed "
                    "setting", True, base_bytes, base_loss, kept, here=_here(runs, base, base))
    return said(base["run_id"], base["label"],
                f"keep {title}: no setting that sends fewer bytes is as good within {tolerance_pct:g}% "
                f"of its loss {base_loss:.4g} ({'; '.join(f'{v.setting}: {v.verdict}' for v in found)}); "
                "raise the tolerance X (--tolerance-pct), or try settings that compress less", True, base_bytes, base_loss, kept,
                here=_here(runs, base, base))


def _seeds_needed(open_: list[Verdict], min_seeds: int) -> int | None:
    """The seeds per setting that would decide the open verdicts that seeds can decide."""
    needed = [min_seeds if v.verdict == TOO_FEW else v.seeds_needed for v in open_ if v.verdict != INCOMPLETE]
    return max((n for n in needed if n), default=None)


def _here(runs, chosen, base) -> str | None:
    """What the chosen setting costs on the cluster the runs table was priced for (its ``cluster``
    column): the time to the target loss the what-if model predicts, the baseline's beside it, and
    the setting's break-even (``commlab.tune.payoff``, its ``pays``).  None without a cluster."""
    from commlab.analysis.units import seconds

    cluster = runs["cluster"].dropna() if "cluster" in runs else ()
    goal = runs["target"].dropna() if "target" in runs else ()
    if not len(cluster) or not len(goal):
        return None
    title = baselines.title(against(runs))

    def to_target(row) -> str:
        t = row["reach_predicted_s"]
        return f"in {seconds(t)} predicted" if _finite(t) else "not within its steps"

    head = f"on {cluster.iloc[0]}: {chosen['label']} reaches the target loss {goal.iloc[0]:.4g} {to_target(chosen)}"
    if chosen["label"] == base["label"]:
        return head
    pays = f"; it {chosen['pays']}" if chosen.get("pays") else ""
    return f"{head}, {title} {to_target(base)}{_per_step(chosen, title)}{pays}"


def _per_step(chosen, title: str) -> str:
    """The chosen setting's predicted step time against the baseline's (medians over the seeds),
    saying so when it is slower there: it was chosen on loss and bytes, not on time."""
    from commlab.analysis.units import seconds

    mine, theirs = chosen.get("step_s"), chosen.get("baseline_step_s")
    if not (_finite(mine) and _finite(theirs)):
        return ""
    if mine > theirs:
        return (f"; but per step it is predicted SLOWER there than {title}: {seconds(mine)} against "
                f"{seconds(theirs)} (chosen on loss and bytes)")
    return f"; per step {seconds(mine)} predicted against {title}'s {seconds(theirs)}"
