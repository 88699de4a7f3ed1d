"""Figures of the bandwidth and headroom measurements: nccl-tests' table, busbw by message size
against the memory-copy ceiling, time per call, and noop against allreduce.  Pure: results in,
plotly/pandas out."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from commlab.teach import bench, headroom

MODES = (("out_of_place", "out-of-place"), ("in_place", "in-place"))


def bench_table(result: bench.BenchResult) -> pd.DataFrame:
    """nccl-tests' columns: size and count, then time, algbw, busbw and #wrong out-of-place and
    in-place, and the memory-copy rate of the same bytes beside them."""
    rows = []
    for r in result.rows:
        row = {"collective": r.collective, "size": r.size, "bytes": r.size_bytes,
               "count (float32)": r.count, "iters": r.iters}
        for attr, mode in MODES:
            t = getattr(r, attr)
            row |= {f"{mode} time (µs)": t.time_us, f"{mode} algbw (GB/s)": t.algbw_gbytes_s,
                    f"{mode} busbw (GB/s)": t.busbw_gbytes_s, f"{mode} #wrong": t.wrong}
        rows.append(row | {"memcpy (GB/s)": r.memcpy_gbytes_s})
    return pd.DataFrame(rows)


def _size_axis(fig: go.Figure, table: pd.DataFrame) -> None:
    ticks = table.drop_duplicates("size").sort_values("bytes")
    fig.update_xaxes(type="log", title="message size S", tickvals=ticks["bytes"],
                     ticktext=ticks["size"])


def bandwidth_chart(table: pd.DataFrame, backend: str) -> go.Figure:
    """busbw of every collective, out-of-place solid and in-place dotted, under the memory-copy
    ceiling; the y axis is logarithmic, because the ceiling lies decades above Gloo's busbw."""
    fig = go.Figure()
    for collective, rows in table.groupby("collective", sort=False):
        for _attr, mode in MODES:
            fig.add_trace(go.Scatter(
                x=rows["bytes"], y=rows[f"{mode} busbw (GB/s)"], mode="lines+markers",
                name=f"{collective} ({mode})", legendgroup=collective,
                line=dict(dash="solid" if mode == "out-of-place" else "dot")))
    ceiling = table.drop_duplicates("bytes").sort_values("bytes")
    fig.add_trace(go.Scatter(x=ceiling["bytes"], y=ceiling["memcpy (GB/s)"], mode="lines+markers",
                             name="memory copy (ceiling)", line=dict(dash="dash", color="black")))
    fig.update_layout(title=f"busbw against message size ({backend}; log scale)",
                      yaxis_type="log", yaxis_title="GB/s (1e9 bytes per second)", height=460,
                      margin=dict(t=60, b=10))
    _size_axis(fig, table)
    return fig


def time_chart(table: pd.DataFrame) -> go.Figure:
    fig = go.Figure([go.Scatter(x=rows["bytes"], y=rows["out-of-place time (µs)"],
                                mode="lines+markers", name=collective)
                     for collective, rows in table.groupby("collective", sort=False)])
    fig.update_layout(title="Time per call (out-of-place)", yaxis_type="log", yaxis_title="µs",
                      height=380, margin=dict(t=60, b=10))
    _size_axis(fig, table)
    return fig


def headroom_chart(h: headroom.Headroom) -> go.Figure:
    """Median step time with allreduce and with noop, each bar labelled with its value."""
    ms = [h.step_s_allreduce * 1e3, h.step_s_noop * 1e3]
    fig = go.Figure(go.Bar(x=["allreduce", "noop"], y=ms, text=[f"{v:.2f} ms" for v in ms],
                           textposition="outside"))
    fig.update_layout(title=f"{headroom.SAVED_LABEL}: {h.saved:.0%}",
                      yaxis_title="median ms per step", yaxis_range=[0, max(ms) * 1.2],
                      height=320, margin=dict(t=60, b=10))
    return fig
