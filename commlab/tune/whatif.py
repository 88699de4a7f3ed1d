"""What a training step would cost at other scales: an alpha-beta model fed by measured runs.

For one hook on N workers joined by links of bandwidth beta and per-hop latency alpha, a step is

    T(N, beta, alpha) = compute + arithmetic + sum over the hook's collectives i of ring(S_i)
    ring(S)           = 2(N-1) alpha + 2(N-1)/N S / beta

* ``compute``: what a step costs outside the hook (forward, backward, optimizer), measured in a
  run as the median over its steady steps of ``step_s - hook_s``;
* ``arithmetic``: what the hook costs besides moving bytes (PowerSGD's products, orthogonalization
  and error feedback; fp16's casts): the hook's measured time less the time its collectives took
  on the link the run used, as the run recorded it (``collective_s``: from issue to completion,
  which holds the wait for slower ranks; counted as arithmetic it would be paid again on top of
  an emulated link's hold, inside which it passes);
* ``S_i``: the bytes the hook handed to ``all_reduce``, from the run's own count.  PowerSGD's P and
  Q do not grow with N, nor does the plain gradient, so the count carries over to any scale.

``ring`` is the cost of a ring allreduce (``commlab.analysis.ring.allreduce_s``); a hook whose
collectives are allgathers (the quantization hooks, the sparsifiers, QSGD, the sign methods) pays
instead, for s bytes from each of N ranks, (N-1) alpha + (N-1) s / beta (``ring.collective_s``): s
is read back from the run's count (``ring.message_bytes``) and does not grow with N, but what each
rank receives does.  Post-local SGD pays its gradient allreduce within a subgroup of fixed size
(``localsgd_subgroup_size``), which does not grow with N, and its model averaging, one allreduce
of the parameters over all ranks every ``averager_period`` steps, averaged over the period: one
step in a period averages, so its per-step figures (bytes, times, measured or predicted) are the
median over whole periods of each period's mean (``metrics.per_step``, as a run's headline bytes
are), from the first period that local SGD and averaging both cover.  DiLoCo averages the same
way, every ``sync_every`` steps from its first: its outer collective carries the pseudo-gradient in
its outer precision, as the run counted it (int8 codes and scales by allgather, whose bytes
received grow with N).  The formulas are those the emulated link (``Link.seconds`` in
``commlab.hooks.instrument``) enforces: a run over an emulated link is a measurement of this
model.  Summed over collectives it stays linear, so a hook is summarized by its bytes and its
collective count per step, medians over the run's steady steps
(``commlab.analysis.metrics.steady_rows``, strictly: a profile describes the hook as configured,
so it takes no start-up step and, for PowerSGD, no step before compression started).

Assumptions, stated where results are shown: communication overlaps computation by the share a
run measured at its steady traced steps (``overlap_share``, ``commlab.analysis.timeline``: the part
of the hook's communication hidden behind backward), so a step pays ``(1 - overlap_share) * comm``;
a run with no such trace is taken not to overlap at all (exact with one bucket, where DDP calls the
hook after the last gradient; with several buckets the part of backward that runs inside the
hook's window counts as communication, an upper bound).  Every
worker keeps its batch (weak scaling), so compute and arithmetic do not change with N; one flat
ring whose slowest link has bandwidth beta.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from commlab.analysis import metrics, ring, timeline
from commlab.config import is_plain_allreduce, label_of, link_of
from commlab.hook_specs import ALLGATHER, OUTER_PRECISIONS, spec_of
from commlab.tune import baseline as baselines
from commlab.tune import sharded_whatif

WORLD_SIZES = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
BANDWIDTHS_GBPS = (1, 2, 5, 10, 25, 50, 100, 200, 400)
DEFAULT_LATENCY_US = 5.0


# ============================================================================ the model (pure)
@dataclass(frozen=True)
class HookProfile:
    """What one hook costs per step, from a run; the model's only input besides the network."""

    label: str
    hook: str
    wrapper: str
    compute_s: float
    arithmetic_s: float
    payload_bytes: float  # per step, handed to all_reduce by the hook
    collectives: float  # per step
    world_size: int  # where it was measured
    run_id: str
    measured_over: str  # "loopback" or "emulated 1 Gb/s, 20 µs"
    steady_steps: int
    overlap_share: float = 0.0  # of comm, hidden behind backward, as measured; 0: no overlap
    collective: str = ring.ALLREDUCE  # what the hook's collectives are (``traffic``)
    group_size: int = 0  # ranks each of the hook's collectives spans; 0: all of them, at any N
    averaged_bytes: float = 0.0  # model averaging: the bytes each rank hands over all ranks ...
    period: int = 1  # ... every ``period`` steps (counted in payload_bytes and collectives) ...
    averaging_collective: str = ring.ALLREDUCE  # ... by this collective (DiLoCo's int8: allgather)
    comm_here_s: float | None = None  # per step, on the link it ran over, as recorded (None: not)
    setting: str = ""  # its setting's label, shared by the seeds of a setting (``label`` is unique)
    seed: int | None = None
    sharding: str = "ddp"
    sharded: sharded_whatif.ShardedTraffic | None = None  # a sharded run's collectives, priced there

    @property
    def averages(self) -> float:
        """Model averagings per step."""
        return 1.0 / self.period if self.averaged_bytes else 0.0

    def averaging_counted(self) -> float:
        """One averaging as the run's count has it (an allgather counted as the allreduce that puts
        as many bytes on the wire, on the ranks it ran on: ``CollectiveCounter.payload_of``)."""
        per_byte = ring.factor(self.world_size)
        sent = ring.sent_bytes(self.averaging_collective, self.averaged_bytes, self.world_size)
        return sent / per_byte if per_byte else 0.0

    def message_bytes(self) -> float:
        """What one rank hands to the hook's own collectives per step (averaging apart)."""
        counted = max(0.0, self.payload_bytes - self.averaging_counted() * self.averages)
        return ring.message_bytes(self.collective, counted, self.world_size,
                                  self.group_size or self.world_size)

    def comm_s(self, world_size: int, bandwidth_gbps: float, latency_us: float) -> float:
        if self.sharded:
            return self.sharded.comm_s(world_size, bandwidth_gbps, latency_us)
        group = min(self.group_size, world_size) if self.group_size else world_size
        own = ring.collective_s(self.collective, self.message_bytes(), group, bandwidth_gbps,
                                latency_us, max(0.0, self.collectives - self.averages))
        return own + self.averaging_s(world_size, bandwidth_gbps, latency_us)

    def averaging_s(self, world_size: int, bandwidth_gbps: float, latency_us: float) -> float:
        """Model averaging's share of a step: one collective of the parameters every period
        (post-local SGD's allreduce; DiLoCo's pseudo-gradient in its outer precision)."""
        return ring.collective_s(self.averaging_collective, self.averaged_bytes * self.averages,
                                 world_size, bandwidth_gbps, latency_us, self.averages)

    def averaging_wire_bytes(self, world_size: int) -> float:
        """Bytes each rank sends per step for model averaging on ``world_size`` ranks."""
        return self.averages * ring.sent_bytes(self.averaging_collective, self.averaged_bytes, world_size)

    def wire_bytes(self, world_size: int) -> float:
        """Bytes each rank sends per step on ``world_size`` ranks."""
        if self.sharded:
            return self.sharded.wire_bytes(world_size)
        group = min(self.group_size, world_size) if self.group_size else world_size
        return ring.sent_bytes(self.collective, self.message_bytes(), group) + self.averaging_wire_bytes(world_size)

    def step_s(self, world_size: int, bandwidth_gbps: float, latency_us: float) -> float:
        exposed = (1.0 - self.overlap_share) * self.comm_s(world_size, bandwidth_gbps, latency_us)
        return self.compute_s + self.arithmetic_s + exposed

    def to_dict(self) -> dict:
        return asdict(self)


