"""A sweep's plan: the axes a hook varies, the spec (``SweepSpec``) and its grid of runs, checked
whole before anything starts."""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

from commlab.config import ConfigError, RunConfig, Setting, label_of, own_settings, settings
from commlab.hook_specs import BASELINE, HOOKS
from commlab.tune import baseline as baselines
from commlab.tune import pareto

DEFAULT_REPEATS = pareto.MIN_SEEDS  # the fewest seeds the recommendation decides with
DEFAULT_TOLERANCE_PCT = 5.0
MAX_REPEATS = 100
# The budget of sequential seeds: an open verdict gets one more seed at a time up to this many.  Five
# halves the 3 seeds' t-interval (its half-width goes as t(n-1)/sqrt(n): 2.48 at 3, 1.24 at 5) for
# at most two more rounds of the open settings and the baseline.
DEFAULT_MAX_REPEATS = 5


# The sweep axes: the settings the table marks sweepable (``sweep=``), in its order, the compress
# wrapper last.  Which of them a hook varies is read off its spec (``hook_axes``): no list here.
AXES = tuple(sorted((s for s in settings() if s.sweepable), key=lambda s: s.group == "hook"))
DEFAULT_HOOK = "powersgd"  # what a sweep of plain allreduce, the baseline itself, varies instead
SWEPT_HOOKS = tuple(h for h in HOOKS if h != BASELINE)  # the hooks a sweep may name


@functools.cache
def hook_axes(hook: str) -> tuple[Setting, ...]:
    """The axes a sweep of ``hook`` varies, in the grid's order: the sweepable settings it reads
    (``config.own_settings``); () for a name that is no hook."""
    own = {s.name for s in own_settings(hook)}
    return tuple(s for s in AXES if s.name in own)


def axis_hooks(name: str) -> list[str]:
    """The hooks a sweep varies this axis of (plain allreduce is the baseline, not swept)."""
    return [h for h in SWEPT_HOOKS if any(s.name == name for s in hook_axes(h))]


# The job's axes: the sweepable settings no hook reads (``sharding``).  They change how every run
# trains, so the whole grid, the baselines included, runs at each of their values: a sweep of PowerSGD
# between HSDP's replicas over sharding fsdp,hsdp runs FSDP and plain HSDP beside it.
JOB_AXES = tuple(s for s in AXES if not axis_hooks(s.name))


@dataclass(init=False)
class SweepSpec:
    """The grid: every combination of the values listed per axis of the hook swept, each on top of
    ``base``.

    The hook swept is base's (``hook``); plain allreduce, the baseline itself and RunConfig's
    default, sweeps PowerSGD.  Its axes (``hook_axes``) take the table's values unless told (the
    rank: 1, 2, 4; top-k's compress_ratio: 0.001, 0.01, 0.1), else base's value.  Values given
    for another hook's axis are kept, and refused by the grid.  ``SweepSpec(base=RunConfig(
    hook="topk"), compress_ratio=[0.01, 0.05])`` names the axes as RunConfig names the settings.
    """

    base: RunConfig
    values: dict[str, list]  # axis -> the values listed, by AXES: the hook's, and any others given
    baseline: bool  # run the baselines first, with the same job and link
    tolerance_pct: float  # the recommendation's X
    repeats: int  # seeds per setting: base.seed, base.seed + 1, ...
    against: str  # the baseline judged against (``commlab.tune.baseline``); a 16-bit one runs after fp32's
    max_repeats: int  # sequential seeds: an open verdict's setting gets seeds one at a time up to this many
    added: list[list[int]]  # runs planned after the grid's seeds: [setting's index in a seed, seed], in order

    def __init__(self, base: RunConfig | None = None, baseline: bool = True,
                 tolerance_pct: float = DEFAULT_TOLERANCE_PCT, repeats: int = DEFAULT_REPEATS,
                 against: str = baselines.DEFAULT, max_repeats: int = DEFAULT_MAX_REPEATS,
                 added: list | None = None, **values: list):
        unknown = sorted(set(values) - {s.name for s in AXES})
        if unknown:
            raise TypeError(f"not a sweep axis: {', '.join(unknown)}; the axes are: "
                            f"{', '.join(s.name for s in AXES)}")
        self.base = RunConfig() if base is None else base
        own = {s.name for s in hook_axes(self.hook)}
        self.values = {s.name: list(values.get(s.name, s.sweep)) for s in AXES
                       if s.name in own or values.get(s.name)}
        self.baseline, self.tolerance_pct, self.repeats = baseline, tolerance_pct, repeats
        self.against, self.max_repeats = against, max_repeats
        self.added = [list(pair) for pair in added or ()]

    @property
    def hook(self) -> str:
        """The hook swept."""
        return DEFAULT_HOOK if self.base.hook == BASELINE else self.base.hook

    def job_axes(self) -> dict[str, list]:
        """The job's axes given (``JOB_AXES``), repeats dropped; {} when none is."""
        return {s.name: _unique(self.values[s.name]) for s in JOB_AXES if self.values.get(s.name)}

    def jobs(self) -> list[dict]:
        """Each combination of the job's axes, in the order given ([{}] without any): the grid
        runs the baselines at each, the hook's settings at each where the settings let the hook run
        (``runs_hook``).  The first job's baseline is the one the others are judged against."""
        job = self.job_axes()
        return [dict(zip(job, values)) for values in itertools.product(*job.values())]

    def runs_hook(self, job: dict) -> bool:
        """Whether the settings table lets the hook swept run at ``job`` (FSDP has no all-reduce
        between replicas for one): its rules, not a list here, say so."""
        return "hook" not in self.base.with_overrides(hook=self.hook, **job).errors()

    def axes(self) -> dict[str, list]:
        """The hook's axes with their values, repeats dropped; an axis with no table values falls
        back to base's."""
        return {s.name: _unique(self.values[s.name]) or ([] if s.sweep else [getattr(self.base, s.name)])
                for s in hook_axes(self.hook)}

    def to_dict(self) -> dict:
        return {"base": self.base.to_dict(), **self.values, "baseline": self.baseline,
                "tolerance_pct": self.tolerance_pct, "repeats": self.repeats, "against": self.against,
                "max_repeats": self.max_repeats, "added": self.added}

    def seeds(self) -> list[int]:
        """The grid's seeds, which every setting runs with (``added`` runs come after them)."""
        return [self.base.seed + k for k in range(self.repeats)]

    def several_seeds(self) -> bool:
        return self.repeats > 1 or any(seed != self.base.seed for _, seed in self.added)

    @classmethod
    def from_dict(cls, data: dict) -> SweepSpec:
        """A stored plan; ConfigError for a baseline that is none (a plan is read back checked)."""
        baselines.check(data.get("against", baselines.DEFAULT))
        return cls(**{**data, "base": RunConfig.from_dict(data["base"], "sweep base settings")})


