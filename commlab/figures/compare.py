"""The comparison's charts: quality against bytes per step and against predicted step time, one
point per run (rows of ``commlab.tune.compare.table``)."""
from __future__ import annotations

import plotly.graph_objects as go

from commlab.figures import style


def quality_figure(rows: list[dict], x: str, x_title: str, title: str, quality_title: str) -> go.Figure:
    """Quality (lower is better) against ``x``, logarithmic: bytes and times span decades."""
    shown = [r for r in rows if r.get(x) and r.get("quality") is not None]
    fig = go.Figure([go.Scatter(x=[r[x]], y=[r["quality"]], mode="markers+text", name=r["label"],
                                text=[r["hook"]], textposition="top center",
                                marker=dict(size=11)) for r in shown])
    fig.update_layout(title=style.title(title), xaxis_title=x_title, yaxis_title=quality_title,
                      height=420, margin=dict(t=style.top_margin(2), b=10, l=10, r=10),
                      legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(type="log")
    return fig
