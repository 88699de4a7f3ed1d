"""The Compression rule page's "A run" source without Streamlit: the runs whose folder recorded the
rule (layers.json, what the run's hook decided layer by layer), and the shapes and settings the page
recomputes the rule from.

A DDP run's rows are its parameters; an HSDP run with the lab's hook between replicas records the
rule on each rank's dim-0 shards (``commlab.analysis.rule.on_shards``), so its rows are those
shards, named ``0.weight [shard 0 of 2]``: the page shows them as it shows any model's layers."""
from __future__ import annotations

from dataclasses import dataclass

from commlab.config_fields import lab_between_replicas
from commlab.engine import run_folder
from commlab.ui import runs


def choices(runs_dir: str | None = None) -> list[dict]:
    """The run picker's choices (``runs.run_choices``) whose folder holds the rule's decisions."""
    return [c for c in runs.run_choices(runs_dir) if run_folder.RunFolder(c["path"]).layers()]


@dataclass
class Recorded:
    """What the page takes from one run's rule."""

    shapes: list[tuple[str, tuple[int, ...]]]  # the rows, as the run named them
    layouts: dict[str, str]  # rows whose matrix is held in × out (``rule.layouts``)
    rank: int  # the run's matrix_approximation_rank
    rate: float  # and min_compression_rate: the page's sliders start there
    applied: bool  # whether the run's hook applied the rule (layers.json's ``applies``)
    on_shards: bool  # whether the rows are each rank's shards (HSDP with the lab's hook)
    decisions: dict[str, bool]  # row -> compressed, as the run recorded it


def recorded(run_dir: str) -> Recorded:
    run = run_folder.RunFolder(run_dir)
    layers, cfg = run.layers(), run.config_dict()
    return Recorded([(d["name"], tuple(d["shape"])) for d in layers],
                    {d["name"]: d["layout"] for d in layers if d.get("layout")},
                    int(cfg.get("matrix_approximation_rank", 1)), float(cfg.get("min_compression_rate", 2.0)),
                    any(d.get("applies") for d in layers), lab_between_replicas(run.config()),
                    {d["name"]: bool(d.get("compressed")) for d in layers})
