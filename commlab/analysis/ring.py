"""The ring allreduce's cost, written once: 2(N-1) steps, 2(N-1)/N of the payload on every link.

Allreduce, as the explainer in ``shared/reference/allreduce-explainer.txt`` puts it (after *Deep
Learning with PyTorch*, Second Edition, section 16.2): every rank contributes a tensor, the ranks
combine them with a reduction, and every rank receives the result.  The explainer stops at what
each rank holds; it leaves the algorithm out, and the cost is the algorithm's.  A ring cuts the S
bytes into N chunks and takes 2(N-1) steps: N-1 of reduce-scatter, in which every rank passes one
chunk on to the next rank, which adds its own, and N-1 of all-gather, in which the reduced chunks
go round once more (``commlab.teach.classroom.ring_trace`` plays it step by step).  So every rank
sends, and receives, 2(N-1) chunks of S/N:

    wire bytes per rank    2(N-1)/N * S                          (``factor``, ``wire_bytes``)
    time                   2(N-1) alpha + 2(N-1)/N * S / beta    (``allreduce_s``)

with alpha the latency of one step and beta the bandwidth of the slowest link.  nccl-tests calls
the factor the allreduce bus factor (busbw = algbw * 2(N-1)/N).  One rank sends nothing.

The other collectives' bus factors, from nccl-tests' PERFORMANCE.md, are here too (``bus_factor``).
"""
from __future__ import annotations


def steps(world_size: int) -> int:
    """Steps of a ring allreduce, each one latency long: 2(N-1)."""
    return 2 * (world_size - 1) if world_size > 1 else 0


def factor(world_size: int) -> float:
    """The share of the payload each rank sends (and receives): 2(N-1)/N."""
    return steps(world_size) / world_size if world_size > 1 else 0.0


def wire_bytes(payload_bytes: float, world_size: int) -> float:
    """Bytes each rank sends in a ring allreduce of ``payload_bytes``."""
    return factor(world_size) * payload_bytes


def allreduce_s(payload_bytes: float, world_size: int, bandwidth_gbps: float,
                latency_us: float = 0.0, collectives: float = 1) -> float:
    """Seconds for ``collectives`` ring allreduces carrying ``payload_bytes`` in all, over links of
    ``bandwidth_gbps`` (0: infinitely fast) and ``latency_us`` per step (``collective_s``)."""
    return collective_s(ALLREDUCE, payload_bytes, world_size, bandwidth_gbps, latency_us, collectives)


# An allgather from N ranks of s bytes each, in a ring: N-1 steps, each rank passes on one s-byte
# piece per step, so it sends (N-1) s and takes N-1 latencies, half an allreduce's.  The byte
# counter (``commlab.hooks.instrument``) counts every collective as the allreduce payload on all
# N ranks that puts the same bytes on each rank's wire; ``message_bytes`` undoes that.  A
# reduce-scatter of S bytes (FSDP's of a layer's gradients) is an allreduce's first half: N-1
# steps, each rank sends (N-1)/N S.
ALLREDUCE, ALLGATHER, REDUCESCATTER = "all_reduce", "all_gather", "reduce_scatter"


def latency_steps(collective: str, group_size: int) -> int:
    """Ring steps of one ``collective`` on ``group_size`` ranks: 2(g-1) for an allreduce, g-1 for
    an allgather or a reduce-scatter."""
    if collective in (ALLGATHER, REDUCESCATTER):
        return group_size - 1 if group_size > 1 else 0
    if collective == ALLREDUCE:
        return steps(group_size)
    raise ValueError(f"unknown collective {collective!r}; known: {ALLREDUCE}, {ALLGATHER}, {REDUCESCATTER}")


def sent_bytes(collective: str, message_bytes: float, group_size: int) -> float:
    """Bytes each rank sends: allreduce of S: 2(g-1)/g S; allgather of s from each: (g-1) s;
    reduce-scatter of S: (g-1)/g S."""
    if collective == ALLGATHER:
        return max(group_size - 1, 0) * message_bytes
    if collective == REDUCESCATTER:
        return wire_bytes(message_bytes, group_size) / 2
    latency_steps(collective, group_size)  # names an unknown collective
    return wire_bytes(message_bytes, group_size)


def message_bytes(collective: str, counted_bytes: float, world_size: int, group_size: int) -> float:
    """What one rank handed to ``collective`` on ``group_size`` ranks, from the bytes the counter
    counted for it on a ``world_size``-rank run (the allreduce payload of the same wire bytes)."""
    sent = counted_bytes * factor(world_size)
    per_byte = sent_bytes(collective, 1.0, group_size)
    return sent / per_byte if per_byte else 0.0


def collective_s(collective: str, message: float, group_size: int, bandwidth_gbps: float,
                 latency_us: float = 0.0, collectives: float = 1) -> float:
    """Seconds for ``collectives`` ring ``collective``s carrying ``message`` bytes per rank in all:
    ``latency_steps`` latencies each and ``sent_bytes`` over the bandwidth.  The one formula of a
    collective's time: the what-if model prices with it, and the emulated link
    (``commlab.hooks.link.Link``) holds collectives back by it."""
    beta = bandwidth_gbps * 1e9 / 8
    transfer = sent_bytes(collective, message, group_size) / beta if beta > 0 else 0.0
    return collectives * latency_steps(collective, group_size) * latency_us * 1e-6 + transfer


# nccl-tests' PERFORMANCE.md: busbw = algbw * factor, so that each collective's busbw can be held
# against the links' peak whatever N.  S, in algbw = S / t, is the largest buffer of the call:
# all_gather's output and reduce_scatter's input, N chunks of S/N each.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw for ``collective`` on ``world_size`` ranks.

    all_reduce 2(N-1)/N (``factor``); all_gather and reduce_scatter (N-1)/N, every rank receives
    (or sends) the N-1 chunks of S/N it does not hold; broadcast and reduce 1, every byte crosses
    each link once, pipelined, whatever N.
    """
    n = world_size
    if collective == "all_reduce":
        return factor(n)
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")


def algbw(size_bytes: float, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth, bytes per second: the message size S over one call's time."""
    return size_bytes / seconds


def busbw(algbw_bytes_per_s: float, world_size: int, collective: str = "all_reduce") -> float:
    """nccl-tests' bus bandwidth, bytes per second: algbw times ``bus_factor``."""
    return algbw_bytes_per_s * bus_factor(collective, world_size)
