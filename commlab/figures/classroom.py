"""Figures and tables of the classroom: collectives before and after, the ring step by step,
and how far apart replicas drift.  Pure: results of ``commlab.teach.classroom`` in, plotly and pandas out."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from commlab.teach import classroom


def fmt(values) -> str:
    return ", ".join(f"{x:g}" for x in values)


def rank_table(result: classroom.CollectiveResult) -> pd.DataFrame:
    return pd.DataFrame([{"rank": r.rank, "before": fmt(r.before), "after": fmt(r.after),
                          "finished (ms after first)": r.finished_ms} for r in result.ranks])


def before_after_chart(result: classroom.CollectiveResult, title: str) -> go.Figure:
    labels = [f"rank {r.rank}" + (f"[{i}]" if len(r.before) > 1 else "")
              for r in result.ranks for i in range(len(r.before))]
    fig = go.Figure([go.Bar(name=when, x=labels,
                            y=[x for r in result.ranks for x in getattr(r, when)])
                     for when in ("before", "after")])
    fig.update_layout(title=title, barmode="group", height=320, margin=dict(t=40, b=10))
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
        y=[f"rank {r}" for r in range(n)], colorbar=dict(title="ranks<br>folded in")))
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
    fig = go.Figure([go.Bar(name=t.scheme, x=ranks, y=t.bytes_sent) for t in (ring, naive)])
    fig.update_layout(barmode="group", height=300, yaxis_title="bytes sent",
                      margin=dict(t=20, b=10))
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
