"""Figures of runs: loss, step time, bytes per step, compression ratio, and DDP's buckets.

Each takes the rows commlab.live or commlab.store give and returns one plotly figure.  Live
figures keep ``uirevision`` fixed, so a zoom survives the refresh every half second.
"""
from __future__ import annotations

import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

# x column -> (what the title says, the axis title)
X_AXES = {"step": ("step", "step"), "t": ("wall time", "seconds since the first step began"),
          "sent_bytes": ("bytes sent", "bytes the hook sent, cumulative (per rank)")}
HEIGHT = 300


def _layout(fig: go.Figure, title: str, xaxis: str, yaxis: str, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(title=title, xaxis_title=xaxis, yaxis_title=yaxis, height=height,
                      margin=dict(t=40, b=10, l=10, r=10), uirevision="keep",
                      legend=dict(orientation="h", y=-0.25))
    return fig


def loss_figure(frames: dict, x: str = "step") -> go.Figure:
    """Loss of one or several runs (label -> metrics DataFrame) against step, time or bytes."""
    fig = go.Figure([go.Scatter(x=df[x], y=df["loss"], name=label, mode="lines+markers",
                                marker=dict(size=4))
                     for label, df in frames.items() if x in df])
    return _layout(fig, f"Loss against {X_AXES[x][0]}", X_AXES[x][1], "loss")


def step_time_figure(df) -> go.Figure:
    fig = go.Figure(go.Scatter(x=df["step"], y=df["step_s"], name="whole step", mode="lines"))
    if "hook_s" in df:
        fig.add_scatter(x=df["step"], y=df["hook_s"], name="inside the hook (summed over buckets)",
                        mode="lines")
    return _layout(fig, "Step time", "step", "seconds")


def bytes_figure(df) -> go.Figure:
    """What the hook handed to allreduce each step, against what plain allreduce would send."""
    fig = go.Figure()
    if "payload_bytes" in df:
        fig.add_scatter(x=df["step"], y=df["plain_bytes"], name="plain allreduce would send",
                        mode="lines", line=dict(dash="dash"))
        fig.add_scatter(x=df["step"], y=df["payload_bytes"], name="this hook sent", mode="lines")
    return _layout(fig, "Bytes per step (per rank, handed to allreduce)", "step", "bytes")


def compression_figure(df) -> go.Figure:
    fig = go.Figure()
    if "compression_ratio" in df:
        fig.add_scatter(x=df["step"], y=df["compression_ratio"], name="compression ratio",
                        mode="lines")
    return _layout(fig, "Compression ratio so far (plain bytes / sent bytes)", "step", "ratio")


def buckets_figure(layouts: dict[str, list[dict]], cap_bytes: int | None) -> go.Figure:
    """Layouts side by side (title -> buckets from ``live.bucket_layouts``): one bar per bucket,
    split into its parameters, each parameter the same colour in both layouts; the dashed line
    is the cap; buckets are listed top to bottom in the order DDP reduces them."""
    titles = list(layouts)
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.12)
    names = sorted({p["name"] for rows in layouts.values() for b in rows for p in b["params"]})
    palette = plotly.colors.qualitative.Plotly
    colour = {n: palette[i % len(palette)] for i, n in enumerate(names)}
    for col, title in enumerate(titles, start=1):
        rows = layouts[title]
        segments = [(bucket_label(b), p, nbytes, offset)
                    for b in rows for p, nbytes, offset in _segments(b)]
        fig.add_bar(x=[s[2] for s in segments], y=[s[0] for s in segments],
                    base=[s[3] for s in segments], orientation="h",
                    text=[s[1]["name"] for s in segments], textposition="inside",
                    insidetextanchor="middle",
                    marker=dict(color=[colour[s[1]["name"]] for s in segments], line=dict(width=1)),
                    hovertext=[f"{p['name']} {tuple(p['shape'])}: {n:,} bytes"
                               for _, p, n, _ in segments],
                    hoverinfo="text", showlegend=False, name=title, row=1, col=col)
        fig.add_scatter(x=[b["bytes"] for b in rows], y=[bucket_label(b) for b in rows],
                        mode="text", textposition="middle right", showlegend=False,
                        text=[_size_text(b["bytes"], cap_bytes) for b in rows], hoverinfo="skip",
                        name=f"{title} sizes", row=1, col=col)
        if cap_bytes:
            fig.add_vline(x=cap_bytes, line_dash="dash", annotation_text="cap", row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col)
        fig.update_xaxes(title_text="bytes", row=1, col=col)
    fig.update_layout(barmode="overlay", height=140 + 70 * max([len(r) for r in layouts.values()] + [1]),
                      margin=dict(t=50, b=10, l=10, r=10))
    return fig


def _segments(b: dict):
    """(parameter, bytes, offset) for each parameter of a bucket, in the bucket's order."""
    itemsize = b["bytes"] // max(b["numel"], 1)
    offset = 0
    for p in b["params"]:
        yield p, p["numel"] * itemsize, offset
        offset += p["numel"] * itemsize


def bucket_label(b: dict) -> str:
    return f"bucket {b['index']} · reduced #{b['order']}" + (" · last" if b["is_last"] else "")


def _size_text(nbytes: int, cap: int | None) -> str:
    return f" {nbytes:,} B" + (f" ({nbytes / cap:.0%} of cap)" if cap else "")
