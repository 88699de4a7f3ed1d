"""What a sharded run's step would cost at other scales: the what-if model (``commlab.tune.whatif``)
for FSDP2 and HSDP.

A sharded step moves, per unit (layer) ``fully_shard`` was applied to, with the unit's padded
parameters of L bytes in the reduce dtype, on its shard group of g ranks:

    all-gather of L/g from each rank, once in forward and again in backward when resharded after
        forward (``reshard_after_forward``): (g-1) alpha + (g-1)/g L / beta each;
    reduce-scatter of the gradients, L: (g-1) alpha + (g-1)/g L / beta;
    HSDP only: the all-reduce between the R replicas of each rank's shard (FSDP's own, or the lab's
        compressed one: what the run counted per rank), 2(R-1) alpha + 2(R-1)/R S / beta.

FSDP shards over every rank (g = N: each rank's share of a layer shrinks as N grows, what it sends
does not); HSDP keeps the shard group it was measured with (a node) and adds replicas (R = N / g:
its all-reduce's message stays, its ring grows).  The model's bytes and units are read back from
the run's count (``sharding_bytes``, ``sharding_collectives``: each all-gather and reduce-scatter
of L puts (g-1)/g L on a rank's wire), the replica traffic from ``replica_bytes`` and
``replica_collectives``.  Compute is the step less the hook and less FSDP's collectives on the run's link
(the emulated link's time, or loopback's at the calibration run's seconds per byte; without either
they count as compute, which overstates it).  No overlap: FSDP's prefetching hides some of its
all-gathers behind compute, which this model does not credit.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from commlab.analysis import metrics, ring
from commlab.config import label_of, link_of
from commlab.tune import whatif


@dataclass(frozen=True)
class ShardedProfile(whatif.HookProfile):
    """A sharded run's profile: FSDP's collectives per unit beside the hook's between replicas.
    ``payload_bytes`` and ``collectives`` (what a comparison reads) count both, per step, as the
    run's metrics do."""

    shard_size: int = 0  # ranks of a shard group: 0 for FSDP (all of them, at any N), HSDP's as measured
    model_bytes: float = 0.0  # every unit's padded parameters, in the reduce dtype
    units: float = 0.0  # collectives of each kind a step gathers and scatters per pass
    gathers: int = 1  # all-gather passes a step: 2 when resharded after forward
    replica_bytes: float = 0.0  # what a rank hands the all-reduce between replicas per step
    replica_collectives: float = 0.0

    def _groups(self, world_size: int) -> tuple[int, int]:
        shard = min(self.shard_size, world_size) if self.shard_size else world_size
        return shard, max(1, world_size // shard)

    def _parts(self, world_size: int) -> list[tuple[str, float, int, float]]:
        """(collective, bytes a rank hands it per step, ranks, calls) of each kind."""
        shard, replicas = self._groups(world_size)
        return [(ring.ALLGATHER, self.model_bytes / shard * self.gathers, shard, self.units * self.gathers),
                (ring.REDUCESCATTER, self.model_bytes, shard, self.units),
                (ring.ALLREDUCE, self.replica_bytes, replicas, self.replica_collectives)]

    def comm_s(self, world_size: int, bandwidth_gbps: float, latency_us: float) -> float:
        return sum(ring.collective_s(kind, message, group, bandwidth_gbps, latency_us, calls)
                   for kind, message, group, calls in self._parts(world_size))

    def wire_bytes(self, world_size: int) -> float:
        return sum(ring.sent_bytes(kind, message, group) for kind, message, group, _ in self._parts(world_size))

    def sharding_only(self) -> ShardedProfile:
        """The same without the replicas' traffic: FSDP's collectives alone."""
        return dataclasses.replace(self, replica_bytes=0.0, replica_collectives=0.0)


def sharded_profile(records: Sequence[dict], cfg: dict, run_id: str = "", label: str | None = None,
                    skip: int = metrics.WARMUP_STEPS, loopback_s_per_byte: float | None = None,
                    compute_s: float | None = None) -> ShardedProfile:
    """A sharded run's profile from its metrics (pure); the arguments as ``whatif.profile_from_records``'s."""
    if records and "sharding_bytes" not in records[0]:
        raise ValueError(f"run {run_id} was not instrumented: it counted no bytes")
    steady = whatif.steady_rows(records, cfg, skip)
    if not steady:
        raise ValueError(f"run {run_id} has no steady steps: it recorded {len(records)} step(s)")
    world = cfg.get("world_size", 2)
    hsdp = cfg.get("sharding") == "hsdp"
    replicas = cfg.get("replicas", 1) if hsdp else 1
    shard = world // replicas
    gathers = 2 if cfg.get("reshard_after_forward", True) else 1
    counted = metrics.per_step(steady, cfg, "sharding_bytes")
    per_call = ring.sent_bytes(ring.REDUCESCATTER, 1.0, shard)  # of L, for a gather or a scatter of L
    replica_counted = metrics.per_step(steady, cfg, "replica_bytes")
    hook_s = metrics.per_step(steady, cfg, lambda r: r.get("hook_s") or 0.0)
    profile = ShardedProfile(
        label=label or label_of(cfg), hook=cfg.get("hook", "?"), wrapper=cfg.get("wrapper", "none"),
        compute_s=0.0, arithmetic_s=0.0, payload_bytes=metrics.per_step(steady, cfg, "payload_bytes"),
        collectives=metrics.per_step(steady, cfg, "collectives"),
        world_size=world, run_id=run_id, measured_over=link_of(cfg) or "loopback", steady_steps=len(steady),
        sharding=cfg.get("sharding"), shard_size=shard if hsdp else 0,
        model_bytes=counted * ring.factor(world) / per_call / (gathers + 1) if per_call else 0.0,
        units=metrics.per_step(steady, cfg, "sharding_collectives") / (gathers + 1), gathers=gathers,
        replica_bytes=ring.message_bytes(ring.ALLREDUCE, replica_counted, world, replicas),
        replica_collectives=metrics.per_step(steady, cfg, "replica_collectives"))

    def here(p: ShardedProfile) -> float:
        """What ``p``'s collectives took on the run's own link."""
        if link_of(cfg):
            return p.comm_s(world, cfg.get("emulate_bandwidth_gbps", 0.0), cfg.get("emulate_latency_us", 0.0))
        return (loopback_s_per_byte or 0.0) * p.wire_bytes(world)

    fsdp_here = here(profile.sharding_only())
    own_compute = metrics.per_step(steady, cfg, lambda r: r["step_s"] - (r.get("hook_s") or 0.0)) - fsdp_here
    return dataclasses.replace(
        profile, compute_s=max(0.0, own_compute) if compute_s is None else compute_s,
        arithmetic_s=max(0.0, hook_s - (here(profile) - fsdp_here)), comm_here_s=here(profile))
