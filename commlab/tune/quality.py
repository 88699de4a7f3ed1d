"""A run's quality as a sweep compares it: its held-out loss curve, and where it first reaches a target (pure).

Held-out first: rank 0's evaluations (``RunFolder.evals()``: rows of step and loss, a final one
after the last step), on data no rank trains on, are what PyTorch's advice ("raise the rank until
a satisfactory accuracy is reached") asks for.  A run without evaluations (``eval_every`` 0, or
written before they existed) falls back to its training loss, averaged over ``WINDOW`` steps so
that one noisy batch does not decide, and every table says which basis it used.

Time to quality: the first curve point at or below the target, with what it took to get there:
the step, the measured training time, the time the what-if model predicts on the user's cluster
and the bytes the hook handed over, all summed over the steps up to it.
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from commlab.analysis import metrics

HELD_OUT, TRAINING = "held-out", "training"
WINDOW = 5  # the training-loss basis: mean over this many last steps
BASIS_TEXT = {HELD_OUT: "held-out loss (final evaluation)",
              TRAINING: f"training loss (mean of the last {WINDOW} steps: the run has no held-out "
                        "evaluations; set eval_every)"}


@dataclass(frozen=True)
class Curve:
    """A run's quality by step: held-out evaluations, or the training loss's running mean."""

    basis: str  # HELD_OUT or TRAINING
    steps: tuple[int, ...]
    loss: tuple[float, ...]
    accuracy: float | None = None  # the last evaluation's, where the workload reports one
    bits_per_char: float | None = None

    @property
    def final(self) -> float | None:
        return self.loss[-1] if self.loss else None


def curve(evals: Sequence[dict] | None, records: Sequence[dict], window: int = WINDOW) -> Curve:
    """The held-out curve when there are evaluations, else the training loss's mean over the
    ``window`` steps up to each step."""
    rows = [e for e in (evals or []) if e.get("loss") is not None]
    if rows:
        last = rows[-1]
        return Curve(HELD_OUT, tuple(int(e["step"]) for e in rows), tuple(float(e["loss"]) for e in rows),
                     last.get("accuracy"), last.get("bits_per_char"))
    losses = [float(r["loss"]) for r in records]
    means = [sum(losses[max(0, i + 1 - window):i + 1]) / min(window, i + 1) for i in range(len(losses))]
    return Curve(TRAINING, tuple(int(r["step"]) for r in records), tuple(means))


def diverged(c: Curve, records: Sequence[dict]) -> bool:
    """A loss that is not a finite number, held out or in training: the run cannot be compared."""
    return any(not math.isfinite(v) for v in c.loss) or any(
        not math.isfinite(float(r["loss"])) for r in records)


@dataclass(frozen=True)
class Reached:
    """Where a run first reached the target; all None when it never did."""

    step: int | None = None
    time_s: float | None = None  # measured training time to the end of that step
    predicted_s: float | None = None  # the what-if model's, on the chosen cluster
    bytes: float | None = None  # handed over by the hook, summed to that step


def reach(c: Curve, records: Sequence[dict], predicted_step_s: Sequence[float] | None,
          target: float) -> Reached:
    """The first curve point at or below ``target``; ``predicted_step_s``: one per record.  An
    evaluation counts what the steps up to it cost (the final one, after the last step, all)."""
    steps = [int(r["step"]) for r in records]
    nbytes = list(itertools.accumulate(float(r.get("payload_bytes") or 0.0) for r in records))
    predicted = list(itertools.accumulate(predicted_step_s)) if predicted_step_s else None
    for step, loss in zip(c.steps, c.loss):
        i = bisect.bisect_right(steps, step) - 1  # the last step trained before it
        if math.isfinite(loss) and loss <= target and i >= 0:
            return Reached(step, float(records[i]["t"]), predicted[i] if predicted else None,
                           nbytes[i] if "payload_bytes" in records[i] else None)
    return Reached()

@dataclass(frozen=True)
class Cluster:
    """The cluster a sweep's times are predicted for (``commlab.tune.whatif``'s model)."""

    world_size: int = 64
    bandwidth_gbps: float = 10.0
    latency_us: float = 5.0

    def text(self) -> str:
        return f"{self.world_size} workers, {self.bandwidth_gbps:g} Gb/s, {self.latency_us:g} µs"

    def errors(self) -> dict[str, str]:
        """Every problem, by field (the CLI's ``--predict-*`` names them so)."""
        errs = {}
        if not 2 <= self.world_size <= 1_000_000:
            errs["predict_world_size"] = f"must be 2 to 1,000,000 workers, got {self.world_size}"
        if not (math.isfinite(self.bandwidth_gbps) and self.bandwidth_gbps > 0):
            errs["predict_bandwidth_gbps"] = f"must be a positive number of Gb/s, got {self.bandwidth_gbps:g}"
        if not (math.isfinite(self.latency_us) and self.latency_us >= 0):
            errs["predict_latency_us"] = f"must be 0 or more µs, got {self.latency_us:g}"
        return errs


def plain_until(cfg: dict) -> int:
    """The steps a hook takes as plain allreduce, before the step its spec's ``starts`` names:
    PowerSGD's before ``start_powerSGD_iter``, post-local SGD's before ``start_localSGD_iter``
    (gradients allreduced over every rank); none for the others."""
    return metrics.first_steady_step(cfg, warmup=0)


def predicted_step_s(records: Sequence[dict], cfg: dict, profile, plain, cluster: Cluster) -> list[float] | None:
    """Each step's time on ``cluster`` by the what-if model: ``profile`` (the run's own
    ``HookProfile``) for its compressed steps, ``plain`` (the allreduce baseline's) for the plain
    allreduce steps before ``plain_until``; None without the profiles needed."""
    start = plain_until(cfg)
    need = ([profile] if any(r["step"] >= start for r in records) else []) + \
        ([plain] if any(r["step"] < start for r in records) else [])
    if not records or any(p is None for p in need):
        return None
    at = (cluster.world_size, cluster.bandwidth_gbps, cluster.latency_us)
    own, before = (profile.step_s(*at) if profile else None), (plain.step_s(*at) if plain else None)
    return [own if r["step"] >= start else before for r in records]
