"""Figures of a sweep: final loss against bytes per step and against time, the Pareto front drawn.

Each takes the table ``Sweep.results()`` gives (fronts already marked) and returns one figure.
"""
from __future__ import annotations

import plotly.graph_objects as go

from commlab.tune.pareto import comparable

# axis -> (front column, axis title)
AXES = {"bytes_per_step": ("pareto_bytes", "bytes per step (handed to allreduce, mean over the run)"),
        "time_s": ("pareto_time", "training time, s (start-up excluded)")}


def pareto_figure(table, axis: str = "bytes_per_step", recommended: str | None = None) -> go.Figure:
    """Every finished run as a point, the front joined, the baseline and the recommendation marked.

    Runs over an emulated link say so in the title: their times are the emulated network's.
    """
    front_col, x_title = AXES[axis]
    ok = table[comparable(table)] if len(table) else table
    fig = go.Figure()
    if len(ok):
        front = ok[ok[front_col]].sort_values(axis)
        fig.add_scatter(x=front[axis], y=front["final_loss"], mode="lines", name="Pareto front",
                        line=dict(dash="dot", color="gray"))
        for is_base, name, symbol in ((True, "allreduce baseline", "square"),
                                      (False, "PowerSGD settings", "circle")):
            part = ok[ok["baseline"] == is_base]
            fig.add_scatter(x=part[axis], y=part["final_loss"], mode="markers+text", name=name,
                            text=part["label"].str.replace(r" \[.*\]$", "", regex=True),
                            textposition="top center", marker=dict(size=11, symbol=symbol),
                            customdata=part[["run_id", "status"]],
                            hovertemplate="%{text}<br>final loss %{y:.4g}<br>%{x:,.4g}"
                                          "<br>%{customdata[0]}<extra></extra>")
        best = ok[ok["run_id"] == recommended]
        if len(best):
            fig.add_scatter(x=best[axis], y=best["final_loss"], mode="markers", name="recommended",
                            marker=dict(size=22, symbol="star-open", line=dict(width=2)))
    links = sorted(set(table["link"])) if len(table) else []
    emulated = [lnk for lnk in links if lnk != "loopback"]
    title = f"Final loss against {'bytes per step' if axis == 'bytes_per_step' else 'time'}"
    if emulated and axis == "time_s":
        title += f" (over an {', '.join(emulated)} link)"
    elif emulated:
        title += f" (runs over an {', '.join(emulated)} link)"
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title="final loss (mean of last steps)",
                      height=420, margin=dict(t=50, b=10, l=10, r=10),
                      legend=dict(orientation="h", y=-0.2))
    if axis == "bytes_per_step":
        fig.update_xaxes(type="log")
    return fig