def predict(profiles: Sequence[HookProfile], world_sizes: Iterable[int] = WORLD_SIZES,
            bandwidths_gbps: Iterable[float] = BANDWIDTHS_GBPS,
            latency_us: float = DEFAULT_LATENCY_US) -> list[dict]:
    """One row per profile, world size and bandwidth: predicted step time and its parts."""
    rows = []
    for n in world_sizes:
        for bw in bandwidths_gbps:
            for p in profiles:
                comm = p.comm_s(n, bw, latency_us)
                rows.append({"label": p.label, "setting": p.setting or p.label, "hook": p.hook,
                             "wrapper": p.wrapper, "sharding": p.sharding, "world_size": n,
                             "bandwidth_gbps": bw, "latency_us": latency_us,
                             "compute_s": p.compute_s, "arithmetic_s": p.arithmetic_s,
                             "comm_s": comm, "overlap_share": p.overlap_share,
                             "step_s": p.step_s(n, bw, latency_us)})
    return rows


def over_seeds(rows: Sequence[dict]) -> list[dict]:
    """``predict``'s rows folded over the seeds of each setting: one row per setting, world size and
    bandwidth, labelled by the setting, with the median of each time over its seeds and the step
    time's range (``step_s_low``, ``step_s_high``; ``seeds``: how many)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["setting"], r["world_size"], r["bandwidth_gbps"]), []).append(r)
    out = []
    for (setting, _, _), group in groups.items():
        steps = sorted(r["step_s"] for r in group)
        out.append({**group[0], "label": setting, "seeds": len(group), "step_s_low": steps[0],
                    "step_s_high": steps[-1],
                    **{k: statistics.median(r[k] for r in group)
                       for k in ("compute_s", "arithmetic_s", "comm_s", "overlap_share", "step_s")}})
    return out


def with_a_baseline(runs: Sequence, count: int = 3, against: str = baselines.DEFAULT) -> list:
    """Up to ``count`` of ``runs`` (newest first) to measure by default: the newest run of the
    baseline ``against`` and the newest others of its job, so that speed-ups and break-evens have
    their reference; the first ``count`` when none is a baseline."""
    loaded = [(r, r.config_dict()) for r in runs]
    base = next(((r, cfg) for r, cfg in loaded if baselines.is_baseline(cfg, against)), None)
    if base is None:
        return list(runs)[:count]
    same = [r for r, cfg in loaded if r is not base[0] and _same_job(cfg, base[1])]
    return [base[0], *same[:count - 1]]


def winners(rows: Sequence[dict], against: str = baselines.DEFAULT) -> list[dict]:
    """Per world size and bandwidth: the fastest hook and its speed-up over the baseline ``against``
    (``commlab.tune.baseline``)."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault((r["world_size"], r["bandwidth_gbps"]), []).append(r)
    out = []
    for (n, bw), cell in cells.items():
        best = min(cell, key=lambda r: r["step_s"])
        base = next((r for r in cell if baselines.is_baseline(r, against)), None)
        out.append({"world_size": n, "bandwidth_gbps": bw, "best": best["label"],
                    "best_hook": best["hook"], "best_step_s": best["step_s"],
                    "baseline_step_s": base["step_s"] if base else None,
                    "speedup": base["step_s"] / best["step_s"] if base else None})
    return out


