"""Does a setting pay here?  The link bandwidth at which it starts (or stops) beating the baseline
in step time, on a named world size and latency, by the what-if model (pure).

Agarwal et al. (MLSys 2022) found that compression beat well-tuned synchronous SGD in only 6 of
more than 200 realistic setups: whether it pays depends on the cluster.  ``payoff`` answers for one
setting against the baseline (``commlab.tune.baseline``) from the two profiles' own step-time
function (``HookProfile.step_s``): it solves where the two curves cross, with scipy's ``brentq`` on
a log scale of bandwidth between ``LOWEST_GBPS`` and ``HIGHEST_GBPS``.  The model is linear in
1/bandwidth (compute and arithmetic, plus latencies, plus bytes over bandwidth), so the curves cross
once at most: below the crossing the side that sends fewer bytes wins.  No crossing in that range
is "always" (faster at every bandwidth) or "never at this size" (no faster at any); a setting that
sends more bytes but pays fewer latencies (an allgather against a ring allreduce) can win *above*
its crossing, and the sentence says so.

The Compare and Sweep pages, ``commlab compare``, ``commlab sweep`` and the What-if page ask it.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from commlab.tune import baseline as baselines
from commlab.tune.whatif import HookProfile

LOWEST_GBPS, HIGHEST_GBPS = 1e-3, 1e6  # 1 Mb/s to 1 Pb/s: "every bandwidth" means these and all between
BELOW, ABOVE, ALWAYS, NEVER, ITSELF = "below", "above", "always", "never", "baseline"


@dataclass(frozen=True)
class Payoff:
    """Where ``label`` beats the baseline ``against`` in step time on ``world_size`` workers."""

    label: str
    against: str  # a baseline's name (``baseline.BASELINES``)
    world_size: int
    latency_us: float
    verdict: str  # BELOW, ABOVE, ALWAYS, NEVER, or ITSELF (it is the baseline's own run)
    break_even_gbps: float | None = None  # where the curves cross (BELOW and ABOVE); over seeds, the median
    # Over several seeds (``over_seeds``): how many, how many give the verdict, their break-evens' range.
    seeds: int = 1
    agree: int = 1
    low_gbps: float | None = None
    high_gbps: float | None = None

    def sentence(self) -> str:
        """What it does, as a verb phrase ("beats fp16 allreduce in step time on links below ...")."""
        base = baselines.title(self.against)
        where = f"{self.world_size} workers, {self.latency_us:g} µs per hop"
        if self.verdict == ITSELF:
            return f"is the baseline ({base})"
        others = (f"; {self.seeds - self.agree} of {self.seeds} seeds say otherwise"
                  if self.agree < self.seeds else "")
        if self.verdict == ALWAYS:
            return f"always beats {base} in step time, at every bandwidth ({where}){others}"
        if self.verdict == NEVER:
            return f"never beats {base} in step time at this size, at any bandwidth ({where}){others}"
        spread = (f", median of {self.agree} seeds: {self.low_gbps:.3g} to {self.high_gbps:.3g} Gb/s"
                  if self.agree > 1 else "")
        return (f"beats {base} in step time on links {self.verdict} {self.break_even_gbps:.3g} Gb/s "
                f"({where}{spread}){others}")

    def to_dict(self) -> dict:
        return {**asdict(self), "sentence": self.sentence()}


def payoff(base: HookProfile, other: HookProfile, world_size: int, latency_us: float,
           against: str = baselines.DEFAULT) -> Payoff:
    """``other`` against ``base`` (the profile of a run of baseline ``against``) on ``world_size``
    workers with ``latency_us`` per hop."""
    from scipy.optimize import brentq

    said = dict(label=other.label, against=against, world_size=world_size, latency_us=latency_us)
    if other is base or (base.run_id and other.run_id == base.run_id):
        return Payoff(**said, verdict=ITSELF)

    def gain(log_gbps: float) -> float:
        """Seconds per step ``other`` saves over the baseline at 10**log_gbps Gb/s."""
        bw = 10.0 ** log_gbps
        return base.step_s(world_size, bw, latency_us) - other.step_s(world_size, bw, latency_us)

    lo, hi = math.log10(LOWEST_GBPS), math.log10(HIGHEST_GBPS)
    slow, fast = gain(lo) > 0, gain(hi) > 0
    if slow == fast:
        return Payoff(**said, verdict=ALWAYS if slow else NEVER)
    crossing = 10.0 ** brentq(gain, lo, hi, xtol=1e-12)
    return Payoff(**said, verdict=BELOW if slow else ABOVE, break_even_gbps=crossing)


def over_seeds(each: Sequence[Payoff]) -> Payoff | None:
    """One setting's answer over its seeds (each against its own seed's baseline): the verdict most
    seeds give, the median break-even of the seeds that give it and their range; None for none."""
    if not each:
        return None
    verdict, agree = collections.Counter(p.verdict for p in each).most_common(1)[0]
    evens = sorted(p.break_even_gbps for p in each if p.verdict == verdict and p.break_even_gbps is not None)
    return dataclasses.replace(each[0], verdict=verdict, seeds=len(each), agree=agree,
                               break_even_gbps=statistics.median(evens) if evens else None,
                               low_gbps=evens[0] if evens else None, high_gbps=evens[-1] if evens else None)


def by_setting(profiles: Sequence[HookProfile], world_size: int, latency_us: float,
               against: str = baselines.DEFAULT) -> list[Payoff]:
    """Where each setting (``HookProfile.setting``) beats the baseline ``against`` on ``world_size``
    workers, over its seeds (``over_seeds``): each seed's profile against its own seed's baseline
    run, else the first baseline run's; [] without one."""
    bases = [p for p in profiles if baselines.is_baseline(p.to_dict(), against)]
    if not bases:
        return []
    of_seed = {p.seed: p for p in reversed(bases)}  # the first of each seed
    settings: dict[str, list[HookProfile]] = {}
    for p in profiles:
        if not baselines.is_baseline(p.to_dict(), against):
            settings.setdefault(p.setting or p.label, []).append(p)
    return [dataclasses.replace(over_seeds([payoff(of_seed.get(p.seed, bases[0]), p, world_size, latency_us, against)
                                            for p in seeds]), label=name)
            for name, seeds in settings.items()]


def speedup(base: HookProfile, other: HookProfile, world_size: int, bandwidth_gbps: float,
            latency_us: float) -> float | None:
    """The baseline's predicted step time over ``other``'s: above 1, ``other`` is faster."""
    own = other.step_s(world_size, bandwidth_gbps, latency_us)
    return base.step_s(world_size, bandwidth_gbps, latency_us) / own if own > 0 else None


def judged(base: HookProfile | None, other: HookProfile | None, cluster, against: str) -> dict:
    """A setting's row on ``cluster`` (a ``quality.Cluster``): whether it pays (the sentence; the
    ``Payoff`` itself, for ``over_seeds``), its break-even, its speed-up over the baseline and both
    predicted step times there; blanks without both profiles."""
    if base is None or other is None:
        return {"pays": None, "verdict": None, "break_even_gbps": None, "speedup": None, "step_s": None,
                "baseline_step_s": None, "payoff": None}
    pays = payoff(base, other, cluster.world_size, cluster.latency_us, against)
    at = (cluster.world_size, cluster.bandwidth_gbps, cluster.latency_us)
    return {"pays": pays.sentence(), "verdict": pays.verdict, "break_even_gbps": pays.break_even_gbps,
            "speedup": speedup(base, other, *at), "step_s": other.step_s(*at),
            "baseline_step_s": base.step_s(*at), "payoff": pays}
