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


def eta(fraction: float, since: dict | None) -> float | None:
    """Seconds left: the time this execution took per share of the sweep, times the share left.
    ``since``: when the execution began (``time``) and how far the sweep was then (``fraction``)."""
    if not since:
        return None
    done = fraction - since.get("fraction", 0.0)
    if done <= 0.01:
        return None
    return (time.time() - since["time"]) / done * (1 - fraction)
