"""Figures and tables of the classroom: collectives before and after, the ring step by step
(an animated diagram with arrows, and a heat map), and how far apart replicas drift.  Pure:
results of ``commlab.teach.classroom`` in, plotly and pandas out."""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from commlab.teach import classroom
from commlab.teach import real_link as real_link_demo

PRESENTATION_FONT = 22  # px: legible from the back of a classroom on a projector
FRAME_MS = 1500  # how long the diagram shows each step when it plays


def present(fig: go.Figure, large: bool) -> go.Figure:
    """The figure with large text for presentation mode (taller, so the text still fits)."""
    if large:
        fig.update_layout(font_size=PRESENTATION_FONT, title_font_size=PRESENTATION_FONT + 4,
                          height=int((fig.layout.height or 400) * 1.4))
    return fig


def fmt(values) -> str:
    return ", ".join(f"{x:g}" for x in values)


def rank_table(result: classroom.CollectiveResult) -> pd.DataFrame:
    return pd.DataFrame([{"rank": r.rank, "before": fmt(r.before), "after": fmt(r.after),
                          "finished (ms after first)": r.finished_ms} for r in result.ranks])


def before_after_chart(result: classroom.CollectiveResult, title: str) -> go.Figure:
    """Every element of every rank's tensor before and after, each bar labelled with its value.

    all_gather's and reduce_scatter's results are longer and shorter than their inputs, so each
    side has its own x positions: rank r's i-th element before, and after.
    """
    fig = go.Figure()
    for when in ("before", "after"):
        x = [f"rank {r.rank}[{i}]" for r in result.ranks for i in range(len(getattr(r, when)))]
        y = [v for r in result.ranks for v in getattr(r, when)]
        fig.add_trace(go.Bar(name=when, x=x, y=y, text=[f"{v:g}" for v in y],
                             textposition="outside", cliponaxis=False))
    fig.update_layout(title=title, barmode="group", height=340, margin=dict(t=60, b=10),
                      uniformtext_minsize=8, uniformtext_mode="hide")
    return fig


def arrival_chart(result: classroom.CollectiveResult) -> go.Figure:
    finished = {r.rank: r.finished_ms for r in result.ranks}
    order = result.arrival_order
    fig = go.Figure(go.Bar(x=[finished[r] for r in order], y=[f"rank {r}" for r in order],
                           orientation="h", text=[f"{finished[r]:.2f} ms" for r in order]))
    fig.update_layout(title="When each rank finished (first at the top)",
                      xaxis_title="ms after the first rank", yaxis_autorange="reversed",
                      height=80 + 40 * len(order), margin=dict(t=40, b=10))
    return fig


def holdings_figure(trace: classroom.Trace, k: int) -> go.Figure:
    """Ranks x chunks after step k: the values, and how many ranks' data each chunk holds."""
    n, chunks = trace.world_size, range(len(trace.chunks))
    held = trace.initial if k == 0 else trace.steps[k - 1].holdings
    who = [[(r,)] * len(chunks) for r in range(n)] if k == 0 else trace.steps[k - 1].contributors
    fig = go.Figure(go.Heatmap(
        z=[[len(who[r][c]) for c in chunks] for r in range(n)],
        text=[[f"{fmt(held[r][c]) or '—'}<br>from {'+'.join(map(str, who[r][c]))}"
               for c in chunks] for r in range(n)],
        texttemplate="%{text}", zmin=1, zmax=n, colorscale="Blues",
        x=[f"chunk {c} [{a}:{b}]" for c, (a, b) in enumerate(trace.chunks)],
        y=[f"rank {r}" for r in range(n)], colorbar=dict(title=dict(text="ranks folded in", side="right"))))
    fig.update_layout(title="what each rank holds", yaxis_autorange="reversed",
                      height=120 + 45 * n, margin=dict(t=40, b=10))
    return fig


def transfers_table(trace: classroom.Trace, k: int) -> pd.DataFrame:
    moves = trace.steps[k - 1].transfers if k else ()
    return pd.DataFrame([{"from": t.src, "to": t.dst, "chunk": t.chunk, "values": fmt(t.values),
                          "bytes": t.nbytes, "receiver": t.action} for t in moves],
                        columns=["from", "to", "chunk", "values", "bytes", "receiver"])


def bytes_chart(ring: classroom.Trace, naive: classroom.Trace) -> go.Figure:
    ranks = [f"rank {r}" for r in range(ring.world_size)]
    fig = go.Figure([go.Bar(name=t.scheme, x=ranks, y=t.bytes_sent,
                            text=[f"{b} B" for b in t.bytes_sent], textposition="outside",
                            cliponaxis=False) for t in (ring, naive)])
    fig.update_layout(barmode="group", height=320, yaxis_title="bytes sent",
                      margin=dict(t=30, b=10))
    return fig


