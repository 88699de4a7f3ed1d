"""The comparison's table and charts, one row and one point per run (rows of
``commlab.tune.compare.table``): the columns a person reads first placed first, under their own
names; quality against bytes per step and against predicted step time."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from commlab.figures import style
from commlab.tune import payoff

# The table's columns in reading order: what a setting is, what it sends, whether it pays; then
# the figures behind the verdict; then where each number comes from.
READING_ORDER = ("label", "bytes_per_step", "compression_ratio", "pays", "speedup", "quality",
                 "median_step_s", "predicted_step_s", "break_even_gbps", "wire_bytes",
                 "overlap_share", "heldout_accuracy", "heldout_bits_per_char", "hook", "basis",
                 "steady_steps", "run_id")


def table_frame(rows: list[dict]) -> pd.DataFrame:
    """The rows in ``READING_ORDER``, without the columns no run has a value for, ``pays`` in
    short ("below 2.25 Gb/s", "never"; the sentence is the row's ``pays``)."""
    frame = pd.DataFrame(rows, columns=READING_ORDER)
    frame["pays"] = [short_pays(r) for r in rows]
    return frame[[c for c in READING_ORDER if frame[c].notna().any() or c == "pays"]]


def short_pays(row: dict) -> str | None:
    """Whether the row's setting pays, in a table cell's words (``payoff.Payoff``'s verdict)."""
    verdict = row.get("verdict")
    if verdict in (payoff.BELOW, payoff.ABOVE):
        return f"{verdict} {row['break_even_gbps']:.3g} Gb/s"
    if verdict == payoff.ITSELF:  # which baseline it is: the sentence is short already
        return row["pays"]
    return verdict


def quality_figure(rows: list[dict], x: str, x_title: str, title: str, quality_title: str) -> go.Figure:
    """Quality (lower is better) against ``x``, logarithmic: bytes and times span decades.  One
    colour per run, named by its label in a legend beside the plot (labels on 12 points would
    cover each other)."""
    shown = [(i, r) for i, r in enumerate(rows) if r.get(x) and r.get("quality") is not None]
    fig = go.Figure([go.Scatter(x=[r[x]], y=[r["quality"]], mode="markers", name=r["label"],
                                marker=dict(size=11, color=style.colour(i)),
                                hovertemplate=f"{r['label']}<br>%{{x:.3g}}, %{{y:.4f}}<extra></extra>")
                     for i, r in shown])
    fig.update_layout(title=style.title(title), xaxis_title=x_title, yaxis_title=quality_title,
                      height=420, margin=dict(t=style.top_margin(2), b=10, l=10, r=10),
                      legend=style.LEGEND_BESIDE)
    fig.update_xaxes(type="log")
    return fig
