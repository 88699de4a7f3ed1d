"""A run's figures, defined once: which steps are steady, and what is read from a run's step records.

Rank 0 writes one record per step (``metrics.jsonl``: step, loss, step_s, and when instrumented
hook_s, payload_bytes, collectives, ...).  Not every step shows the run as configured:

- step 0 runs on DDP's first bucket layout and pays for lazy initialization; step 1 rebuilds the
  buckets (DDP does it once, in the second iteration's forward, from the order gradients arrived
  in the first); step 2 lets caches and the allocator settle.  So ``WARMUP_STEPS`` = 3.
- a hook that starts late (its spec's ``starts``) is a plain allreduce before that step: PowerSGD
  before ``start_powerSGD_iter`` (``PowerSGDState.iter`` counts steps from 0), post-local SGD
  before ``start_localSGD_iter``.
- a step whose loss is not finite (a diverging run) measures nothing.

The steps from ``first_steady_step`` on, with a finite loss, are a run's steady steps; its
headline figures (``headline``) are medians over them.  This module imports nothing heavy: the
hooks' instrumentation, on every step's hot path, reads ``relative_error`` from here.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from commlab.hook_specs import spec_of

WARMUP_STEPS = 3


def first_steady_step(cfg: dict, warmup: int = WARMUP_STEPS) -> int:
    """The first step past ``warmup`` start-up steps and past the step the hook starts at (its
    spec's ``starts``: PowerSGD already compressing, post-local SGD already local)."""
    spec = spec_of(cfg)
    if spec is not None and spec.starts:
        return max(warmup, cfg.get(spec.starts, 0))
    return warmup


def steady_rows(records: Sequence[dict], cfg: dict, warmup: int = WARMUP_STEPS) -> list[dict]:
    """A run's steady steps (see the module's docstring); empty while it has none."""
    first = first_steady_step(cfg, warmup)
    return [r for r in records if is_steady(r, first)]


def is_steady(record: dict, first: int) -> bool:
    """Whether a step record is steady, ``first`` being ``first_steady_step``'s answer."""
    return record["step"] >= first and math.isfinite(record.get("loss", 0.0))


class Columns:
    """Step records kept as columns as they come (NumPy arrays grown in place, doubling; None as
    NaN): the medians and sums below then cost what NumPy's do, not a pass over every record's
    dict, which a live view pays twice a second at step 100,000."""

    def __init__(self, keys: tuple[str, ...]):
        self.keys, self._data, self._n = keys, {}, 0

    def extend(self, records: Sequence[dict]) -> None:
        import numpy as np

        if not records:
            return
        if not self._data:  # every record has the first one's fields (store.step_check)
            self._data = {k: np.empty(1024, dtype=np.int64 if k == "step" else float)
                          for k in self.keys if k in records[0]}
        n = self._n + len(records)
        for k, column in self._data.items():
            if n > len(column):
                column = self._data[k] = np.resize(column, max(n, 2 * len(column)))
            column[self._n:n] = [np.nan if r.get(k) is None else r[k] for r in records]
        self._n = n

    def __len__(self) -> int:
        return self._n

    def has(self, key: str) -> bool:
        return key in self._data

    def column(self, key: str):
        return self._data[key][:self._n]

    def arrays(self) -> dict:
        return {k: self.column(k) for k in self._data}


def _has(rows: Sequence[dict] | Columns, key: str) -> bool:
    return rows.has(key) if isinstance(rows, Columns) else key in rows[0]


def _total(rows: Sequence[dict] | Columns, key: str) -> float:
    return float(rows.column(key).sum()) if isinstance(rows, Columns) else sum(r[key] for r in rows)


def median(rows: Sequence[dict] | Columns, key: str) -> float | None:
    """The median of one field over rows (records, or ``Columns``); None without rows or when the
    rows lack the field (``payload_bytes`` and the other instrument fields of a run that was not
    instrumented)."""
    if not rows or not _has(rows, key):
        return None
    if isinstance(rows, Columns):
        import numpy as np

        return float(np.median(rows.column(key)))
    return statistics.median(r[key] for r in rows)


def final_loss(records: Sequence[dict], window: int = 1) -> float | None:
    """The mean loss of the last ``window`` steps; 1: the loss the run ended at.  A diverged run's
    is not finite, on purpose: comparisons leave it out on that."""
    tail = [r["loss"] for r in records[max(len(records) - window, 0):]]
    return sum(tail) / len(tail) if tail else None


def averages_model(cfg: dict) -> bool:
    """Whether a stored config's hook averages the model every period (post-local SGD, DiLoCo)."""
    spec = spec_of(cfg)
    return spec is not None and spec.averages_parameters


def averaging_period(cfg: dict) -> int:
    """Steps between two model averagings of a hook that averages the model (post-local SGD,
    DiLoCo); 1 for every other hook."""
    spec = spec_of(cfg)
    return cfg.get(spec.averaging.period, 1) if spec is not None and spec.averages_parameters else 1


def averaging_from(cfg: dict) -> int:
    """The first step of the first averaging period: post-local SGD's first step with averaging on
    (its spec's ``averaging.first_step``; its local steps start there too, which ``first_steady_step``
    counts); 0 for hooks that average nothing or from the start (DiLoCo)."""
    spec = spec_of(cfg)
    return cfg.get(spec.averaging.first_step, 0) if averages_model(cfg) and spec.averaging.first_step else 0


def _values(rows: Sequence[dict] | Columns, key):
    """One field of every row as a NumPy array (of records, also a function of a row)."""
    import numpy as np

    if isinstance(rows, Columns):
        return rows.column(key)
    return np.fromiter((key(r) if callable(key) else r[key] for r in rows), float, len(rows))


def _periods(rows: Sequence[dict] | Columns, cfg: dict):
    """Each row's averaging period (0, 1, ... counted from ``averaging_from``; -1 before it), and
    how many rows each period holds: a whole one holds ``averaging_period`` (one averaging, its
    first step, and every step after it)."""
    import numpy as np

    steps = _values(rows, "step") - averaging_from(cfg)
    index = np.where(steps >= 0, steps // averaging_period(cfg), -1).astype(np.int64)
    return index, np.bincount(index[index >= 0], minlength=1)


def in_whole_periods(rows: Sequence[dict] | Columns, cfg: dict):
    """Which rows lie in a whole averaging period (a boolean NumPy array); every row for a hook
    that averages nothing."""
    import numpy as np

    period = averaging_period(cfg)
    if period == 1:
        return np.ones(len(rows), dtype=bool)
    index, counts = _periods(rows, cfg)
    return (index >= 0) & (counts[np.maximum(index, 0)] == period)


def per_step(rows: Sequence[dict] | Columns, cfg: dict, key) -> float | None:
    """A per-step figure of ``key`` (a field, or a function of a record) over steady rows: their
    median; with model averaging, the median over whole periods of each period's mean (a median
    of steps would leave out the one step in a period that averages; the median of periods keeps
    a load spike in one from counting, as the median of steps does elsewhere).  None without a
    row, or without a whole period."""
    import numpy as np

    values, period = _values(rows, key), averaging_period(cfg)
    if period == 1:
        return float(np.median(values)) if len(values) else None
    index, counts = _periods(rows, cfg)
    sums = np.bincount(index[index >= 0], weights=values[index >= 0], minlength=len(counts))
    whole = counts == period
    return float(np.median(sums[whole] / period)) if whole.any() else None


def headline(records: Sequence[dict], cfg: dict, final_window: int = 1,
             bytes_over_run: bool = False, steady: Sequence[dict] | Columns | None = None) -> dict:
    """A run's final_loss (``final_loss`` over ``final_window`` steps), median_step_s and
    bytes_per_step (medians over its steady steps; for a hook that averages the model every
    period, ``per_step``'s median over whole periods, or the mean step before a whole period),
    and steady_steps, how many those are.

    A run with no steady step yet (young, or too short for PowerSGD to have compressed) is read
    from every step it has: a live view shows numbers from its first step on, and they settle as
    steady steps come in (steady_steps 0 says they have not yet).  ``bytes_over_run`` divides all
    the bytes the hook handed over by all the steps instead: PowerSGD's allreduce steps before
    ``start_powerSGD_iter`` then count, as they must where that setting is compared (a sweep).
    ``steady``: ``steady_rows(records, cfg)`` when the caller keeps them (a live view, as
    ``Columns`` of step_s, payload_bytes and plain_bytes as they come).
    """
    steady = steady_rows(records, cfg) if steady is None else steady
    rows = steady or list(records)
    if bytes_over_run:
        nbytes = (sum(r.get("payload_bytes", 0) for r in records) / len(records)
                  if records and "payload_bytes" in records[0] else None)
    elif averages_model(cfg) and rows and _has(rows, "payload_bytes"):
        # One step in a period averages the model (post-local SGD, DiLoCo): the median step sends
        # none of it, a whole period's mean step its share (a steady window that starts or ends
        # inside a period would count its averaging too often or too seldom).
        nbytes = per_step(rows, cfg, "payload_bytes")
        nbytes = _total(rows, "payload_bytes") / len(rows) if nbytes is None else nbytes
    else:
        nbytes = median(rows, "payload_bytes")
    return {"final_loss": final_loss(records, final_window), "median_step_s": median(rows, "step_s"),
            "bytes_per_step": nbytes, "steady_steps": len(steady)}


# A run has three compression ratios; each is defined once, here or in commlab.analysis.rule, and
# every page and command names it with these words.
CUMULATIVE_RATIO = "compression ratio so far"  # the worker's plain / sent bytes over every step
STEADY_RATIO = "steady-state compression ratio"  # ``steady_compression_ratio``
PREDICTED_RATIO = "predicted compression ratio"  # ``rule.RuleSummary.predicted_ratio``, shapes alone


def cumulative_compression_ratio(records: Sequence[dict]) -> float | None:
    """What plain allreduce would have sent over what the hook sent, summed over every step so far,
    warm-up and PowerSGD's allreduce steps included (the ``compression_ratio`` field rank 0 writes
    with each step): it climbs towards the steady-state ratio as a run goes."""
    return records[-1].get("compression_ratio") if records else None


def steady_compression_ratio(records: Sequence[dict], cfg: dict,
                             steady: Sequence[dict] | Columns | None = None) -> float | None:
    """Plain over sent bytes summed over the steady steps only: the ratio the hook runs at. For
    the per-tensor PowerSGD hook it equals the rule's prediction from the shapes (both count P
    and Q, (n + m)·r elements, for a compressed tensor and every element of the others); the
    batched hook compresses a whole bucket as one padded square matrix instead, so its ratio
    differs.  For a hook that averages the model every period (post-local SGD, DiLoCo) the sums
    keep to whole periods (``in_whole_periods``), as ``per_step`` does: a window that starts or
    ends inside one counts its averaging too often or too seldom; before a whole period, every
    steady step.  None without steady steps or instrumentation.  ``steady``: as ``headline``'s."""
    steady = steady_rows(records, cfg) if steady is None else steady
    if not steady or not _has(steady, "plain_bytes"):
        return None
    whole = in_whole_periods(steady, cfg) if averages_model(cfg) else None
    if whole is not None and whole.any():
        plain, sent = (float(_values(steady, k)[whole].sum()) for k in ("plain_bytes", "payload_bytes"))
    else:
        plain, sent = _total(steady, "plain_bytes"), _total(steady, "payload_bytes")
    return plain / sent if sent else None


def relative_error(approx, exact) -> float:
    """||approx - exact|| / ||exact|| of two tensors (0 when both are zero, inf when only exact is)."""
    denom = float(exact.norm())
    diff = float((approx - exact).norm())
    return diff / denom if denom > 0 else (0.0 if diff == 0 else float("inf"))
