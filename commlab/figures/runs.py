"""Figures of runs: the live panel, loss overlays, and DDP's bucket layouts.

Each takes the rows or DataFrames commlab.ui.runs and commlab.engine.store give and returns one plotly
figure.  ``uirevision`` stays fixed, so a zoom survives the live panel's refresh.
"""
from __future__ import annotations

import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

# x column -> (what the title says, the axis title)
X_AXES = {"step": ("step", "step"), "t": ("wall time", "seconds since the first step began"),
          "sent_bytes": ("bytes sent", "bytes the hook sent, cumulative (per rank)")}


def loss_figure(frames: dict, x: str = "step") -> go.Figure:
    """Loss of one or several runs (label -> metrics DataFrame) against step, time or bytes."""
    fig = go.Figure([go.Scatter(x=df[x], y=df["loss"], name=label, mode="lines+markers",
                                marker=dict(size=4))
                     for label, df in frames.items() if x in df])
    fig.update_layout(title=f"Loss against {X_AXES[x][0]}", xaxis_title=X_AXES[x][1],
                      yaxis_title="loss", height=380, margin=dict(t=40, b=10, l=10, r=10),
                      uirevision="keep", legend=dict(orientation="h", y=-0.2))
    return fig


def live_figure(df) -> go.Figure:
    """One run's loss, step time, bytes per step (against what plain allreduce would send) and
    compression ratio, as four panels of one figure: the live panel redraws it twice a second,
    and one figure costs about half of what four separate ones cost to build and send."""
    fig = make_subplots(rows=2, cols=2, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=["Loss", "Step time (s)",
                                        "Bytes per step, per rank, handed to allreduce",
                                        "Compression ratio so far (plain / sent bytes)"])
    step = df["step"]
    fig.add_scatter(x=step, y=df["loss"], name="loss", mode="lines", row=1, col=1)
    fig.add_scatter(x=step, y=df["step_s"], name="whole step", mode="lines", row=1, col=2)
    if "payload_bytes" in df:  # instrumented runs only
        fig.add_scatter(x=step, y=df["hook_s"], name="in the hook (first bucket in to last out)", mode="lines",
                        row=1, col=2)
        fig.add_scatter(x=step, y=df["plain_bytes"], name="plain allreduce would send",
                        mode="lines", line=dict(dash="dash"), row=2, col=1)
        fig.add_scatter(x=step, y=df["payload_bytes"], name="this hook sent", mode="lines",
                        row=2, col=1)
        fig.add_scatter(x=step, y=df["compression_ratio"], name="compression ratio",
                        mode="lines", row=2, col=2)
    fig.update_xaxes(title_text="step", row=2)
    fig.update_layout(height=560, margin=dict(t=30, b=10, l=10, r=10), uirevision="keep",
                      legend=dict(orientation="h", y=-0.12))
    return fig


def buckets_figure(layouts: dict[str, list[dict]], cap_bytes: int | None) -> go.Figure:
    """Layouts side by side (title -> buckets from ``buckets.bucket_layouts``): one bar per bucket,
    split into its parameters, each parameter the same colour in both layouts; the dashed line
    is the cap; buckets run top to bottom in the order DDP reduces them (bucket index order)."""
    titles = list(layouts)
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.15)
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
        # Room on the right of the longest bar for its size.
        widest = max([b["bytes"] for b in rows] + [cap_bytes or 0, 1])
        fig.update_xaxes(title_text="bytes", range=[0, 1.6 * widest], row=1, col=col)
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
    return f"bucket {b['index']}" + (" · last" if b["is_last"] else "")


def _size_text(nbytes: int, cap: int | None) -> str:
    return f" {nbytes:,} B" + (f" ({nbytes / cap:.0%} of cap)" if cap else "")