def parse_list(text: str | None, kind: type, name: str) -> list:
    """'1,2,4' -> [1, 2, 4]; raises ConfigError naming the field."""
    if text is None:
        return []
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    try:
        return [kind(t) for t in items]
    except ValueError:
        raise ConfigError({name: f"must be a comma-separated list of {kind.__name__} values, "
                                 f"got {text!r}"}) from None


AXIS_TYPES = {"int": int, "float": float, "str": str}  # the kinds a sweep axis may be


def axis_values(axis: Setting, text: str | None) -> list:
    """One axis' values from comma-separated text (the CLI's, the page's)."""
    return parse_list(text, AXIS_TYPES[axis.kind], axis.name)


def _unique(values) -> list:
    return list(dict.fromkeys(values))


def grid(spec: SweepSpec) -> list[RunConfig]:
    """Every run of the sweep in order, seed by seed, the baseline first in each; raises
    ConfigError before anything starts."""
    errs: dict[str, str] = {}
    hook, axes = spec.hook, spec.axes()
    if hook not in HOOKS:
        errs["hook"] = f"unknown hook {hook!r}; valid hooks are: {', '.join(HOOKS)}"
    for name, values in axes.items():
        if not values:
            errs[name] = "give at least one value"
    job_axes = spec.job_axes()
    for name in spec.values.keys() - axes.keys() - job_axes.keys():
        errs[name] = _not_an_axis(name, hook)
    for s in AXES:
        bad = [v for v in {**axes, **job_axes}.get(s.name, []) if s.choices and v not in s.choices]
        if bad:
            errs[s.name] = f"unknown {s.name}(s) {bad}; valid {s.name}s are: {', '.join(s.choices)}"
    if not (math.isfinite(spec.tolerance_pct) and spec.tolerance_pct >= 0):
        errs["tolerance_pct"] = f"must be 0 or a positive percentage, got {spec.tolerance_pct}"
    for name in ("repeats", "max_repeats"):
        n = getattr(spec, name)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_REPEATS:
            errs[name] = (f"must be a whole number of seeds from 1 to {MAX_REPEATS} (3 or more let "
                          f"the recommendation tell a difference from seed noise), got {n!r}")
    # The job's own problems are named beside the grid's, all at once, each once: as the
    # field's, not as the first setting's; a setting's, for that setting.
    try:
        if baselines.check(spec.against) == hook:
            errs["against"] = (f"{hook} is the hook swept: judged against itself every setting would "
                               f"tie; judge it against another of {', '.join(baselines.BASELINES)}")
    except ConfigError as e:
        errs |= e.errors
    errs = {**spec.base.with_overrides(hook=BASELINE, wrapper="none").errors(), **errs}
    # fp32 allreduce first in every seed (and job): it calibrates the what-if model and prices
    # PowerSGD's allreduce steps; a 16-bit baseline after it.
    one_seed, jobs = [], spec.jobs() if not errs.keys() & job_axes.keys() else [{}]
    for job in jobs:
        one_seed += [spec.base.with_overrides(hook=b, wrapper="none", **job) for b in baseline_hooks(spec)]
        if not spec.runs_hook(job):
            continue
        for combination in itertools.product(*axes.values()):
            try:
                one_seed.append(spec.base.with_overrides(hook=hook, **job, **dict(zip(axes, combination))))
            except ConfigError as e:  # a value of the wrong type, given through the API
                errs = {**e.errors, **errs}
    for name, values in job_axes.items():
        if name not in errs and not any(spec.runs_hook(job) for job in jobs):
            why = spec.base.with_overrides(hook=hook, **jobs[0]).errors()["hook"]
            errs[name] = (f"{hook} runs at none of {', '.join(map(str, values))} ({why}): list a value "
                          "where it runs beside them")
    for cfg in one_seed:
        for key, msg in cfg.errors().items():
            errs.setdefault(key, f"{label_of(cfg.to_dict(), link=True)}: {msg}")
    if errs:
        raise ConfigError(errs)
    if any(not 0 <= k < len(one_seed) for k, _ in spec.added):
        raise ConfigError({"added": f"names a setting the grid has not: it has {len(one_seed)} per seed"})
    configs = [cfg.with_overrides(seed=seed) for seed in spec.seeds() for cfg in one_seed] + \
        [one_seed[k].with_overrides(seed=seed) for k, seed in spec.added]
    for cfg in configs[len(one_seed):]:
        for key, msg in cfg.errors().items():
            errs.setdefault(key, f"seed {cfg.seed}: {msg}")
    if errs:
        raise ConfigError(errs)
    return configs


