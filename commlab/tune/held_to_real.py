"""How far the lab's two models of a slower link were from a real one: the one table of measured
ratios, read wherever a model's step time is shown (the what-if, the Compare and What-if pages, a
run over the emulated link), so that a difference that stays is said beside the figure.

The emulated link (``emulate_bandwidth_gbps``: the hooks hold each collective back by its bytes
at the rate) and the what-if (``commlab.tune.whatif``: compute + arithmetic + α-β collectives, from
a loopback run) were held to a real link of the same rate (``--real-link-mbps``: each rank in a
network namespace, veths shaped by the kernel's token bucket) by ``benchmarks/real_link.py``;
``RATIOS`` is its table, a model's step over the real link's, the range over its passes
(docs/tuning.md, "The models held to a real link", holds the step times and the command).  Below
1 the model is faster than the real link; within ``WITHIN`` of 1 over every pass it is held.
"""
from __future__ import annotations

from dataclasses import dataclass

MODELS = {"emulated": "the emulated link", "whatif": "the what-if"}
WITHIN = 0.20
SOURCE = "docs/tuning.md"
MEASURED = ("benchmarks/real_link.py --steps 150 --passes 3 (2026-12-05): mlp, 2 Gloo ranks on a 2-core "
            "machine shared with other work (load average 2.1–11.9), the models given no latency")
# (hook, rate in Mb/s) -> model -> (lowest, median, highest) of the model's step / the real link's
# over the passes.  The hooks as benchmarks/real_link.py sets them: PowerSGD rank 2, top-k 0.1,
# DiLoCo every 8 steps.
RATIOS: dict[tuple[str, float], dict[str, tuple[float, float, float]]] = {
    ("allreduce", 50): {"emulated": (0.93, 0.93, 0.96), "whatif": (0.93, 0.93, 0.95)},
    ("allreduce", 200): {"emulated": (1.04, 1.05, 1.13), "whatif": (1.02, 1.05, 1.13)},
    ("allreduce", 1000): {"emulated": (0.89, 1.42, 1.45), "whatif": (1.04, 1.17, 1.46)},
    ("fp16", 50): {"emulated": (0.86, 0.94, 0.98), "whatif": (0.86, 0.95, 0.99)},
    ("fp16", 200): {"emulated": (0.99, 1.16, 1.23), "whatif": (0.97, 1.28, 1.36)},
    ("fp16", 1000): {"emulated": (0.68, 0.82, 0.96), "whatif": (0.77, 1.05, 1.20)},
    ("powersgd", 50): {"emulated": (0.64, 0.81, 1.20), "whatif": (0.71, 0.75, 0.85)},
    ("powersgd", 200): {"emulated": (0.84, 0.98, 1.20), "whatif": (0.89, 0.97, 1.05)},
    ("powersgd", 1000): {"emulated": (0.73, 0.75, 0.78), "whatif": (0.81, 0.84, 0.97)},
    ("topk", 50): {"emulated": (0.88, 0.91, 1.11), "whatif": (1.00, 1.06, 1.25)},
    ("topk", 200): {"emulated": (0.50, 1.46, 2.02), "whatif": (0.69, 2.13, 2.33)},
    ("topk", 1000): {"emulated": (0.91, 1.00, 1.10), "whatif": (1.22, 1.39, 1.88)},
    ("diloco", 50): {"emulated": (0.74, 0.80, 1.06), "whatif": (0.87, 0.89, 1.09)},
    ("diloco", 200): {"emulated": (0.84, 0.93, 1.03), "whatif": (0.99, 1.04, 1.22)},
    ("diloco", 1000): {"emulated": (0.71, 1.10, 1.17), "whatif": (0.84, 1.44, 2.10)},
}
RATES_MBPS = sorted({rate for _, rate in RATIOS})


@dataclass(frozen=True)
class Held:
    """A model's step over the real link's for one hook at one measured rate."""

    hook: str
    model: str
    rate_mbps: float
    low: float
    median: float
    high: float

    @property
    def within(self) -> bool:
        """Within ``WITHIN`` of the real link over every pass."""
        return 1 - WITHIN <= self.low and self.high <= 1 + WITHIN

    def range_text(self) -> str:
        return f"{self.low:.2f}×" if self.low == self.high else f"{self.low:.2f}–{self.high:.2f}×"


def held(hook: str, model: str) -> list[Held]:
    """Every measured rate of ``hook`` for ``model`` (``MODELS``), slowest rate first; empty for a
    hook never held to a real link."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    return [Held(h, model, rate, *models[model]) for (h, rate), models in sorted(RATIOS.items(), key=lambda i: i[0][1])
            if h == hook]


def _rate(mbps: float) -> str:
    return f"{mbps / 1000:g} Gb/s" if mbps >= 1000 else f"{mbps:g} Mb/s"


def beside(hook: str, rate_mbps: float | None, model: str) -> str:
    """The sentence to put beside ``model``'s step time for ``hook`` on a link of ``rate_mbps``
    (None: no one rate, a chart over many): the measured ratio at that rate, or where the rate or
    the hook was never measured, what was."""
    rows, name = held(hook, model), MODELS[model]
    if not rows:
        return (f"{name} was not held to a real link for {hook} (measured: "
                f"{', '.join(sorted({h for h, _ in RATIOS}))}; {SOURCE})")
    at = next((r for r in rows if rate_mbps is not None and abs(r.rate_mbps - rate_mbps) < 1e-6), None)
    if at is not None:
        verdict = f"within {WITHIN:.0%}" if at.within else "outside 20%: the difference stays"
        return (f"held to a real link: {at.median:.2f}× the real step for {hook} at {_rate(at.rate_mbps)}, "
                f"{at.range_text()} over the passes ({verdict}; {SOURCE})")
    spans = "; ".join(f"{r.range_text()} at {_rate(r.rate_mbps)}" for r in rows)
    where = "" if rate_mbps is None else f"{_rate(rate_mbps)} was not measured; "
    return f"held to a real link: {where}{hook}'s step on {name} was {spans} the real one ({SOURCE})"


def table(hooks: list[str] | None = None) -> list[dict]:
    """One row per measured (hook, rate): both models' ratio ranges and whether they held; for
    ``hooks`` only (None: every hook measured)."""
    out = []
    for (hook, rate), models in sorted(RATIOS.items(), key=lambda i: (i[0][0], i[0][1])):
        if hooks is not None and hook not in hooks:
            continue
        row = {"hook": hook, "rate": _rate(rate)}
        for model in MODELS:
            h = Held(hook, model, rate, *models[model])
            row[f"{model} / real"] = f"{h.median:.2f} ({h.range_text()})"
            row[f"{model} within {WITHIN:.0%}"] = h.within
        out.append(row)
    return out
