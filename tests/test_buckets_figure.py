"""The Buckets page's figure reads in the lab's binary units (units.py): the axis title names the
unit and the bars, the sizes and the cap line are in it."""
from __future__ import annotations

import pytest

from commlab.analysis import buckets, units
from commlab.figures.runs import buckets_figure

MIB = 1024 * 1024


def layout(*numels: int) -> list[dict]:
    """float32 buckets of one parameter each, bucket 0 last, as buckets.json records them."""
    return [{"index": i, "is_last": i == 0, "bytes": 4 * n, "numel": n,
             "params": [{"name": f"p{i}", "shape": [n], "numel": n}]} for i, n in enumerate(numels)]


@pytest.mark.parametrize("cap_mb, numels, unit", [
    (25.0, (3 * MIB, MIB // 2), "MiB"),       # DDP's default cap: the MiB scale
    (0.05, (9_000, 4_000, 100), "KiB"),        # the browser test's 0.05 MiB cap: 51.2 KiB
    (1 / MIB * 600, (100, 50), "B"),           # below a KiB: whole bytes
])
def test_bucket_sizes_read_in_the_binary_unit_of_the_largest(cap_mb, numels, unit):
    recorded = {"bucket_cap_mb": cap_mb, "iter0": layout(numels[0]), "rebuilt": layout(*numels)}
    cap = buckets.cap_bytes(recorded)
    fig = buckets_figure(buckets.bucket_layouts(recorded), cap)
    per_unit = 1024 ** units.BINARY_UNITS.index(unit)
    largest = max(4 * max(numels), cap)
    assert 1 <= largest / per_unit < 1024  # the unit human_bytes would pick for the largest size
    for axis in ("xaxis", "xaxis2"):
        assert fig.layout[axis].title.text == f"bucket size ({unit})"
    bars = [t for t in fig.data if t.type == "bar"]
    sizes = [t for t in fig.data if t.type == "scatter"]
    for bar, size, key in zip(bars, sizes, ("iter0", "rebuilt")):
        nbytes = [b["bytes"] for b in recorded[key]]
        assert list(bar.x) == pytest.approx([n / per_unit for n in nbytes])
        assert list(size.x) == pytest.approx([n / per_unit for n in nbytes])
        assert [t.split(" (")[0].strip() for t in size.text] == [units.human_bytes(n) for n in nbytes]
    assert [s.x0 for s in fig.layout.shapes] == pytest.approx([cap / per_unit] * 2)  # the cap line