# ============================================================================ profiles from runs
def profile_from_records(records: Sequence[dict], cfg: dict, run_id: str = "",
                         label: str | None = None, skip: int = metrics.WARMUP_STEPS,
                         loopback_s_per_byte: float | None = None,
                         compute_s: float | None = None) -> HookProfile:
    """A hook's profile from a run's metrics (pure).

    The time the hook's collectives took is subtracted from its measured time to leave its
    arithmetic: on loopback, what the run recorded they took (``collective_s``, from issue to
    completion, so waiting for the other ranks to arrive is not arithmetic either: under an
    emulated link that wait passes inside the link's hold), or for runs that did not record it and
    for post-local SGD's averaging, ``loopback_s_per_byte`` times the wire bytes (read from a plain
    allreduce run, whose hook does no arithmetic to speak of); over an emulated link, the longer of
    the link's time and loopback's (the emulation holds completion back, it cannot make loopback
    faster).  Without either, loopback counts as arithmetic, which overstates it.
    ``compute_s`` overrides the run's own (to share one baseline's across hooks).
    """
    if cfg.get("sharding", "ddp") != "ddp":  # FSDP's collectives beside the hook's
        return _sharded_profile(records, cfg, run_id, label, skip, loopback_s_per_byte, compute_s)
    if records and "payload_bytes" not in records[0]:
        raise ValueError(f"run {run_id} was not instrumented: it counted no bytes")
    collective, group_size, period = traffic(cfg)
    steady = steady_rows(records, cfg, skip)
    if not steady:
        raise ValueError(f"run {run_id} has no steady steps: it recorded {len(records)} step(s) and "
                         f"the model needs steps from {_first_step(cfg, skip)} on"
                         + (f", in whole periods of {period}" if period > 1 else ""))
    world = cfg.get("world_size", 2)
    averaging_kind, averaged = _averaging(steady, cfg, world)
    profile = HookProfile(
        label=label or label_of(cfg), hook=cfg.get("hook", "?"), wrapper=cfg.get("wrapper", "none"),
        compute_s=0.0, arithmetic_s=0.0, payload_bytes=metrics.per_step(steady, cfg, "payload_bytes"),
        collectives=metrics.per_step(steady, cfg, "collectives"), world_size=world, run_id=run_id,
        measured_over=link_of(cfg) or "loopback", steady_steps=len(steady),
        collective=collective, group_size=group_size, period=period,
        averaged_bytes=averaged, averaging_collective=averaging_kind)

    recorded = "collective_s" in steady[0]

    def on_this_link(averaging: bool) -> float:
        """What the hook's collectives (or its averaging) took on the run's own link."""
        if recorded and not averaging:
            loop = metrics.per_step(steady, cfg, "collective_s")
        else:
            loop = (loopback_s_per_byte or 0.0) * (
                profile.averaging_wire_bytes(world) if averaging
                else profile.wire_bytes(world) - profile.averaging_wire_bytes(world))
        if not link_of(cfg):
            return loop
        bw, lat = cfg.get("emulate_bandwidth_gbps", 0.0), cfg.get("emulate_latency_us", 0.0)
        avg = profile.averaging_s(world, bw, lat)
        return max(loop, avg if averaging else profile.comm_s(world, bw, lat) - avg)

    # The averaging runs after the optimizer step, outside the hook's window: the run's own
    # compute time holds it, so it is taken out there.
    own_compute = _compute_s(steady, cfg) - on_this_link(averaging=True)
    return dataclasses.replace(
        profile, compute_s=max(0.0, own_compute) if compute_s is None else compute_s,
        arithmetic_s=max(0.0, metrics.per_step(steady, cfg, "hook_s") - on_this_link(averaging=False)),
        comm_here_s=on_this_link(False) + on_this_link(True) if recorded else None)


