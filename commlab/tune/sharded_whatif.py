"""What a sharded run's step would cost at other scales: the what-if model (``commlab.tune.whatif``)
for FSDP2 and HSDP, whose ``HookProfile`` carries a ``ShardedTraffic`` for a sharded run.

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
``replica_collectives``.  Compute is the step less the hook and less FSDP's collectives on the
run's link (the emulated link's time, or loopback's at a calibration run's seconds per byte;
without either they count as compute, which overstates it); it is the run's own, not a DDP run's
(FSDP's per-unit work is in it).  No overlap: FSDP's prefetching hides some of its all-gathers
behind compute, which this model does not credit.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from commlab.analysis import metrics, ring
from commlab.config import link_of


@dataclass(frozen=True)
class ShardedTraffic:
    """A sharded run's collectives per step: FSDP's per unit, and the hook's between replicas."""

    shard_size: int  # ranks of a shard group: 0 for FSDP (all of them, at any N), HSDP's as measured
    model_bytes: float  # every unit's padded parameters, in the reduce dtype
    units: float  # collectives of each kind a step gathers and scatters per pass
    gathers: int  # all-gather passes a step: 2 when resharded after forward
    replica_bytes: float  # what a rank hands the all-reduce between replicas per step
    replica_collectives: float

    def _parts(self, world_size: int) -> list[tuple[str, float, int, float]]:
        """(collective, bytes a rank hands it per step, ranks, calls) of each kind."""
        shard = min(self.shard_size, world_size) if self.shard_size else world_size
        replicas = max(1, world_size // shard)
        return [(ring.ALLGATHER, self.model_bytes / shard * self.gathers, shard, self.units * self.gathers),
                (ring.REDUCESCATTER, self.model_bytes, shard, self.units),
                (ring.ALLREDUCE, self.replica_bytes, replicas, self.replica_collectives)]

    def comm_s(self, world_size: int, bandwidth_gbps: float, latency_us: float) -> float:
        return sum(ring.collective_s(kind, message, group, bandwidth_gbps, latency_us, calls)
                   for kind, message, group, calls in self._parts(world_size))

    def wire_bytes(self, world_size: int) -> float:
        return sum(ring.sent_bytes(kind, message, group) for kind, message, group, _ in self._parts(world_size))

    def sharding_only(self) -> ShardedTraffic:
        """The same without the replicas' traffic: FSDP's collectives alone."""
        return dataclasses.replace(self, replica_bytes=0.0, replica_collectives=0.0)


def traffic(steady: Sequence[dict], cfg: dict) -> ShardedTraffic:
    """A sharded run's traffic, from its steady steps' count (pure)."""
    if steady and "sharding_bytes" not in steady[0]:
        raise ValueError("the run was not instrumented: it counted no bytes")
    world = cfg.get("world_size", 2)
    hsdp = cfg.get("sharding") == "hsdp"
    replicas = cfg.get("replicas", 1) if hsdp else 1
    shard = world // replicas
    gathers = 2 if cfg.get("reshard_after_forward", True) else 1
    per_call = ring.sent_bytes(ring.REDUCESCATTER, 1.0, shard)  # of L, for a gather or a scatter of L
    counted = metrics.per_step(steady, cfg, "sharding_bytes")
    return ShardedTraffic(
        shard_size=shard if hsdp else 0,
        model_bytes=counted * ring.factor(world) / per_call / (gathers + 1) if per_call else 0.0,
        units=metrics.per_step(steady, cfg, "sharding_collectives") / (gathers + 1), gathers=gathers,
        replica_bytes=ring.message_bytes(ring.ALLREDUCE, metrics.per_step(steady, cfg, "replica_bytes"),
                                         world, replicas),
        replica_collectives=metrics.per_step(steady, cfg, "replica_collectives"))


def times(steady: Sequence[dict], cfg: dict, moved: ShardedTraffic,
          loopback_s_per_byte: float | None = None) -> tuple[float, float, float]:
    """(compute, the hook's arithmetic, communication on the run's own link) per step (pure)."""
    world = cfg.get("world_size", 2)

    def here(t: ShardedTraffic) -> float:
        if link_of(cfg):
            return t.comm_s(world, cfg.get("emulate_bandwidth_gbps", 0.0), cfg.get("emulate_latency_us", 0.0))
        return (loopback_s_per_byte or 0.0) * t.wire_bytes(world)

    fsdp_here, all_here = here(moved.sharding_only()), here(moved)
    hook_s = metrics.per_step(steady, cfg, lambda r: r.get("hook_s") or 0.0)
    outside = metrics.per_step(steady, cfg, lambda r: r["step_s"] - (r.get("hook_s") or 0.0))
    return max(0.0, outside - fsdp_here), max(0.0, hook_s - (all_here - fsdp_here)), all_here