# ---------------------------------------------------------------------------- the ring, drawn
def _positions(n: int) -> list[tuple[float, float]]:
    """Ranks round a circle, rank 0 at the top, clockwise (the direction the ring sends)."""
    return [(math.sin(2 * math.pi * r / n), math.cos(2 * math.pi * r / n)) for r in range(n)]


def _holding_text(trace: classroom.Trace, k: int, r: int) -> str:
    held = trace.initial if k == 0 else trace.steps[k - 1].holdings
    return f"<b>rank {r}</b><br>" + " | ".join(fmt(c) or "—" for c in held[r])


def _arrows(trace: classroom.Trace, k: int) -> list[dict]:
    """One arrow per message of step k, src to dst, red when the receiver combines it with its
    own chunk, blue when it keeps it, labelled with the chunk and its values.

    Arrows and labels sit to the right of the direction of travel, inside the circle, so that
    two ranks sending to each other (two ranks, or rank 0 in the naive scheme) draw two arrows
    with a label each, and the labels stay clear of the ranks' holdings outside the circle.
    """
    if k == 0:
        return []
    pos, out = _positions(trace.world_size), []
    for t in trace.steps[k - 1].transfers:
        (x0, y0), (x1, y1) = pos[t.src], pos[t.dst]
        dx, dy = x1 - x0, y1 - y0
        length = math.hypot(dx, dy) or 1.0
        rx, ry = dy / length, -dx / length  # unit vector to the right of the direction
        tail = (x0 + 0.2 * dx + 0.05 * rx, y0 + 0.2 * dy + 0.05 * ry)
        head = (x1 - 0.2 * dx + 0.05 * rx, y1 - 0.2 * dy + 0.05 * ry)
        color = "#d62728" if t.action == "reduce" else "#1f77b4"
        out.append(dict(x=head[0], y=head[1], ax=tail[0], ay=tail[1], xref="x", yref="y",
                        axref="x", ayref="y", showarrow=True, arrowhead=3, arrowsize=1.4,
                        arrowwidth=2.5, arrowcolor=color, text=""))
        out.append(dict(x=(x0 + x1) / 2 + 0.2 * rx, y=(y0 + y1) / 2 + 0.2 * ry, xref="x",
                        yref="y", showarrow=False, font=dict(color=color),
                        bgcolor="rgba(255,255,255,0.85)", text=arrow_label(t)))
    return out


def arrow_label(t: classroom.Transfer) -> str:
    return f"c{t.chunk}: {fmt(t.values) or '—'}"


def _text_position(x: float, y: float) -> str:
    """Where a rank's holdings go: outside the circle, beside its node."""
    if y > 0.5:
        return "top center"
    if y < -0.5:
        return "bottom center"
    return "middle right" if x > 0 else "middle left"


def _title(trace: classroom.Trace, k: int) -> str:
    phase = trace.steps[k - 1].phase if k else "before anything moves"
    return (f"{trace.scheme}: step {k}/{len(trace.steps)}, {phase}<br><sup>red: the receiver "
            "combines the chunk with its own; blue: it keeps it</sup>")


def ring_diagram(trace: classroom.Trace, start: int = 0) -> go.Figure:
    """The ranks on a circle and, step by step, an arrow for every message: red when the
    receiver combines it with its own chunk, blue when it keeps it.  Plotly frames, a step
    slider and Play / Pause buttons: it plays by itself in the browser, one step every
    ``FRAME_MS``; ``start`` is the step shown first."""
    n, pos = trace.world_size, _positions(trace.world_size)
    steps = range(len(trace.steps) + 1)

    def nodes(k: int) -> go.Scatter:
        return go.Scatter(x=[p[0] for p in pos], y=[p[1] for p in pos], mode="markers+text",
                          marker=dict(size=30, color="#eef3fb", line=dict(width=2, color="#345")),
                          text=[_holding_text(trace, k, r) for r in range(n)],
                          textposition=[_text_position(*p) for p in pos],
                          hoverinfo="text", showlegend=False)

    frames = [go.Frame(name=str(k), data=[nodes(k)],
                       layout=go.Layout(annotations=_arrows(trace, k),
                                        title_text=_title(trace, k))) for k in steps]
    fig = go.Figure(data=[nodes(start)], frames=frames)
    play = dict(frame=dict(duration=FRAME_MS, redraw=True), fromcurrent=True,
                transition=dict(duration=0), mode="immediate")
    pause = dict(frame=dict(duration=0, redraw=False), mode="immediate")
    fig.update_layout(
        title_text=_title(trace, start), annotations=_arrows(trace, start),
        xaxis=dict(visible=False, range=[-2.6, 2.6]),
        yaxis=dict(visible=False, range=[-1.6 - 0.1 * n, 1.6 + 0.1 * n]),  # room for the text
        height=440 + 25 * n, margin=dict(t=70, b=10, l=10, r=10),
        updatemenus=[dict(type="buttons", direction="left", x=0, y=-0.02, xanchor="left",
                          yanchor="top", buttons=[
                              dict(label="▶ Play", method="animate", args=[None, play]),
                              dict(label="⏸ Pause", method="animate", args=[[None], pause])])],
        sliders=[dict(active=start, x=0.25, len=0.75, y=-0.02, yanchor="top",
                      # at the slider's right end: at its left the buttons' large text covered it
                      currentvalue=dict(prefix="step ", xanchor="right"),
                      steps=[dict(label=str(k), method="animate",
                                  args=[[str(k)], dict(frame=dict(duration=0, redraw=True),
                                                       mode="immediate")]) for k in steps])])
    return fig