def _sharded_profile(records: Sequence[dict], cfg: dict, run_id: str, label: str | None, skip: int,
                     loopback_s_per_byte: float | None, compute_s: float | None) -> HookProfile:
    """A sharded run's profile (``commlab.tune.sharded_whatif``): its bytes and collectives per step
    are FSDP's and the hook's between replicas, as the run counted them."""
    steady = steady_rows(records, cfg, skip)
    if not steady:
        raise ValueError(f"run {run_id} has no steady steps: it recorded {len(records)} step(s)")
    moved = sharded_whatif.traffic(steady, cfg)
    own_compute, arithmetic, here = sharded_whatif.times(steady, cfg, moved, loopback_s_per_byte)
    return HookProfile(
        label=label or label_of(cfg), hook=cfg.get("hook", "?"), wrapper=cfg.get("wrapper", "none"),
        compute_s=own_compute if compute_s is None else compute_s, arithmetic_s=arithmetic,
        payload_bytes=metrics.per_step(steady, cfg, "payload_bytes"),
        collectives=metrics.per_step(steady, cfg, "collectives"), world_size=cfg.get("world_size", 2),
        run_id=run_id, measured_over=link_of(cfg) or "loopback", steady_steps=len(steady),
        comm_here_s=here, sharding=cfg["sharding"], sharded=moved)


def traffic(cfg: dict) -> tuple[str, int, int]:
    """What a hook's collectives are: (``ring.ALLREDUCE`` or ``ring.ALLGATHER``, the ranks each
    spans (0: all), the period of its model averaging (1: none))."""
    spec = spec_of(cfg)
    if spec is None:
        return ring.ALLREDUCE, 0, 1
    collective = spec.collective
    if spec.averaging and spec.averaging.precision:  # its every collective is its averaging's (DiLoCo's int8: two allgathers)
        collective = OUTER_PRECISIONS[cfg.get(spec.averaging.precision, "fp32")]
    kind = ring.ALLGATHER if collective == ALLGATHER else ring.ALLREDUCE
    group = cfg.get("localsgd_subgroup_size", 1) if spec.subgroup else 0
    return kind, group, metrics.averaging_period(cfg)  # model averaging: the parameters, every period


