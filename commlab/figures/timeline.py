"""One traced step, rank by rank: forward, backward and the optimizer step on each rank's compute row,
each bucket's hook call on it too, each bucket's collectives on its communication row, the part only
the emulated link held back drawn apart; on a sharded run, each unit's all-gathers, reduce-scatters
and all-reduces between replicas there instead, and the lab's hook between replicas on the compute
row.  Pure: a run's timeline.json in, plotly out."""
from __future__ import annotations

import plotly.graph_objects as go

from commlab.analysis import timeline

COLOURS = {"forward": "#c7e9c0", "backward": "#9ecae1", "optimizer": "#fdae6b", "averaging": "#e6550d",
           "hook": "#3182bd", "collective": "#31a354", "all_gather": "#756bb1", "reduce_scatter": "#e377c2",
           "measure": "#bcbd22", "other": "#969696", "link": "#d62728"}


def _key(e: dict) -> str:
    """A collective's bar: the hook's traffic, FSDP's by its kind, the lab's own by their traffic."""
    if e["category"] == "hook":
        return "collective"
    return e["collective"] if e["category"] == "sharding" else e["category"]


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
            label = timeline.where(e) or e["kind"]
            if e["kind"] in timeline.PHASES:
                groups[e["kind"]].append((compute, start, ms, f"{label}: {ms:.2f} ms"))
            elif e["kind"] == "collective":
                real = ms - e.get("link_s", 0.0) * 1e3
                kind = f" {e['collective']}" if "collective" in e else ""
                groups[_key(e)].append((comm, start, real, f"{label}{kind}, {e['bytes']:,} bytes: {ms:.2f} ms"))
                if e.get("link_s", 0) > 0:
                    groups["link"].append((comm, start + real, e["link_s"] * 1e3,
                                           f"{label}: the emulated link held it {e['link_s'] * 1e3:.2f} ms"))
    fig = go.Figure()
    names = {"forward": "forward", "backward": "backward", "optimizer": "optimizer step",
             "averaging": "model averaging (post-local SGD's, DiLoCo's outer step)",
             "hook": "hook call (gradients ready)",
             "collective": "hook's allreduce", "all_gather": "FSDP's all-gather (a unit's parameters)",
             "reduce_scatter": "FSDP's reduce-scatter (a unit's gradients)",
             "measure": "exact-mean allreduce (measurement)",
             "other": "mean-loss allreduce", "link": "emulated link"}
    if timeline.is_sharded(recorded["steps"]):
        names.update(hook="lab's hook between replicas (a unit's gradients reduce-scattered)",
                     collective="all-reduce between replicas (a unit's shard)")
    for key, rows in groups.items():
        _bar(fig, names[key], COLOURS[key], rows, pattern="/" if key == "link" else "")
    # The legend above the rows: below them it would sit on the x-axis title.
    fig.update_layout(barmode="overlay", height=160 + 60 * len(order), margin={"t": 30},
                      legend={"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
                      xaxis_title="ms from the step's first event")
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1])
    return fig


def caption(recorded: dict) -> str:
    """What ``step_figure`` draws, and the run's overlap share, in a sentence or three."""
    share = recorded.get("overlap_share")
    if not timeline.is_sharded(recorded["steps"]):
        return ("Bars over forward and the backward pass: each bucket's hook call (its gradients are ready) on "
                "the compute row, its allreduces on the communication row, the part only the emulated "
                "link held back hatched. Overlap share (communication hidden behind backward / all "
                "communication, over the traced steps and ranks): "
                + ("none communicated" if share is None else f"{share:.0%}") + ".")
    measured = ("not measured: no hook of the lab's ran (FSDP's collectives are not a hook's)"
                if share is None else f"{share:.0%}")
    return ("A sharded run: units, not buckets (each module fully_shard went on, named as in the "
            "model; root, the root's own parameters). On the communication row each unit's all-gather "
            "of its parameters in forward and, when resharded after forward, again in backward (FSDP "
            "prefetches it as the unit after it starts its backward), its reduce-scatter of "
            "the gradients, and on HSDP the all-reduce between replicas after it; on the compute row "
            "forward, backward and each call of the lab's hook between replicas. Overlap share (the "
            "all-reduces between replicas hidden behind backward's compute, over the traced steps "
            f"and ranks): {measured}.")
