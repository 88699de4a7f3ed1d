"""Low-rank error: optimum against PowerSGD by rank, a layer's spectrum, warm start over steps,
and the error measured during a run."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from commlab.analysis.lowrank import LayerError, WarmStart
from commlab.figures import style


def error_table(layers: list[LayerError], rank: int) -> pd.DataFrame:
    """Each layer's relative error at one rank: the optimum, PowerSGD's, and how far apart."""
    rows = []
    for le in layers:
        optimum, power = le.at(rank)
        rows.append({"layer": le.name, "n": le.n, "m": le.m, "r": min(rank, le.ranks[-1]),
                     "optimum (SVD)": optimum, "PowerSGD (1 power iteration)": power,
                     "PowerSGD / optimum": power / optimum if optimum > 0 else float("nan")})
    return pd.DataFrame(rows, columns=["layer", "n", "m", "r", "optimum (SVD)",
                                       "PowerSGD (1 power iteration)", "PowerSGD / optimum"])


# The error-vs-rank chart draws this many layers unless a person picks others: past it the
# lines and the legend no longer tell the layers apart.
SHOWN_LAYERS = 5


def error_vs_rank(layers: list[LayerError], run_rank: int | None = None) -> go.Figure:
    """Solid: the truncated SVD; dashed: one power iteration; one colour per layer (a page passes
    the layers picked, ``SHOWN_LAYERS`` of them unless told)."""
    fig = go.Figure()
    for i, le in enumerate(layers):
        color = style.colour(i)
        fig.add_scatter(x=le.ranks, y=le.optimum, name=f"{le.name} · optimum", legendgroup=le.name,
                        mode="lines+markers", line=dict(color=color))
        fig.add_scatter(x=le.ranks, y=le.power, name=f"{le.name} · PowerSGD", legendgroup=le.name,
                        mode="lines+markers", line=dict(color=color, dash="dash"),
                        marker=dict(symbol="x"))
    if run_rank is not None:
        fig.add_vline(x=run_rank, line_dash="dot", line_color="gray",
                      annotation_text=f"run's rank {run_rank}")
    fig.update_layout(title=style.title("Relative error against rank"), xaxis_title="rank r",
                      yaxis_title="‖M − approximation‖ / ‖M‖", yaxis_rangemode="tozero",
                      height=460, margin=dict(t=style.top_margin(), b=10),
                      legend=dict(orientation="h", y=-0.2))
    return fig


def layer_by_rank(le: LayerError, warm: list[float] | None = None,
                  warm_steps: list[int] = ()) -> go.Figure:
    """One layer against rank: the optimum, one power iteration from a fresh Q, and, given the
    errors of a warm-started chain ending at this step, warm start."""
    fig = go.Figure([
        go.Scatter(x=le.ranks, y=le.optimum, name="optimum (SVD)", mode="lines+markers"),
        go.Scatter(x=le.ranks, y=le.power, name="PowerSGD, fresh Q", mode="lines+markers",
                   line=dict(dash="dash"))])
    if warm is not None:
        fig.add_scatter(x=le.ranks, y=warm, mode="lines+markers",
                        name=f"PowerSGD, warm start from step {warm_steps[0]}")
    fig.update_layout(title=f"{le.name} ({le.n}×{le.m}) against rank", xaxis_title="rank r",
                      yaxis_title="relative error", yaxis_rangemode="tozero", height=380,
                      margin=dict(t=40, b=10))
    return fig


# Gradients are float32: a singular value below σ₁ times float32's epsilon is rounding noise
# (an SVD reports such values down to 1e-49), so the spectrum stops there.
FLOAT32_EPS = 2.0 ** -23


def spectrum(le: LayerError, rank: int | None = None) -> go.Figure:
    """Singular values (log scale, down to σ₁·float32's epsilon), and the share of ‖M‖² the
    first k of them hold."""
    sv = le.singular_values
    k = list(range(1, len(sv) + 1))
    total = sum(s * s for s in sv) or 1.0
    captured, acc = [], 0.0
    for s in sv:
        acc += s * s
        captured.append(acc / total)
    floor = (sv[0] if sv else 0.0) * FLOAT32_EPS
    kept = [i for i, s in enumerate(sv) if s >= floor and s > 0]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_scatter(x=[k[i] for i in kept], y=[sv[i] for i in kept], name="singular value σₖ",
                    mode="lines+markers", secondary_y=False)
    if len(kept) < len(sv):
        fig.add_annotation(x=1, y=0, xref="paper", yref="paper", xanchor="right", yanchor="bottom",
                           showarrow=False, font=dict(size=10),
                           text=f"{len(sv) - len(kept):,} σₖ below σ₁·ε(float32) not drawn: rounding noise")
    fig.add_scatter(x=k, y=captured, name="share of ‖M‖² in σ₁…σₖ", mode="lines",
                    line=dict(dash="dot"), secondary_y=True)
    if rank is not None:
        fig.add_vline(x=rank, line_dash="dot", line_color="gray", annotation_text=f"rank {rank}")
    fig.update_layout(title=style.title(f"Singular values of {le.name} ({le.n:,}×{le.m:,})"),
                      xaxis_title="k", height=400, margin=dict(t=style.top_margin(), b=10),
                      legend=dict(orientation="h", y=-0.2))
    fig.update_yaxes(type="log", title="σₖ", secondary_y=False)
    fig.update_yaxes(title="share", range=[0, 1.02], secondary_y=True)
    return fig


def warm_start_figure(ws: WarmStart) -> go.Figure:
    fig = go.Figure([
        go.Scatter(x=ws.steps, y=ws.optimum, name="optimum (SVD)", mode="lines+markers"),
        go.Scatter(x=ws.steps, y=ws.cold, name="PowerSGD, new Q each step", mode="lines+markers",
                   line=dict(dash="dash")),
        go.Scatter(x=ws.steps, y=ws.warm, name="PowerSGD, warm start", mode="lines+markers")])
    fig.update_layout(title=f"{ws.name} at rank {ws.rank}, consecutive saved steps",
                      xaxis_title="step", yaxis_title="relative error", yaxis_rangemode="tozero",
                      height=380, margin=dict(t=40, b=10))
    fig.update_xaxes(tickvals=ws.steps)
    return fig


def warm_start_table(ws: WarmStart) -> pd.DataFrame:
    """The numbers of ``warm_start_figure``: one row per step."""
    return pd.DataFrame({"step": ws.steps, "optimum (SVD)": ws.optimum,
                         "PowerSGD, new Q each step": ws.cold, "PowerSGD, warm start": ws.warm})


def measured_table(rows: list[dict]) -> pd.DataFrame:
    """``lowrank.measured_rows`` as a frame; the columns stay when no row came, so that
    ``measured_figure`` can group an empty one."""
    return pd.DataFrame(rows, columns=["step", "scope", "name", "bucket", "rel_error"])


def measured_figure(rows: list[dict], ef_norms: list[tuple[int, float]] | None = None) -> go.Figure:
    """Error of the hook's output against the exact mean gradient, as the run measured it
    (error feedback included), per compressed layer and per bucket; error feedback's residual
    norm on the right axis."""
    frame = measured_table(rows)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for (scope, name), part in frame.groupby(["scope", "name"], sort=False):
        fig.add_scatter(x=part["step"], y=part["rel_error"], name=name, mode="lines+markers",
                        line=dict(dash="solid" if scope == "layer" else "dash"),
                        secondary_y=False)
    if ef_norms:
        fig.add_scatter(x=[s for s, _ in ef_norms], y=[v for _, v in ef_norms],
                        name="error-feedback residual ‖e‖", mode="lines", line=dict(color="gray",
                                                                                  dash="dot"),
                        secondary_y=True)
    fig.update_layout(title="Approximation error measured during the run", xaxis_title="step",
                      height=420, margin=dict(t=40, b=10))
    fig.update_yaxes(title="relative error", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title="‖e‖", rangemode="tozero", secondary_y=True, showgrid=False)
    return fig
