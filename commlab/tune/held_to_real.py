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
MEASURED = ("benchmarks/real_link.py --steps 150 --passes 3, run twice (2026-12-05, six passes): mlp, 2 Gloo "
            "ranks on a 2-core machine shared with other work (load average 2.1–11.9, then 0.8–3.5), "
            "the models given no latency")
# (hook, rate in Mb/s) -> model -> (lowest, median, highest) of the model's step / the real link's
# over the six passes.  The hooks as benchmarks/real_link.py sets them: PowerSGD rank 2, top-k 0.1,
# DiLoCo every 8 steps.
RATIOS: dict[tuple[str, float], dict[str, tuple[float, float, float]]] = {
    ("allreduce", 50): {"emulated": (0.926, 0.964, 0.974), "whatif": (0.927, 0.947, 0.957)},
    ("allreduce", 200): {"emulated": (1.042, 1.088, 1.133), "whatif": (1.015, 1.060, 1.132)},
    ("allreduce", 1000): {"emulated": (0.857, 1.438, 1.523), "whatif": (0.852, 1.199, 1.525)},
    ("fp16", 50): {"emulated": (0.856, 0.991, 1.024), "whatif": (0.858, 0.968, 0.987)},
    ("fp16", 200): {"emulated": (0.992, 1.237, 1.357), "whatif": (0.970, 1.172, 1.355)},
    ("fp16", 1000): {"emulated": (0.682, 0.888, 1.245), "whatif": (0.774, 0.913, 1.199)},
    ("powersgd", 50): {"emulated": (0.546, 0.799, 1.204), "whatif": (0.674, 0.799, 1.044)},
    ("powersgd", 200): {"emulated": (0.675, 0.876, 1.198), "whatif": (0.641, 0.920, 1.048)},
    ("powersgd", 1000): {"emulated": (0.730, 0.779, 1.010), "whatif": (0.782, 0.902, 1.005)},
    ("topk", 50): {"emulated": (0.878, 1.013, 1.109), "whatif": (0.945, 0.993, 1.254)},
    ("topk", 200): {"emulated": (0.503, 1.452, 2.025), "whatif": (0.688, 1.199, 2.333)},
    ("topk", 1000): {"emulated": (0.906, 0.993, 1.824), "whatif": (0.633, 1.067, 1.879)},
    ("diloco", 50): {"emulated": (0.738, 1.001, 1.229), "whatif": (0.843, 0.935, 1.085)},
    ("diloco", 200): {"emulated": (0.698, 0.978, 1.112), "whatif": (0.710, 1.014, 1.218)},
    ("diloco", 1000): {"emulated": (0.710, 1.139, 1.252), "whatif": (0.815, 1.095, 2.099)},
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

    @property
    def median_within(self) -> bool:
        """The median pass within ``WITHIN`` of the real link (single passes may not be)."""
        return 1 - WITHIN <= self.median <= 1 + WITHIN

    def verdict(self) -> str:
        if self.within:
            return f"within {WITHIN:.0%} in every pass"
        if self.median_within:
            return f"within {WITHIN:.0%} at the median, single passes outside with the machine's load"
        return f"outside {WITHIN:.0%}: the difference stays"

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
        return (f"held to a real link: {at.median:.2f}× the real step for {hook} at {_rate(at.rate_mbps)}, "
                f"{at.range_text()} over the passes ({at.verdict()}; {SOURCE})")
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
            row[f"{model} within {WITHIN:.0%}"] = ("every pass" if h.within else "median" if h.median_within
                                                    else "no")
        out.append(row)
    return out
