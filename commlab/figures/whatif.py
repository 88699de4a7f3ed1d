"""Figures of the what-if model: step time against workers and bandwidth, and where each hook wins.

Each takes the rows ``commlab.tune.whatif.predict`` / ``winners`` / ``check`` give.
"""
from __future__ import annotations

import plotly.graph_objects as go

from commlab.figures import style

ASSUMPTION = ("α-β ring model (allgather N−1 hops), communication hidden behind backward by the "
              "share each run measured (none where it traced no step), per-worker batch fixed; held "
              "to a real tbf-shaped link here (commlab.tune.held_to_real, docs/tuning.md): within 20% "
              "where bytes dominate; for hooks of few bytes (PowerSGD) the real link ran up to 1/0.64 "
              "= 1.6× slower, a cost per collective that only α stands for; steps of a few ms moved "
              "by up to 2× with the machine's load")
# What a figure's subtitle holds: the whole assumption does not fit in a figure's width (it was
# clipped at 1400 px); pages print ASSUMPTION once in a caption beside the figures.
SUBTITLE = "α-β ring model · overlap as measured · per-worker batch fixed (assumptions below)"


def _layout(fig: go.Figure, title: str, x_title: str, height: int = 420) -> go.Figure:
    fig.update_layout(title=style.title(title), xaxis_title=x_title,
                      yaxis_title="predicted step time, ms", height=height,
                      margin=dict(t=style.top_margin(2), b=10, l=10, r=10),
                      legend=dict(orientation="h", y=-0.25))
    # Both span decades: 2 to 1,024 workers, 1 to 400 Gb/s, step times with them.  Labelled at
    # the values the rows hold (a log axis within one decade labels every digit, and they collide),
    # and linear in time where the step times span less than a decade; a log time axis is labelled
    # at 1, 2 and 5 of each decade only (every digit's label collides near the top of a decade).
    xs = sorted({x for t in fig.data for x in t.x or ()})
    ys = [y for t in fig.data for y in t.y or () if y and y > 0]
    fig.update_xaxes(type="log", tickvals=xs, ticktext=[f"{x:,g}" for x in xs])
    if ys and max(ys) > 10 * min(ys):
        fig.update_yaxes(type="log", dtick="D2")
    else:
        fig.update_yaxes(type="linear")
    return fig


def _lines(rows: list[dict], x: str) -> go.Figure:
    fig = go.Figure()
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = sorted((r for r in rows if r["label"] == label), key=lambda r: r[x])
        fig.add_scatter(x=[r[x] for r in mine], y=[r["step_s"] * 1e3 for r in mine],
                        mode="lines+markers", name=label,
                        customdata=[[r["compute_s"] * 1e3, r["arithmetic_s"] * 1e3, r["comm_s"] * 1e3]
                                    for r in mine],
                        hovertemplate="%{y:.2f} ms = compute %{customdata[0]:.2f} + arithmetic "
                                      "%{customdata[1]:.2f} + communication %{customdata[2]:.2f}"
                                      "<extra>" + label + "</extra>")
    return fig


def workers_figure(rows: list[dict], bandwidth_gbps: float) -> go.Figure:
    """Step time against the number of workers at one bandwidth."""
    mine = [r for r in rows if r["bandwidth_gbps"] == bandwidth_gbps]
    latency = mine[0]["latency_us"] if mine else 0
    return _layout(_lines(mine, "world_size"),
                   f"Step time vs workers · {bandwidth_gbps:g} Gb/s, {latency:g} µs/hop"
                   f"<br><sup>{SUBTITLE}</sup>", "workers (N)")


def bandwidth_figure(rows: list[dict], world_size: int) -> go.Figure:
    """Step time against link bandwidth on one number of workers."""
    mine = [r for r in rows if r["world_size"] == world_size]
    latency = mine[0]["latency_us"] if mine else 0
    return _layout(_lines(mine, "bandwidth_gbps"),
                   f"Step time vs bandwidth · {world_size} workers, {latency:g} µs/hop"
                   f"<br><sup>{SUBTITLE}</sup>", "link bandwidth, Gb/s")


