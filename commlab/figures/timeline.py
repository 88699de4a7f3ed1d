"""One traced step, rank by rank: backward and the optimizer step on each rank's compute row, each
bucket's hook call on it too, each bucket's collectives on its communication row, the part only the
emulated link held back drawn apart.  Pure: a run's timeline.json in, plotly out."""
from __future__ import annotations

import plotly.graph_objects as go

from commlab.analysis import timeline

COLOURS = {"backward": "#9ecae1", "optimizer": "#fdae6b", "averaging": "#e6550d", "hook": "#3182bd",
           "collective": "#31a354", "measure": "#bcbd22", "other": "#969696",
           "link": "#d62728"}


def _bar(fig: go.Figure, name: str, colour: str, rows: list[tuple[str, float, float, str]],
         pattern: str = "") -> None:
    if not rows:
        return
    fig.add_bar(name=name, orientation="h", y=[r[0] for r in rows], base=[r[1] for r in rows],
                x=[r[2] for r in rows], hovertext=[r[3] for r in rows], hoverinfo="text+name",
                marker={"color": colour, "pattern": {"shape": pattern}})


def step_figure(recorded: dict, step: str) -> go.Figure:
    """``recorded`` is ``RunFolder.timeline()``; times in ms from the step's earliest event."""
    ranks = recorded["steps"][step]
    t0 = min(e["start"] for events in ranks.values() for e in events)
    groups: dict[str, list] = {k: [] for k in COLOURS}
    order = []
    for rank in sorted(ranks, key=int):
        compute, comm = f"rank {rank} compute", f"rank {rank} comm"
        order += [compute, comm]
        for e in ranks[rank]:
            start, ms = (e["start"] - t0) * 1e3, (e["end"] - e["start"]) * 1e3
            bucket = e.get("bucket")
            label = f"bucket {bucket}" if bucket is not None else e["kind"]
            if e["kind"] in timeline.PHASES:
                groups[e["kind"]].append((compute, start, ms, f"{label}: {ms:.2f} ms"))
            elif e["kind"] == "collective":
                key = "collective" if e["category"] == "hook" else e["category"]
                real = ms - e.get("link_s", 0.0) * 1e3
                groups[key].append((comm, start, real, f"{label}, {e['bytes']:,} bytes: {ms:.2f} ms"))
                if e.get("link_s", 0) > 0:
                    groups["link"].append((comm, start + real, e["link_s"] * 1e3,
                                           f"{label}: the emulated link held it {e['link_s'] * 1e3:.2f} ms"))
    fig = go.Figure()
    names = {"backward": "backward", "optimizer": "optimizer step",
             "averaging": "model averaging (post-local SGD's, DiLoCo's outer step)",
             "hook": "hook call (gradients ready)",
             "collective": "hook's allreduce", "measure": "exact-mean allreduce (measurement)",
             "other": "mean-loss allreduce", "link": "emulated link"}
    for key, rows in groups.items():
        _bar(fig, names[key], COLOURS[key], rows, pattern="/" if key == "link" else "")
    # The legend above the rows: below them it would sit on the x-axis title.
    fig.update_layout(barmode="overlay", height=160 + 60 * len(order), margin={"t": 30},
                      legend={"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
                      xaxis_title="ms from the step's first event")
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1])
    return fig