def _averaging(steady: Sequence[dict], cfg: dict, world: int) -> tuple[str, float]:
    """How a hook's model averaging travels: (the collective, the bytes each rank hands it).
    Post-local SGD allreduces the parameters as they are (the buckets' bytes); DiLoCo's hook sends
    nothing else, so an averaging is what the run counted over a period, in the collective its
    outer precision goes by (``OUTER_PRECISIONS``); (allreduce, 0) for hooks that average nothing."""
    spec = spec_of(cfg)
    if not metrics.averages_model(cfg):
        return ring.ALLREDUCE, 0.0
    if not spec.averaging.precision:
        return ring.ALLREDUCE, metrics.median(steady, "plain_bytes")
    collective = OUTER_PRECISIONS[cfg.get(spec.averaging.precision, "fp32")]
    kind = ring.ALLGATHER if collective == ALLGATHER else ring.ALLREDUCE
    counted = metrics.per_step(steady, cfg, "payload_bytes") * metrics.averaging_period(cfg)
    return kind, ring.message_bytes(kind, counted, world, world)


def _first_step(cfg: dict, skip: int) -> int:
    return max(metrics.first_steady_step(cfg, skip), metrics.averaging_from(cfg))


def steady_rows(records: Sequence[dict], cfg: dict, skip: int = metrics.WARMUP_STEPS) -> list[dict]:
    """The steps a profile or a check describes: steady (``metrics.steady_rows``), past post-local
    SGD's start and, with model averaging, in whole periods only (each holds one averaging)."""
    first = _first_step(cfg, skip)
    rows = [r for r in metrics.steady_rows(records, cfg, skip) if r["step"] >= first]
    return [r for r, whole in zip(rows, metrics.in_whole_periods(rows, cfg)) if whole]


def _compute_s(steady: Sequence[dict], cfg: dict) -> float:
    """What a step costs outside the hook: step_s - hook_s per step (``metrics.per_step``)."""
    return metrics.per_step(steady, cfg, lambda r: r["step_s"] - r["hook_s"])


def loopback_s_per_byte(records: Sequence[dict], cfg: dict, skip: int = metrics.WARMUP_STEPS) -> float | None:
    """Seconds per wire byte of this machine's own link, read from a plain allreduce run's hook time."""
    if not is_plain_allreduce(cfg) or link_of(cfg):
        return None
    steady = metrics.steady_rows(records, cfg, skip)
    if not steady:
        return None
    wire = ring.wire_bytes(metrics.median(steady, "payload_bytes"), cfg.get("world_size", 2))
    return metrics.median(steady, "hook_s") / wire if wire else None


def _same_job(a: dict, b: dict) -> bool:
    return _job_key(a) == _job_key(b)


def baseline_profile(profiles: Sequence[HookProfile], against: str = baselines.DEFAULT) -> HookProfile | None:
    """The first profile of a run of the baseline ``against``, the one the others are compared with."""
    return next((p for p in profiles if baselines.is_baseline(p.to_dict(), against)), None)


def profiles_from_runs(runs: Iterable, skip: int = metrics.WARMUP_STEPS, share_compute: bool = True) -> list[HookProfile]:
    """Profiles of runs (``RunFolder``s), one per run that has steady steps, labels made unique.

    A plain allreduce run of the same job on the real link calibrates the loopback.  With
    ``share_compute`` a plain allreduce run of the same job (the first found) lends its compute
    time to every hook: compute does not depend on the hook, and sharing it keeps one run's noise
    from passing for a difference between hooks.  Runs that cannot be profiled are left out.
    """
    runs = list(runs)
    loaded = [(r.id, r.config_dict(), r.metrics_records()) for r in runs]
    shares = {r.id: steady_overlap_share(r.timeline(), cfg, skip) for r, (_, cfg, _) in zip(runs, loaded)}
    return [dataclasses.replace(p, overlap_share=shares[run_id] or 0.0)
            for run_id, _, p in _profiles(loaded, skip, share_compute)]


def steady_overlap_share(recorded: dict, cfg: dict, skip: int = metrics.WARMUP_STEPS) -> float | None:
    """The overlap share of a run's traced steps (``RunFolder.timeline()``) that are steady, the
    steps a profile describes; None when it traced none of them."""
    first = metrics.first_steady_step(cfg, skip)
    steady = {k: v for k, v in recorded.get("steps", {}).items() if int(k) >= first}
    return timeline.run_overlap_share(steady)


