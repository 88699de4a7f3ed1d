"""Reading a sweep's table: which settings nothing beats, and the one to recommend (pure).

A table has one row per run (``commlab.tune.sweep.summarize``).  A run is on the Pareto front of
final loss against an axis (bytes per step, training time) when no other run is at least as good
on both and better on one; the recommendation is the stated rule: the fewest bytes per step among
finished runs whose final loss is within X% of the plain allreduce baseline's.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


def comparable(df):
    """Rows that may enter the front and the recommendation: finished, finite loss, bytes counted."""
    import numpy as np

    loss = df["final_loss"].astype(float)
    return (df["status"] == "finished") & np.isfinite(loss) & df["bytes_per_step"].notna()


def pareto_front(xs: list[float], ys: list[float]) -> list[bool]:
    """Which points no other point beats on both (smaller is better on both axes)."""
    return [not any((xj <= xi and yj <= yi) and (xj < xi or yj < yi)
                    for j, (xj, yj) in enumerate(zip(xs, ys)) if j != i)
            for i, (xi, yi) in enumerate(zip(xs, ys))]


def mark(df):
    """Add ``pareto_bytes`` and ``pareto_time``: on the front of final loss against that axis."""
    df = df.copy()
    ok = comparable(df)
    for col, axis in (("pareto_bytes", "bytes_per_step"), ("pareto_time", "time_s")):
        df[col] = False
        sub = df[ok]
        if len(sub):
            df.loc[sub.index, col] = pareto_front(sub[axis].astype(float).tolist(),
                                                  sub["final_loss"].astype(float).tolist())
    return df


@dataclass
class Recommendation:
    rule: str
    run_id: str | None
    label: str | None
    text: str
    bytes_per_step: float | None = None
    final_loss: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def recommend(df, tolerance_pct: float) -> Recommendation:
    """The fewest bytes per step among runs whose final loss is within X% of allreduce's."""
    rule = (f"fewest bytes per step among finished runs whose final loss is within "
            f"{tolerance_pct:g}% of the allreduce baseline's")
    ok = df[comparable(df)]
    base = ok[ok["baseline"].astype(bool)]
    if not len(base):
        return Recommendation(rule, None, None, "no finished allreduce baseline to compare with: "
                              "run the sweep with its baseline")
    base_loss, base_bytes = float(base["final_loss"].iloc[0]), float(base["bytes_per_step"].iloc[0])
    limit = base_loss + abs(base_loss) * tolerance_pct / 100
    within = ok[ok["final_loss"].astype(float) <= limit]
    best = within.sort_values(["bytes_per_step", "final_loss"]).iloc[0]
    if best["baseline"]:
        return Recommendation(rule, best["run_id"], best["label"],
                              f"keep allreduce: no compressed setting came within {tolerance_pct:g}% "
                              f"of its final loss {base_loss:.4g}; raise X or start PowerSGD later",
                              float(best["bytes_per_step"]), float(best["final_loss"]))
    loss = float(best["final_loss"])
    change = (loss - base_loss) / abs(base_loss) * 100 if base_loss else 0.0
    return Recommendation(
        rule, best["run_id"], best["label"],
        f"{best['label']}: {best['bytes_per_step']:,.0f} bytes per step, "
        f"{base_bytes / best['bytes_per_step']:.1f}x fewer than allreduce, final loss {loss:.4g} "
        f"({change:+.1f}% against allreduce's {base_loss:.4g})",
        float(best["bytes_per_step"]), loss)

