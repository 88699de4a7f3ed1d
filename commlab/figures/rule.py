"""The compression rule as a table and a chart: which layers PowerSGD compresses, and what it saves."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from commlab.analysis.rule import RuleSummary

FP32_BYTES = 4
# Past this many layers the names no longer fit under the bars; they stay in the hover text.
_MAX_LABELLED_LAYERS = 60


def step_bytes(summary: RuleSummary, element_size: int = FP32_BYTES) -> dict[str, int]:
    """Bytes each rank hands to allreduce per step: PowerSGD's P, Q and uncompressed tensors,
    against plain allreduce of every gradient."""
    return {"powersgd": summary.numel_after * element_size,
            "allreduce": summary.numel_before * element_size}


def human_bytes(n: float) -> str:
    """Decimal units (1 kB = 1000 B), as link bandwidths are quoted."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000


def rule_frame(summary: RuleSummary) -> pd.DataFrame:
    """One row per layer with both sides of the rule and the elements before and after."""
    return pd.DataFrame([{
        "layer": d.name, "shape": "×".join(map(str, d.shape)) or "scalar", "n": d.n, "m": d.m,
        "r": d.r, "(n+m)·r·rate": d.lhs, "n·m": d.rhs, "compressed": d.compressed,
        "elements before": d.numel_before, "elements after": d.numel_after,
        "saved": d.numel_before - d.numel_after} for d in summary.layers],
        columns=["layer", "shape", "n", "m", "r", "(n+m)·r·rate", "n·m", "compressed",
                 "elements before", "elements after", "saved"])


def savings_figure(summary: RuleSummary) -> go.Figure:
    """Each layer's elements, split into what is still sent and what compression saves."""
    # Numpy arrays, not lists: plotly validates lists element by element, which for a 1.5B
    # model's 581 layers costs more than the rest of the page.
    names = np.array([d.name for d in summary.layers])
    sent = np.array([d.numel_after for d in summary.layers], dtype=np.int64)
    saved = np.array([d.numel_before for d in summary.layers], dtype=np.int64) - sent
    status = np.array(["compressed" if d.compressed else "allreduced as is" for d in summary.layers])
    hover = "%{x}<br>%{customdata}<br>%{y:,} elements<extra>%{fullData.name}</extra>"
    bars = [
        go.Bar(name="sent", x=names, y=sent, customdata=status, hovertemplate=hover,
               marker_color="#4C78A8"),
        go.Bar(name="saved by compression", x=names, y=saved, customdata=status,
               hovertemplate=hover, marker_color="#F58518")]
    labelled = len(names) <= _MAX_LABELLED_LAYERS
    layout = dict(
        title=f"{summary.compressed_count} of {len(names)} layers compressed: elements per layer, "
              "sent and saved",
        barmode="stack", height=420, margin=dict(t=40, b=10), yaxis=dict(title="elements"),
        xaxis=dict(showticklabels=labelled,
                   title="layer" if labelled else "layer (in registration order; hover for names)"),
        legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    return go.Figure(bars, layout)