def _profiles(loaded: list[tuple[str, dict, list[dict]]], skip: int,
              share_compute: bool) -> list[tuple[str, dict, HookProfile]]:
    plain = [(cfg, recs) for _, cfg, recs in loaded
             if is_plain_allreduce(cfg) and metrics.steady_rows(recs, cfg, skip)]
    out, seen = [], {}
    for run_id, cfg, recs in loaded:
        same = [(c, r) for c, r in plain if _same_job(c, cfg)]
        per_byte = next((pb for c, r in same if (pb := loopback_s_per_byte(r, c, skip))), None)
        compute = None
        if same and share_compute:
            base_cfg, base_recs = same[0]
            compute = _compute_s(metrics.steady_rows(base_recs, base_cfg, skip), base_cfg)
        label = label_of(cfg, link=True)
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label += f" #{seen[label]}"
        try:
            got = profile_from_records(recs, cfg, run_id, label, skip, per_byte, compute)
            out.append((run_id, cfg, dataclasses.replace(got, setting=label_of(cfg, link=True),
                                                         seed=cfg.get("seed"))))
        except ValueError:
            continue
    return out


# ============================================================================ model against runs
def check(profile: HookProfile, records: Sequence[dict], cfg: dict, skip: int = metrics.WARMUP_STEPS,
          loopback_s_per_byte: float | None = None) -> dict:
    """The model's step time for an emulated run's link and world size against the run's own.

    On this machine a collective over an emulated link takes the longer of the link's time and
    loopback's own (the emulation holds completion back; it cannot make loopback faster), so the
    prediction here takes the longer of the two (loopback's: what the calibration run recorded,
    ``comm_here_s``, else ``loopback_s_per_byte`` times its wire bytes); at cluster scale only the
    link counts.
    """
    bw, lat = cfg.get("emulate_bandwidth_gbps", 0.0), cfg.get("emulate_latency_us", 0.0)
    world = cfg.get("world_size", 2)
    link = profile.comm_s(world, bw, lat)
    loopback = profile.comm_here_s if profile.comm_here_s is not None else (
        (loopback_s_per_byte or 0.0) * ring.wire_bytes(profile.payload_bytes, world))
    predicted = profile.compute_s + profile.arithmetic_s + max(link, loopback)
    steady = steady_rows(records, cfg, skip)
    if not steady:
        raise ValueError("no steady steps to measure")
    measured = metrics.per_step(steady, cfg, "step_s")
    return {"label": profile.label, "world_size": world, "bandwidth_gbps": bw, "latency_us": lat,
            "predicted_s": predicted, "measured_s": measured, "ratio": predicted / measured,
            "link_s": link, "loopback_s": loopback, "compute_s": profile.compute_s,
            # what the emulated link charged per step, counted by the run (None before it did)
            "emulated_s": metrics.per_step(steady, cfg, "link_s") if "link_s" in steady[0] else None,
            "arithmetic_s": profile.arithmetic_s}


def checks(runs: Iterable, skip: int = metrics.WARMUP_STEPS) -> list[dict]:
    """The model against every run over an emulated link that has a calibration twin: a run of the
    same settings and job on the real link, started before it (the latest such).  Only the twin,
    and the latest plain allreduce on the real link before it, feed the prediction, so each
    check predicts a run the model never saw; on a shared machine whose load drifts, neighbours
    in time agree best."""
    loaded = sorted(((r.id, r.config_dict(), r.metrics_records()) for r in runs), key=lambda x: x[0])
    rows = []
    for i, (run_id, cfg, recs) in enumerate(loaded):
        if not link_of(cfg) or not metrics.steady_rows(recs, cfg, skip):
            continue
        before = [x for x in loaded[:i] if not link_of(x[1]) and _same_job(x[1], cfg)]
        twin = next((x for x in reversed(before)
                     if label_of(x[1]) == label_of(cfg) and metrics.steady_rows(x[2], x[1], skip)), None)
        if twin is None:
            continue
        per_byte = next((pb for _, c, r in reversed(before) if (pb := loopback_s_per_byte(r, c, skip))),
                        None)
        profile = profile_from_records(twin[2], twin[1], twin[0], label_of(cfg), skip, per_byte)
        rows.append({**check(profile, recs, cfg, skip, per_byte), "run_id": run_id,
                     "calibration_run_id": twin[0]})
    return rows


def _job_key(cfg: dict) -> tuple:
    # a sharded run's compute holds FSDP's own work: it is no job of a DDP run's
    return tuple(cfg.get(k, "ddp" if k == "sharding" else None)
                 for k in ("workload", "world_size", "batch_size", "optimizer", "bucket_cap_mb", "sharding"))
