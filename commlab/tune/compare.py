"""Every algorithm side by side on one workload, as GRACE's tables compare compressors (pure).

One row per run: its quality, what it handed over per step, how long a step took here, and what
the what-if model (``commlab.tune.whatif``) predicts a step would take on a chosen cluster.

* quality: the final held-out loss where the run evaluated (``commlab.tune.quality.curve``), else
  the training loss's mean over the last ``quality.WINDOW`` steps; ``basis`` says which, and rows
  of different bases are not to be ranked against each other (``bases`` names the mix);
* bytes per step: what the byte counter counted per rank and step (the allreduce payload that puts
  as many bytes on the wire), the median over the steady steps (post-local SGD's: the mean, as its
  model averaging comes once a period); ``compression_ratio`` is DDP's plain allreduce bytes over
  it, so an allgather counts what it really sends;
* ``wire_bytes``: what each rank would send per step on the chosen cluster: an allgather's grows
  with the ranks, an allreduce's does not;
* measured step: the median over the steady steps of this machine's step time;
* predicted step: ``HookProfile.step_s`` on the chosen cluster (``quality.Cluster``), None when the
  run has no steady steps to profile.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from commlab.analysis import metrics
from commlab.config import label_of
from commlab.tune import quality, whatif
from commlab.tune.quality import Cluster

COLUMNS = ("label", "hook", "basis", "quality", "heldout_accuracy", "heldout_bits_per_char",
           "bytes_per_step", "compression_ratio", "wire_bytes", "median_step_s",
           "predicted_step_s", "overlap_share", "steady_steps", "run_id")


@dataclass(frozen=True)
class Entry:
    """What the table reads of one run (``entries`` loads it from run folders)."""

    run_id: str
    cfg: dict
    records: list[dict]
    evals: list[dict] = field(default_factory=list)


def table(entries: Sequence[Entry], profiles: Sequence[whatif.HookProfile],
          cluster: Cluster = Cluster()) -> list[dict]:
    """One row per entry, in the entries' order (``COLUMNS``); ``profiles`` by their run_id.

    ValueError when the entries are of more than one workload: a loss is only comparable on one.
    """
    workloads = sorted({str(e.cfg.get("workload")) for e in entries})
    if len(workloads) > 1:
        raise ValueError(f"runs of one workload only, got {', '.join(workloads)}: losses of "
                         "different models do not compare")
    if errs := cluster.errors():
        raise ValueError("; ".join(f"{k} {v}" for k, v in errs.items()))
    by_run = {p.run_id: p for p in profiles}
    return [_row(e, by_run.get(e.run_id), cluster) for e in entries]


def _row(e: Entry, profile: whatif.HookProfile | None, cluster: Cluster) -> dict:
    c = quality.curve(e.evals, e.records)
    head = metrics.headline(e.records, e.cfg)
    steady = metrics.steady_rows(e.records, e.cfg)
    nbytes = profile.payload_bytes if profile else head["bytes_per_step"]
    plain = metrics.median(steady, "plain_bytes")
    final = c.final
    return {
        "label": profile.label if profile else label_of(e.cfg, link=True), "hook": e.cfg.get("hook"),
        "basis": c.basis, "quality": final if final is not None and math.isfinite(final) else None,
        "diverged": quality.diverged(c, e.records),
        "heldout_accuracy": c.accuracy, "heldout_bits_per_char": c.bits_per_char,
        "bytes_per_step": nbytes,
        "compression_ratio": plain / nbytes if plain and nbytes else None,
        "wire_bytes": profile.wire_bytes(cluster.world_size) if profile else None,
        "median_step_s": head["median_step_s"],
        "predicted_step_s": profile.step_s(cluster.world_size, cluster.bandwidth_gbps,
                                           cluster.latency_us) if profile else None,
        "overlap_share": profile.overlap_share if profile else None,
        "steady_steps": head["steady_steps"], "run_id": e.run_id,
    }


def bases(rows: Sequence[dict]) -> str:
    """What the quality column is, in words: one basis, or the mix (which is not to be ranked)."""
    found = sorted({r["basis"] for r in rows})
    if len(found) == 1:
        return quality.BASIS_TEXT[found[0]]
    return ("mixed: " + "; ".join(f"{b} for {sum(r['basis'] == b for r in rows)} run(s)" for b in found)
            + " — these do not rank against each other")


# ============================================================================ from run folders
def entries(runs: Sequence) -> list[Entry]:
    """Entries of ``RunFolder``s (or ``Run``s)."""
    return [Entry(r.id, r.config_dict(), r.metrics_records(), r.evals()) for r in runs]


def compare_runs(runs: Sequence, cluster: Cluster = Cluster()) -> list[dict]:
    """``table`` of run folders; the what-if profiles share a plain allreduce run's compute time
    where the runs hold one (``whatif.profiles_from_runs``)."""
    runs = list(runs)
    return table(entries(runs), whatif.profiles_from_runs(runs), cluster)