def costs_table(size_mb: float, n: int) -> pd.DataFrame:
    rows = [{"scheme": c.scheme, "steps": c.steps, "MB per message": c.message_bytes / 1e6,
             "MB sent by the busiest rank": c.max_sent_bytes / 1e6,
             "serial MB (time on one link)": c.serial_bytes / 1e6}
            for c in classroom.scheme_costs(size_mb * 1e6, n)]
    return pd.DataFrame(rows)


def distance_chart(rows: pd.DataFrame) -> go.Figure:
    fig = go.Figure([go.Scatter(x=rows["step"], y=rows[f"distance_{v}"], name=name,
                                mode="lines+markers")
                     for v, name in (("no_allreduce", "no allreduce"),
                                     ("by_hand", "all_reduce by hand"), ("ddp", "DDP"))])
    fig.update_layout(title="How far apart the ranks' models are", xaxis_title="step",
                      yaxis_title="‖params(rank r) − params(rank 0)‖, farthest rank",
                      height=380, margin=dict(t=40, b=10))
    return fig


# ---------------------------------------------------------------------------- the real link
def real_link_table(demo: real_link_demo.Demonstration) -> pd.DataFrame:
    """One row per hook: its step, its bytes a step and what they take at the rate, and the kernel's
    count of rank 0's bytes against the ledger's (with DDP's broadcast, the headers and Gloo's
    control traffic, the terms ``commlab.analysis.kernel_bytes`` adds)."""
    rows = []
    for s in demo.sides:
        r0 = s.kernel[0]
        rows.append({"hook": s.hook, "ms per step": s.step_s * 1e3,
                     "KB on the wire a step (ledger)": s.wire_bytes / 1e3,
                     f"ms those bytes take at {demo.rate_mbps:g} Mb/s": demo.link_s(s) * 1e3,
                     "compression": f"{s.compression_ratio:.1f}x" if s.compression_ratio else "–",
                     "rank 0 sent, kernel (KB)": r0["kernel_bytes"] / 1e3,
                     "ledger + broadcast + headers (KB)": (r0["ledger_bytes"] + r0["ddp_broadcast"]
                                                           + r0["headers"]) / 1e3,
                     "control (KB)": r0["control"] / 1e3,
                     "kernel = ledger?": "yes" if s.agree else "NO"})
    return pd.DataFrame(rows)


def real_link_chart(demo: real_link_demo.Demonstration) -> go.Figure:
    """Each hook's median step on the real link, and beneath it what its bytes alone take at the
    rate: the part of the step the link costs."""
    hooks = [s.hook for s in demo.sides]
    step = [s.step_s * 1e3 for s in demo.sides]
    link = [demo.link_s(s) * 1e3 for s in demo.sides]
    fig = go.Figure([go.Bar(x=hooks, y=step, name="measured step", text=[f"{v:.1f} ms" for v in step],
                            textposition="outside"),
                     go.Bar(x=hooks, y=link, name=f"its bytes at {demo.rate_mbps:g} Mb/s",
                            text=[f"{v:.1f} ms" for v in link], textposition="outside")])
    fig.update_layout(title=f"One training step on a real {demo.rate_mbps:g} Mb/s link",
                      yaxis_title="median ms per step", yaxis_range=[0, max(step + link) * 1.25],
                      barmode="group", height=380, margin=dict(t=60, b=10))
    return fig