def winner_map(cells: list[dict], against: str = "fp32 allreduce") -> go.Figure:
    """Which hook is fastest at each (workers, bandwidth), coloured by its speed-up over the
    baseline (``against``, as ``commlab.tune.baseline.title`` names it) on a log scale (speed-ups
    span decades: ×1.02 and ×40 both show), both axes logarithmic."""
    import math

    ns = sorted({c["world_size"] for c in cells})
    bws = sorted({c["bandwidth_gbps"] for c in cells})
    at = {(c["world_size"], c["bandwidth_gbps"]): c for c in cells}
    speedup = [[at[(n, b)]["speedup"] for n in ns] for b in bws]
    # No speed-up without the baseline among the profiles: the cell names the fastest, uncoloured.
    z = [[math.log10(max(v, 1.0)) if v else 0.0 for v in row] for row in speedup]
    # A cell holds a letter, not the setting's name: ten names side by side overlap; the key is
    # in the subtitle and the name in the hover.
    keys = {name: chr(ord("A") + i) for i, name in enumerate(dict.fromkeys(c["best"] for c in cells))}
    text = [[keys[at[(n, b)]["best"]] + (f"<br>×{v:.2f}" if v else "") for n, v in zip(ns, row)]
            for b, row in zip(bws, speedup)]
    names = [[at[(n, b)]["best"] for n in ns] for b in bws]
    legend = " · ".join(f"{k} = {name}" for name, k in keys.items())
    top = max([v for row in z for v in row] + [math.log10(2)])
    ticks = [t for t in (1, 1.1, 1.5, 2, 5, 10, 20, 50, 100, 1000) if math.log10(t) <= top * 1.05]
    fig = go.Figure(go.Heatmap(
        x=ns, y=bws, z=z, text=text, texttemplate="%{text}", textfont=dict(size=9), colorscale="Greens",
        zmin=0, zmax=top, colorbar=dict(title=dict(text=f"speed-up over {against}", side="right"),  # above: on the top tick
                                        tickvals=[math.log10(t) for t in ticks],
                                        ticktext=[f"×{t:g}" for t in ticks]),
        customdata=names, hovertemplate="N=%{x}, %{y} Gb/s: %{customdata}<extra></extra>"))
    fig.update_layout(title=style.title(f"Fastest hook by workers and bandwidth<br><sup>{legend}</sup>"
                                        f"<br><sup>{SUBTITLE}</sup>"),
                      xaxis_title="workers (N)", yaxis_title="bandwidth, Gb/s", height=480,
                      margin=dict(t=style.top_margin(3), b=10, l=10, r=10))
    fig.update_xaxes(type="log", tickvals=ns, ticktext=[f"{n:,}" for n in ns])
    fig.update_yaxes(type="log", tickvals=bws, ticktext=[f"{b:g}" for b in bws])
    return fig


def check_figure(rows: list[dict], tolerance: float = 0.2) -> go.Figure:
    """Predicted against measured step time for runs over emulated links, with the ±tolerance band."""
    top = max([r["measured_s"] for r in rows] + [r["predicted_s"] for r in rows] + [1e-3]) * 1e3 * 1.1
    fig = go.Figure()
    fig.add_scatter(x=[0, top], y=[0, top], mode="lines", name="predicted = measured",
                    line=dict(color="gray", dash="dot"))
    fig.add_scatter(x=[0, top, top, 0], y=[0, top * (1 + tolerance), top * (1 - tolerance), 0],
                    fill="toself", mode="none", name=f"±{tolerance:.0%}",
                    fillcolor="rgba(0,128,0,0.1)")
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label]
        fig.add_scatter(x=[r["measured_s"] * 1e3 for r in mine], y=[r["predicted_s"] * 1e3 for r in mine],
                        mode="markers", name=label, marker=dict(size=10),
                        text=[f"N={r['world_size']}, emulated {r['bandwidth_gbps']:g} Gb/s" for r in mine],
                        hovertemplate="%{text}<br>measured %{x:.1f} ms, predicted %{y:.1f} ms<extra></extra>")
    fig.update_layout(title="The model against runs over emulated links", height=420,
                      xaxis_title="measured step time, ms", yaxis_title="predicted step time, ms",
                      margin=dict(t=40, b=10, l=10, r=10))
    return fig
