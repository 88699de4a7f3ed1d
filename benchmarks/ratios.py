"""The one way the benchmarks compare sides: step by step in one run, there and back (ABBA,
ABCCBA), where they can share a run, and a ratio of medians with a 95% bootstrap interval."""
from __future__ import annotations

import numpy as np


def median_ratio_interval(num: list[float], den: list[float], paired: bool,
                          draws: int = 2000) -> list[float]:
    """A 95% percentile-bootstrap interval of median(num) / median(den).  ``paired``: num[i] and
    den[i] were measured together (one round, the same load) and are resampled together;
    otherwise each side is resampled on its own (steps of one A/B run)."""
    rng = np.random.default_rng(0)
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    pick_a = rng.integers(0, a.size, (draws, a.size))
    pick_b = pick_a if paired else rng.integers(0, b.size, (draws, b.size))
    ratios = np.median(a[pick_a], axis=1) / np.median(b[pick_b], axis=1)
    return [float(x) for x in np.percentile(ratios, [2.5, 97.5])]


def side(step: int, sides: int = 2) -> int:
    """Which of ``sides`` sides ``step`` is on in a run that alternates them step by step, there
    and back (ABBA for two, ABCCBA for three): a load that drifts weighs on each alike."""
    i = step % (2 * sides)
    return i if i < sides else 2 * sides - 1 - i


def step_times_by_side(ends: list[float], sides: list, first: int) -> dict:
    """Each step's time (from the end of the one before to its own end) from step ``first`` on,
    by its side (``sides[step]``)."""
    got: dict = {s: [] for s in dict.fromkeys(sides)}
    for step in range(max(first, 1), len(ends)):
        got[sides[step]].append(ends[step] - ends[step - 1])
    return got
