"""Every algorithm side by side on one workload, as GRACE's tables compare compressors (pure).

One row per run: its quality, what it handed over per step, how long a step took here, and what
the what-if model (``commlab.tune.whatif``) predicts a step would take on a chosen cluster.

* quality: the final held-out loss where the run evaluated (``commlab.tune.quality.curve``), else
  the training loss's mean over the last ``quality.WINDOW`` steps; ``basis`` says which, and rows
  of different bases are not to be ranked against each other (``bases`` names the mix);
* the baseline: every ratio, speed-up and break-even is against one (``against``: fp32, fp16 or
  bf16 allreduce, ``commlab.tune.baseline``), whose run (the first among the entries) the rows
  mark (``baseline``);
* bytes per step: what the byte counter counted per rank and step (the allreduce payload that puts
  as many bytes on the wire), the median over the steady steps (post-local SGD's: the mean, as its
  model averaging comes once a period); ``compression_ratio`` is the baseline's bytes over it, so
  an allgather counts what it really sends: for fp32 allreduce, DDP's plain allreduce bytes as
  each run's counter counted them (no allreduce run needed), for a 16-bit baseline its run's own;
* ``wire_bytes``: what each rank would send per step on the chosen cluster: an allgather's grows
  with the ranks, an allreduce's does not;
* measured step: the median over the steady steps of this machine's step time;
* predicted step: ``HookProfile.step_s`` on the chosen cluster (``quality.Cluster``), None when the
  run has no steady steps to profile; ``speedup``: the baseline's predicted step over it;
* ``pays``: does it pay here? (``commlab.tune.payoff``): the bandwidth below which it beats the
  baseline in step time on the cluster's world size and latency, or never, or always.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from commlab.analysis import metrics
from commlab.config import label_of
from commlab.tune import baseline as baselines
from commlab.tune import payoff, quality, whatif
from commlab.tune.quality import Cluster

COLUMNS = ("label", "hook", "basis", "quality", "heldout_accuracy", "heldout_bits_per_char",
           "bytes_per_step", "compression_ratio", "wire_bytes", "median_step_s",
           "predicted_step_s", "speedup", "pays", "break_even_gbps", "overlap_share", "steady_steps",
           "run_id")


@dataclass(frozen=True)
class Entry:
    """What the table reads of one run (``entries`` loads it from run folders)."""

    run_id: str
    cfg: dict
    records: list[dict]
    evals: list[dict] = field(default_factory=list)


def table(entries: Sequence[Entry], profiles: Sequence[whatif.HookProfile],
          cluster: Cluster = Cluster(), against: str = baselines.DEFAULT) -> list[dict]:
    """One row per entry, in the entries' order (``COLUMNS``); ``profiles`` by their run_id; judged
    against the baseline ``against`` (its first run among the entries).

    ValueError when the entries are of more than one workload: a loss is only comparable on one;
    ConfigError (a ValueError) for a baseline that is none.
    """
    baselines.check(against)
    workloads = sorted({str(e.cfg.get("workload")) for e in entries})
    if len(workloads) > 1:
        raise ValueError(f"runs of one workload only, got {', '.join(workloads)}: losses of "
                         "different models do not compare")
    if errs := cluster.errors():
        raise ValueError("; ".join(f"{k} {v}" for k, v in errs.items()))
    by_run = {p.run_id: p for p in profiles}
    base = next((e for e in entries if baselines.is_baseline(e.cfg, against)), None)
    base_profile = by_run.get(base.run_id) if base else None
    base_bytes = _bytes(base, base_profile) if base else None
    rows = []
    for e in entries:
        profile = by_run.get(e.run_id)
        reference = metrics.median(metrics.steady_rows(e.records, e.cfg), "plain_bytes") \
            if against == baselines.BASELINE else base_bytes
        rows.append({**_row(e, profile, cluster, reference), "baseline": e is base, "against": against,
                     **payoff.judged(base_profile, profile, cluster, against)})
        del rows[-1]["payoff"]  # one run per row: its sentence says it all
    return rows


def _bytes(e: Entry, profile: whatif.HookProfile | None) -> float | None:
    """Bytes per step: the profile's (steady, per period for post-local SGD), else the headline's."""
    return profile.payload_bytes if profile else metrics.headline(e.records, e.cfg)["bytes_per_step"]


def _row(e: Entry, profile: whatif.HookProfile | None, cluster: Cluster, reference: float | None) -> dict:
    c = quality.curve(e.evals, e.records)
    head = metrics.headline(e.records, e.cfg)
    nbytes = _bytes(e, profile)
    final = c.final
    return {
        "label": profile.label if profile else label_of(e.cfg, link=True), "hook": e.cfg.get("hook"),
        "basis": c.basis, "quality": final if final is not None and math.isfinite(final) else None,
        "diverged": quality.diverged(c, e.records),
        "heldout_accuracy": c.accuracy, "heldout_bits_per_char": c.bits_per_char,
        "bytes_per_step": nbytes,
        "compression_ratio": reference / nbytes if reference and nbytes else None,
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


def compare_runs(runs: Sequence, cluster: Cluster = Cluster(), against: str = baselines.DEFAULT) -> list[dict]:
    """``table`` of run folders; the what-if profiles share a plain allreduce run's compute time
    where the runs hold one (``whatif.profiles_from_runs``)."""
    runs = list(runs)
    return table(entries(runs), whatif.profiles_from_runs(runs), cluster, against)


def missing(rows: Sequence[dict], against: str) -> str | None:
    """Why the rows judge nothing against ``against``: no run of it among them; None when one is."""
    if any(r["baseline"] for r in rows):
        return None
    return (f"no {baselines.title(against)} run among these, so what needs its run stays blank "
            f"(the speed-up, the break-even; a 16-bit baseline's ratio): add one, or run "
            f"`commlab compare --hooks HOOK,... --against {against}`, which runs it")
