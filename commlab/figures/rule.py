"""The compression rule as a table and a chart: which layers PowerSGD compresses, and what it saves."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from commlab.analysis.rule import RuleSummary
from commlab.figures import style

FP32_BYTES = 4
# Past this many layers the names no longer fit under the bars; they stay in the hover text.
_MAX_LABELLED_LAYERS = 60
_UPRIGHT_LAYERS = 8


def step_bytes(summary: RuleSummary, element_size: int = FP32_BYTES) -> dict[str, int]:
    """Bytes each rank hands to allreduce per step: PowerSGD's P, Q and uncompressed tensors,
    against plain allreduce of every gradient."""
    return {"powersgd": summary.numel_after * element_size,
            "allreduce": summary.numel_before * element_size}


# What the rule decided for a layer, as the table says it.
DECISIONS = {True: "compress: sends P and Q", False: "allreduce as is"}


def rule_frame(summary: RuleSummary) -> pd.DataFrame:
    """One row per layer: the decision and the two sides of the rule first (what the page is for),
    then the shape they come from and the elements before and after."""
    return pd.DataFrame([{
        "layer": d.name, "decision": DECISIONS[d.compressed], "n·m": d.rhs, "(n+m)·r·rate": d.lhs,
        "shape": "×".join(map(str, d.shape)) or "scalar", "n": d.n, "m": d.m, "r": d.r,
        "elements before": d.numel_before, "elements after": d.numel_after,
        "saved": d.numel_before - d.numel_after, "n × m is": d.layout} for d in summary.layers],
        columns=["layer", "decision", "n·m", "(n+m)·r·rate", "shape", "n", "m", "r",
                 "elements before", "elements after", "saved"]
        + (["n × m is"] if any(d.layout for d in summary.layers) else []))


def layer_kind(name: str) -> str:
    """A layer's name with its block numbers starred: gpt2-xl's 48 ``h.7.attn.c_attn.weight``
    are one kind, ``h.*.attn.c_attn.weight``."""
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


# How the chart's bars may be grouped: one per layer, per kind of layer, or the largest layers.
GROUPINGS = ("every layer", "by layer kind", "largest layers")
TOP_N = 20


def grouped(summary: RuleSummary, grouping: str = GROUPINGS[0], top: int = TOP_N) -> pd.DataFrame:
    """One row per bar: its name, elements sent and saved, and how many layers it holds.  By kind,
    in order of first appearance; the largest ``top`` layers by elements, the rest summed into
    one "other" bar."""
    df = pd.DataFrame({"name": [d.name for d in summary.layers],
                       "sent": np.array([d.numel_after for d in summary.layers], dtype=np.int64),
                       "before": np.array([d.numel_before for d in summary.layers], dtype=np.int64),
                       "compressed": [d.compressed for d in summary.layers]})
    df["layers"] = 1
    if grouping == GROUPINGS[1]:
        df["name"] = df["name"].map(layer_kind)
        df = df.groupby("name", sort=False, as_index=False).agg(
            sent=("sent", "sum"), before=("before", "sum"), compressed=("compressed", "all"),
            layers=("layers", "sum"))
    elif grouping == GROUPINGS[2] and len(df) > top:
        df = df.sort_values("before", ascending=False, kind="stable")
        rest = df.iloc[top:]
        other = pd.DataFrame([{"name": f"other {len(rest)} layers", "sent": rest["sent"].sum(),
                               "before": rest["before"].sum(), "compressed": rest["compressed"].all(),
                               "layers": len(rest)}])
        df = pd.concat([df.iloc[:top], other], ignore_index=True)
    elif grouping not in GROUPINGS:
        raise ValueError(f"unknown grouping {grouping!r}; groupings are: {', '.join(GROUPINGS)}")
    df["saved"] = df["before"] - df["sent"]
    return df.reset_index(drop=True)


def savings_figure(summary: RuleSummary, grouping: str = GROUPINGS[0], top: int = TOP_N) -> go.Figure:
    """Elements per bar (a layer, a kind of layer, or the largest layers: ``grouped``), split into
    what is still sent and what compression saves."""
    # Numpy arrays, not lists: plotly validates lists element by element, which for a 1.5B
    # model's 581 layers costs more than the rest of the page.
    df = grouped(summary, grouping, top)
    names = df["name"].to_numpy()
    status = np.where(df["compressed"], "compressed", "allreduced as is")
    status = np.array([f"{s} ({n:,} layers)" if n > 1 else s for s, n in zip(status, df["layers"])])
    hover = "%{x}<br>%{customdata}<br>%{y:,} elements<extra>%{fullData.name}</extra>"
    bars = [
        go.Bar(name="sent", x=names, y=df["sent"].to_numpy(), customdata=status,
               hovertemplate=hover, marker_color="#4C78A8"),
        go.Bar(name="saved by compression", x=names, y=df["saved"].to_numpy(), customdata=status,
               hovertemplate=hover, marker_color="#F58518")]
    labelled = len(names) <= _MAX_LABELLED_LAYERS
    # Upright names stand apart only while the bars are few; turned a full quarter, each takes
    # just its line's height, and neighbours at 45° would overlap.
    angle = -90 if len(names) > _UPRIGHT_LAYERS else None
    what = {"every layer": "per layer", "by layer kind": "per kind of layer (block numbers as *)",
            "largest layers": f"of the {top} largest layers"}[grouping]
    layout = dict(
        title=style.title(f"{summary.compressed_count} of {len(summary.layers):,} layers compressed: "
                          f"elements {what}, sent and saved"),
        barmode="stack", height=460, margin=dict(t=style.top_margin(), b=10),
        yaxis=dict(title="elements", separatethousands=True),
        xaxis=dict(showticklabels=labelled, automargin=True, tickangle=angle,
                   title="layer" if labelled else "layer (in registration order; hover for names)"),
        legend=dict(orientation="h", y=1.0, x=1, xanchor="right", yanchor="bottom"))
    return go.Figure(bars, layout)