def baseline_hooks(spec: SweepSpec) -> list[str]:
    """The baselines each seed runs first, in order: fp32 allreduce, then a 16-bit one judged against."""
    return [b for b in dict.fromkeys((BASELINE, spec.against)) if b in baselines.BASELINES] \
        if spec.baseline else []


def per_seed(spec: SweepSpec) -> int:
    """How many settings (the baselines included) the grid runs with each seed."""
    return (len(grid(spec)) - len(spec.added)) // spec.repeats


def missing(spec: SweepSpec, repeats: int) -> list[list[int]]:
    """[setting index, seed] of each run the plan lacks for ``repeats`` seeds per setting, seed by seed."""
    settings = range(per_seed(spec))
    planned = {(k, seed) for seed in spec.seeds() for k in settings} | {tuple(pair) for pair in spec.added}
    return [[k, seed] for seed in range(spec.base.seed, spec.base.seed + repeats)
            for k in settings if (k, seed) not in planned]


def more_seeds(spec: SweepSpec, repeats: int) -> list[RunConfig]:
    """The plan of ``spec`` with ``repeats`` seeds per setting: the runs it lacks for them appended
    to ``spec.added`` (every run planned keeps its place); ConfigError for none lacking."""
    lacking = missing(spec, repeats)
    if not lacking:
        raise ConfigError({"repeats": f"the sweep already plans {repeats} seed(s) per setting or more: "
                                      "give more to add seeds, or leave --repeats out"})
    spec.added += lacking
    return grid(spec)


def next_seed(spec: SweepSpec, settings: list[int]) -> list[RunConfig]:
    """The plan of ``spec`` with one more seed for the settings at these indices (in a seed's
    order, the baselines among them), appended to ``spec.added``: the sequential seeds."""
    seed = max([*spec.seeds(), *(s for _, s in spec.added)]) + 1
    spec.added += [[k, seed] for k in sorted(settings)]
    return grid(spec)


def _not_an_axis(name: str, hook: str) -> str:
    own = ", ".join(s.name for s in hook_axes(hook)) or "none"
    why = ("no compress wrapper may wrap it" if name == "wrapper"
           else f"{hook} does not read {name}, so every value would run alike")
    return (f"is not an axis of {hook}: {why}; it is an axis of {', '.join(axis_hooks(name))} "
            f"(sweep one of those as the hook); {hook}'s axes are: {own}")


def plan_label(cfg: RunConfig, spec: SweepSpec) -> str:
    """A run's name in the plan and the progress line: its setting, and its seed when there are several."""
    return label_of(cfg.to_dict(), link=True, seed=spec.several_seeds())

