"""Where a sweep stands: the current run, its step, the time left."""
from __future__ import annotations

import time
from dataclasses import dataclass

from commlab.engine.run_state import RunStatus


@dataclass
class Progress:
    index: int  # the current run, from 0
    total: int
    label: str
    run_status: str  # "starting" or the current run's status
    step: int  # steps the current run has completed
    steps: int
    sweep_status: str
    eta_s: float | None = None  # time left at the pace of this execution so far
    estimate: str | None = None  # the sweep's first estimate (``Estimate.line``), in the report made as it comes

    @property
    def fraction(self) -> float:
        done = self.index + (min(self.step, self.steps) / self.steps if self.steps else 0.0)
        return min(1.0, done / self.total) if self.total else 1.0

    def line(self) -> str:
        going = self.eta_s is not None and self.run_status in (RunStatus.STARTING, RunStatus.RUNNING)
        left = f", about {_duration(self.eta_s)} left" if going else ""
        return (f"[{self.index + 1}/{self.total}] {self.label}: {self.run_status}, "
                f"step {self.step}/{self.steps}{left}")


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def eta(fraction: float, since: dict | None, least: float = 0.01) -> float | None:
    """Seconds left: the time this execution took per share of the sweep, times the share left;
    None before ``least`` of it is done.  ``since``: when the execution began (``time``) and how far
    the sweep was then (``fraction``); once its first run has ended, when (``paced``) and how far
    (``paced_fraction``): the pace from there leaves out the pool's start-up, paid once."""
    if not since:
        return None
    done = fraction - since.get("paced_fraction", since.get("fraction", 0.0))
    if done <= least:
        return None
    return (time.time() - since.get("paced", since["time"])) / done * (1 - fraction)


@dataclass
class Estimate:
    """What the sweep will take, as its first two runs timed it: the first, which carries the pool's
    start-up, then every other run at the second's time (the second run is the first of the hook
    swept, as most runs are); ``most_s``: were the seeds unable to tell, with every setting seeded up
    to the budget (the sequential seeds run only the open settings and the baselines: this bounds them)."""

    runs: int
    first_s: float  # from the sweep's start to its first run's end
    run_s: float  # from the first run's end to the second's
    most_runs: int

    @property
    def total_s(self) -> float:
        return self.first_s + (self.runs - 1) * self.run_s

    @property
    def most_s(self) -> float:
        return self.first_s + (self.most_runs - 1) * self.run_s

    def line(self, max_repeats: int) -> str:
        more = (f"; at most {_duration(self.most_s)} if the seeds cannot tell and it seeds the open "
                f"settings up to {max_repeats} seeds (--max-repeats)") if self.most_runs > self.runs else ""
        return (f"estimate: about {_duration(self.total_s)} for its {self.runs} runs (the first took "
                f"{self.first_s:.1f} s with the start-up, the second {self.run_s:.1f} s){more}")
