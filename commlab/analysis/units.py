"""How numbers read on every page and in every command: one convention for bytes (binary: KiB,
MiB, GiB, as DDP's bucket_cap_mb counts MiB), thousands separators, and a few significant digits
for measured values (a loss is 1.6397, not 1.6396629810333252)."""
from __future__ import annotations

import math

BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float | None) -> str:
    """A byte count in binary units: 1,023 B, 1.5 KiB, 80.4 MiB; '–' when unknown."""
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return "–"
    size, unit = float(n), 0
    while abs(size) >= 1024 and unit < len(BINARY_UNITS) - 1:
        size, unit = size / 1024, unit + 1
    return f"{n:,.0f} B" if unit == 0 else f"{size:,.{1 if abs(size) >= 10 else 2}f} {BINARY_UNITS[unit]}"


def number(x: float | int | None, digits: int = 4) -> str:
    """A measured value for reading: integers with thousands separators, floats to ``digits``
    significant digits (thousands separated, no exponent between 1e-4 and 1e15); '–' when unknown."""
    if x is None:
        return "–"
    if isinstance(x, bool) or isinstance(x, int):
        return f"{x:,}"
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    if 1e-4 <= abs(x) < 1e15:
        decimals = max(digits - 1 - math.floor(math.log10(abs(x))), 0)
        return f"{x:,.{decimals}f}"
    return f"{x:.{digits - 1}e}"


def seconds(s: float | None) -> str:
    """A duration: ms below a second, else seconds."""
    if s is None:
        return "–"
    return f"{number(s * 1000, 3)} ms" if abs(s) < 1 else f"{number(s, 3)} s"
