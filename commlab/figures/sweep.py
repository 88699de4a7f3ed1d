"""Figures of a sweep: each setting's quality (mean over seeds, the seeds as dots) against bytes
per step, measured time or the time predicted on a cluster, the Pareto front drawn; and the
quality curves by step that time to quality reads.

``pareto_figure`` takes the settings table (``commlab.tune.pareto.by_setting``, fronts marked)
and, for the seeds, the runs table (``Sweep.results()``); ``curves_figure`` the runs table.
"""
from __future__ import annotations

import plotly.graph_objects as go

from commlab.tune import baseline as baselines
from commlab.tune.pareto import FRONTS, against, comparable, usable
from commlab.tune.quality import BASIS_TEXT

# axis -> axis title
AXES = {"bytes_per_step": "bytes per step (handed over by the hook, mean over the run)",
        "time_s": "measured training time, s (start-up excluded)",
        "predicted_s": "predicted training time on the cluster, s"}
FRONT_OF = {axis: col for col, axis in FRONTS.items()}


def _short(label):
    return label.str.replace(r" \[.*\]$", "", regex=True)


def pareto_figure(table, axis: str = "bytes_per_step", recommended: str | None = None,
                  runs=None, cluster: str | None = None) -> go.Figure:
    """Every setting with a finished seed as a point (mean, ± one standard deviation over its
    seeds), each seed a small dot, the front joined, the baseline and the recommendation marked.

    Runs over an emulated link say so in the title: their measured times are the emulated network's.
    """
    ok = table[comparable(table) & table[axis].notna()] if len(table) else table
    fig = go.Figure()
    if len(ok):
        front = ok[ok[FRONT_OF[axis]]].sort_values(axis)
        fig.add_scatter(x=front[axis], y=front["quality_mean"], mode="lines", name="Pareto front",
                        line=dict(dash="dot", color="gray"))
        swept = ", ".join(dict.fromkeys(ok[~ok["baseline"].astype(bool)]["hook"].dropna())) or "compressed"
        base = baselines.title(against(ok))
        for is_base, name, symbol in ((True, f"{base} baseline", "square"),
                                      (False, f"{swept} settings", "circle")):
            part = ok[ok["baseline"] == is_base]
            fig.add_scatter(x=part[axis], y=part["quality_mean"], mode="markers+text", name=name,
                            text=_short(part["label"]), textposition="top center",
                            cliponaxis=False, marker=dict(size=11, symbol=symbol),
                            error_y=dict(type="data", array=part["quality_std"].fillna(0).tolist()),
                            customdata=part[["finished", "runs"]],
                            hovertemplate="%{text}<br>loss %{y:.4g} (mean of %{customdata[0]} of "
                                          "%{customdata[1]} seeds)<br>%{x:,.4g}<extra></extra>")
        if runs is not None and len(runs):
            seeds = runs[[usable(r) for r in runs.to_dict(orient="records")]]
            seeds = seeds[seeds["label"].isin(ok["label"]) & seeds[axis].notna()]
            fig.add_scatter(x=seeds[axis], y=seeds["quality"], mode="markers", name="each seed",
                            marker=dict(size=5, color="rgba(80,80,80,0.45)"),
                            text=_short(seeds["label"]) + " seed " + seeds["seed"].astype(str),
                            hovertemplate="%{text}<br>loss %{y:.4g}<extra></extra>")
        best = ok[ok["label"] == recommended]
        if len(best):
            fig.add_scatter(x=best[axis], y=best["quality_mean"], mode="markers", name="recommended",
                            marker=dict(size=22, symbol="star-open", line=dict(width=2)))
    links = sorted(set(table["link"])) if len(table) else []
    emulated = [lnk for lnk in links if lnk != "loopback"]
    title = {"bytes_per_step": "Loss against bytes per step", "time_s": "Loss against measured time",
             "predicted_s": f"Loss against predicted time{f' ({cluster})' if cluster else ''}"}[axis]
    if emulated and axis != "predicted_s":
        title += f" (runs over an {', '.join(emulated)} link)"
    basis = ", ".join(sorted(set(table["quality_basis"].dropna()))) if len(table) else ""
    fig.update_layout(title=dict(text=title, y=0.97), xaxis_title=AXES[axis],
                      yaxis_title=f"{basis or 'final'} loss (mean ± sd over seeds)",
                      height=440, margin=dict(t=70, b=10, l=10, r=10),
                      legend=dict(orientation="h", y=-0.22))
    if axis == "bytes_per_step":
        fig.update_xaxes(type="log")
    return fig


def curves_figure(runs, target: float | None = None) -> go.Figure:
    """Each run's quality by step (held-out evaluations, else the training loss's running mean),
    one colour per setting, its seeds in that colour; the target as a line."""
    fig = go.Figure()
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f", "#bcbd22", "#17becf"]
    settings = list(dict.fromkeys(runs["label"])) if len(runs) else []
    named: set[str] = set()  # one legend entry per setting, not per seed
    for row in runs.to_dict(orient="records") if len(runs) else []:
        c = row["curve"]
        if c is None or not c.steps:
            continue
        k = settings.index(row["label"])
        fig.add_scatter(x=list(c.steps), y=list(c.loss), mode="lines+markers" if len(c.steps) < 30
                        else "lines", name=row["label"], legendgroup=row["label"],
                        showlegend=row["label"] not in named,
                        line=dict(color=palette[k % len(palette)], width=1.5),
                        hovertemplate=f"{row['label']} seed {row['seed']}<br>step %{{x}}<br>"
                                      "loss %{y:.4g}<extra></extra>")
        named.add(row["label"])
    if target is not None:
        fig.add_hline(y=target, line_dash="dash", line_color="gray",
                      annotation_text=f"target {target:.4g}", annotation_position="top left")
    bases = sorted({r["quality_basis"] for r in runs.to_dict(orient="records")}) if len(runs) else []
    fig.update_layout(title=dict(text="Quality by step, every seed", y=0.97), xaxis_title="step",
                      yaxis_title="; ".join(BASIS_TEXT[b].split(" (")[0] for b in bases if b) or "loss",
                      height=440, margin=dict(t=70, b=10, l=10, r=10))
    return fig
