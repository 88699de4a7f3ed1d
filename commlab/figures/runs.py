"""Figures of runs: the live panel, loss overlays, and DDP's bucket layouts.

Each takes the rows or DataFrames commlab.ui.runs and commlab.engine.store give and returns one plotly
figure.  ``uirevision`` stays fixed, so a zoom survives the live panel's refresh.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from commlab.analysis import units
from commlab.figures import style

# x column -> (what the title says, the axis title)
X_AXES = {"step": ("step", "step"), "t": ("wall time", "seconds since the first step began"),
          "sent_bytes": ("bytes sent", "bytes the hook sent, cumulative (per rank)")}


def smoothed(y, weight: float):
    """TensorBoard's smoothing: an exponential moving average with the first value's bias
    removed (``weight`` 0 leaves the curve as it is, 0.99 nearly flattens it)."""
    import pandas as pd

    y = pd.Series(y, dtype=float)
    return y if weight <= 0 else y.ewm(alpha=1 - weight, adjust=True).mean()


def loss_figure(frames: dict, x: str = "step", smoothing: float = 0.0, log_y: bool = False,
                log_x: bool = False) -> go.Figure:
    """Loss of one or several runs (label -> metrics DataFrame) against step, time or bytes;
    ``smoothing`` draws the moving average (``smoothed``) over the raw curve, faded."""
    fig = go.Figure()
    for i, (label, df) in enumerate((k, v) for k, v in frames.items() if x in v):
        colour = style.colour(i)
        if smoothing > 0:
            fig.add_scatter(x=df[x], y=df["loss"], name=f"{label} (raw)", mode="lines",
                            line=dict(color=colour, width=1), opacity=0.3, showlegend=False,
                            legendgroup=label)
        fig.add_scatter(x=df[x], y=smoothed(df["loss"], smoothing) if smoothing > 0 else df["loss"],
                        name=label, mode="lines+markers" if smoothing <= 0 else "lines",
                        marker=dict(size=4), line=dict(color=colour), legendgroup=label)
    fig.update_layout(title=style.title(f"Loss against {X_AXES[x][0]}"
                                        + (f" (smoothed {smoothing:g})" if smoothing > 0 else "")),
                      xaxis_title=X_AXES[x][1], yaxis_title="loss", height=420,
                      margin=dict(t=style.top_margin(), b=10, l=10, r=10),
                      uirevision="keep", legend=style.LEGEND_BESIDE)
    fig.update_yaxes(type="log" if log_y else "linear")
    fig.update_xaxes(type="log" if log_x else "linear")
    if x == "sent_bytes":
        fig.update_xaxes(tickformat=",d", ticksuffix=" B")
    return fig


# The live panel's four panels, row-major; each names its group of the legend.
LIVE_PANELS = ("Loss", "Step time (s)", "Bytes per step, per rank, handed to the collectives",
               "Compression ratio so far (plain / sent bytes, every step)")
_PANEL_GROUPS = ("loss", "step time", "bytes per step", "ratio so far")


def live_figure(df) -> go.Figure:
    """One run's loss, step time, bytes per step (against what plain allreduce would send) and
    compression ratio, as four panels of one figure, the legend grouped by panel: the live panel
    redraws it twice a second, and one figure costs about half of what four separate ones cost
    to build and send."""
    fig = make_subplots(rows=2, cols=2, shared_xaxes=True, vertical_spacing=0.14,
                        horizontal_spacing=0.1, subplot_titles=LIVE_PANELS)
    step = df["step"]

    def add(y, name, row, col, **kw):
        group = _PANEL_GROUPS[(row - 1) * 2 + col - 1]
        fig.add_scatter(x=step, y=y, name=name, mode="lines", legendgroup=group,
                        legendgrouptitle_text=group, row=row, col=col, **kw)

    add(df["loss"], "loss", 1, 1)
    add(df["step_s"], "whole step", 1, 2)
    if "payload_bytes" in df:  # instrumented runs only
        add(df["hook_s"], "in the hook (first bucket in to last out)", 1, 2)
        add(df["plain_bytes"], "plain allreduce would send", 2, 1, line=dict(dash="dash"))
        add(df["payload_bytes"], "this hook sent", 2, 1)
        add(df["compression_ratio"], "compression ratio", 2, 2)
    fig.update_xaxes(title_text="step", row=2)
    fig.update_yaxes(tickformat=",d", ticksuffix=" B", row=2, col=1)
    fig.update_layout(height=600, margin=dict(t=style.top_margin(), b=10, l=10, r=10),
                      uirevision="keep", legend=dict(orientation="h", y=-0.12, groupclick="toggleitem"))
    return fig


def buckets_figure(layouts: dict[str, list[dict]], cap_bytes: int | None) -> go.Figure:
    """Layouts side by side (title -> buckets from ``buckets.bucket_layouts``): one bar per bucket,
    split into its parameters, each parameter the same colour in both layouts; the dashed line
    is the cap; buckets run top to bottom in the order DDP reduces them (bucket index order).
    Sizes read in the binary unit ``units.human_bytes`` gives the largest bucket or the cap, the
    same unit in both layouts so that their bars compare."""
    titles = list(layouts)
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.15)
    names = sorted({p["name"] for rows in layouts.values() for b in rows for p in b["params"]})
    colour = {n: style.colour(i) for i, n in enumerate(names)}
    largest = max([b["bytes"] for rows in layouts.values() for b in rows] + [cap_bytes or 0, 1])
    unit = units.human_bytes(largest).split()[-1]
    per_unit = 1024 ** units.BINARY_UNITS.index(unit)
    for col, title in enumerate(titles, start=1):
        rows = layouts[title]
        segments = [(bucket_label(b), p, nbytes, offset)
                    for b in rows for p, nbytes, offset in _segments(b)]
        fig.add_bar(x=[s[2] / per_unit for s in segments], y=[s[0] for s in segments],
                    base=[s[3] / per_unit for s in segments], orientation="h",
                    text=[s[1]["name"] for s in segments], textposition="inside",
                    insidetextanchor="middle",
                    marker=dict(color=[colour[s[1]["name"]] for s in segments], line=dict(width=1)),
                    hovertext=[f"{p['name']} {tuple(p['shape'])}: {units.human_bytes(n)} ({n:,} B)"
                               for _, p, n, _ in segments],
                    hoverinfo="text", showlegend=False, name=title, row=1, col=col)
        fig.add_scatter(x=[b["bytes"] / per_unit for b in rows], y=[bucket_label(b) for b in rows],
                        mode="text", textposition="middle right", showlegend=False,
                        text=[_size_text(b["bytes"], cap_bytes) for b in rows], hoverinfo="skip",
                        cliponaxis=False, name=f"{title} sizes", row=1, col=col)
        if cap_bytes:
            fig.add_vline(x=cap_bytes / per_unit, line_dash="dash", annotation_text="cap",
                          row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col)
        # Room on the right of the longest bar for its size.
        widest = max([b["bytes"] for b in rows] + [cap_bytes or 0, 1])
        fig.update_xaxes(title_text=f"bucket size ({unit})", range=[0, 1.8 * widest / per_unit],
                         row=1, col=col)
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
    return f" {units.human_bytes(nbytes)}" + (f" ({nbytes / cap:.0%} of cap)" if cap else "")
