"""The one way the benchmarks tell a ratio of medians from noise: a 95% bootstrap interval."""
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
