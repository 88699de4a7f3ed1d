"""Figures of the bandwidth and headroom measurements: time and algbw/busbw by message size
against the memory-copy ceiling, and noop against allreduce.  Pure: results in, plotly/pandas out."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from commlab.teach import bench


def bench_table(result: bench.BenchResult) -> pd.DataFrame:
    return pd.DataFrame([{"size": r.size, "bytes": r.size_bytes, "iters": r.iters,
                          "time (µs)": r.time_us, "algbw (GB/s)": r.algbw_gbps,
                          "busbw (GB/s)": r.busbw_gbps, "memcpy (GB/s)": r.memcpy_gbps}
                         for r in result.rows])


def bandwidth_chart(table: pd.DataFrame, backend: str) -> go.Figure:
    fig = go.Figure([
        go.Scatter(x=table["bytes"], y=table["busbw (GB/s)"], name=f"busbw ({backend})",
                   mode="lines+markers"),
        go.Scatter(x=table["bytes"], y=table["algbw (GB/s)"], name="algbw", mode="lines+markers"),
        go.Scatter(x=table["bytes"], y=table["memcpy (GB/s)"], name="memory copy (ceiling)",
                   mode="lines+markers", line=dict(dash="dash"))])
    fig.update_layout(title="Bandwidth against message size", xaxis_type="log",
                      xaxis_title="message size (bytes)", yaxis_title="GB/s", height=420,
                      margin=dict(t=40, b=10))
    fig.update_xaxes(tickvals=table["bytes"], ticktext=table["size"])
    return fig


def time_chart(table: pd.DataFrame) -> go.Figure:
    fig = go.Figure(go.Scatter(x=table["bytes"], y=table["time (µs)"], mode="lines+markers",
                               name="one allreduce"))
    fig.update_layout(title="Time per allreduce", xaxis_type="log", yaxis_type="log",
                      xaxis_title="message size (bytes)", yaxis_title="µs", height=360,
                      margin=dict(t=40, b=10))
    fig.update_xaxes(tickvals=table["bytes"], ticktext=table["size"])
    return fig


def headroom_chart(h) -> go.Figure:
    """Median step time with allreduce and with noop (``commlab.teach.headroom.Headroom``)."""
    fig = go.Figure(go.Bar(x=["allreduce", "noop"], y=[h.step_s_allreduce * 1e3, h.step_s_noop * 1e3]))
    fig.update_layout(yaxis_title="median ms per step", height=300, margin=dict(t=20, b=10))
    return fig
