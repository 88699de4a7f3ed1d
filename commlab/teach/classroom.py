"""Allreduce for the classroom: real collectives on real processes, and a ring allreduce on paper.

Two things live here:

* ``run_collectives`` / ``allreduce`` / ``broadcast``: start N real Gloo processes, have each
  call a collective of the book's figure and of nccl-tests (``dist.all_reduce``, ``broadcast``,
  ``reduce``, ``all_gather_single``, ``reduce_scatter_single``) on its own tensor, and report
  what every rank held before and after, and when each rank finished.
* ``ring_trace`` / ``naive_trace``: what a ring allreduce (reduce-scatter, then all-gather) and a
  naive gather-to-rank-0-then-broadcast move at every step.  Pure functions over numbers, so a
  slider can replay them and a test can hold them against the real ``all_reduce``.
* where gradient averaging sits in a training step: ``commlab.teach.averaging``.

Ranks start through the engine's rank harness (``commlab.engine.ranks.run_ranks``): one fresh
launcher interpreter imports torch once and *forks* the ranks, so N ranks cost one torch import
instead of N, and a Streamlit or Jupyter parent never forks itself; every process it started is
ended before it returns, whatever happened.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from commlab.analysis import ring
from commlab.config import ConfigError
from commlab.engine.ranks import DEFAULT_TIMEOUT_S, run_ranks

OPS = ("sum", "avg", "max", "min", "product")
MAX_WORLD_SIZE = 8
ITEMSIZE = 4  # the demonstrations use float32 tensors, as torch.tensor([float(rank)]) does
FLOAT32_MAX = float(np.finfo(np.float32).max)

ARRIVAL_NOTE = (
    "Ranks finish at different moments, and the order changes from run to run: each rank is its "
    "own operating-system process, and when it is scheduled onto a core, when its socket wakes "
    "it, and when it gets to report is up to the OS scheduler.  The arithmetic is the same on "
    "every rank and every run; only the timing differs.")


# ============================================================================ validation
def check_world_size(world_size: Any) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)):
        raise ConfigError({"world_size": f"must be a whole number of ranks, got {world_size!r}"})
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ConfigError({"world_size": f"must be 1 to {MAX_WORLD_SIZE} ranks, got {world_size}"})
    return int(world_size)


def check_op(op: Any) -> str:
    name = str(op).lower()
    if name not in OPS:
        raise ConfigError({"op": f"unknown op {op!r}; valid ops are: {', '.join(OPS)}"})
    return name


def check_src(src: Any, world_size: int) -> int:
    if isinstance(src, bool) or not isinstance(src, (int, np.integer)) or not 0 <= src < world_size:
        raise ConfigError({"src": f"must be a rank from 0 to {world_size - 1}, got {src!r}"})
    return int(src)


def default_values(world_size: int) -> list[list[float]]:
    """Rank r holds N elements, element i being r + 10 i: element 0 is the textbook's
    tensor([r]) (summed: 0 + 1 + 2 = 3 on 3 ranks), and N elements give the ring one per chunk,
    so that no chunk is empty; the units digit names the rank, the tens the chunk."""
    n = check_world_size(world_size)
    return [[float(r + 10 * i) for i in range(n)] for r in range(n)]


def default_src(world_size: int) -> int:
    """The broadcast source by default: the last rank, whose tensor holds no zero (rank 0's
    element 0 is 0, and a broadcast of zeros looks like nothing happened)."""
    return check_world_size(world_size) - 1


def parse_values(values: str | Sequence[str | Sequence[float]] | None,
                 world_size: int) -> list[list[float]]:
    """One tensor per rank, as lists of floats; raises ConfigError naming ``values``.

    Accepts None (the default tensors), text with one rank per line or per ``;`` (numbers split
    by commas or spaces), or a sequence with one entry per rank (text or numbers).
    """
    world_size = check_world_size(world_size)
    if values is None:
        return default_values(world_size)
    rows = [r for r in values.replace(";", "\n").splitlines() if r.strip()] \
        if isinstance(values, str) else list(values)
    if len(rows) != world_size:
        raise ConfigError({"values": f"give one tensor per rank: {world_size} rank(s), "
                                     f"{len(rows)} tensor(s)"})
    tensors = [_parse_row(row, rank) for rank, row in enumerate(rows)]
    lengths = {len(t) for t in tensors}
    if len(lengths) > 1:
        raise ConfigError({"values": "every rank's tensor must have the same length (all_reduce "
                                     "combines them element by element); got lengths "
                                     f"{[len(t) for t in tensors]}"})
    return tensors


def _parse_row(row: str | Sequence[float], rank: int) -> list[float]:
    items = row.replace(",", " ").split() if isinstance(row, str) else list(row)
    if not items:
        raise ConfigError({"values": f"rank {rank}'s tensor is empty"})
    out = []
    for item in items:
        try:
            x = float(item)
        except (TypeError, ValueError):
            raise ConfigError({"values": f"rank {rank}: {item!r} is not a number"}) from None
        if not math.isfinite(x) or abs(x) > FLOAT32_MAX:
            raise ConfigError({"values": f"rank {rank}: {item!r} is not a finite float32 number"})
        out.append(x)
    return out


# ============================================================================ real collectives
@dataclass(frozen=True)
class Collective:
    """One collective for ranks 0..len(values)-1, each holding its row of ``values``."""

    kind: str  # one of KINDS
    values: tuple[tuple[float, ...], ...]
    op: str = "sum"  # the reducing kinds only (REDUCING)
    src: int = 0  # broadcast: the rank whose tensor everyone receives
    dst: int = 0  # reduce: the one rank that receives the result

    @property
    def world_size(self) -> int:
        return len(self.values)


def all_reduce_job(world_size: int = 3, op: str = "sum", values=None) -> Collective:
    """A validated all_reduce; raises ConfigError naming the bad field."""
    world_size = check_world_size(world_size)
    rows = parse_values(values, world_size)
    return Collective("all_reduce", tuple(map(tuple, rows)), op=check_op(op))


def broadcast_job(world_size: int = 3, src: int | None = None, values=None) -> Collective:
    """A validated broadcast from ``src`` (default ``default_src``)."""
    world_size = check_world_size(world_size)
    rows = parse_values(values, world_size)
    src = default_src(world_size) if src is None else src
    return Collective("broadcast", tuple(map(tuple, rows)), src=check_src(src, world_size))


def reduce_job(world_size: int = 3, op: str = "sum", dst: int = 0, values=None) -> Collective:
    """A validated reduce to rank ``dst``."""
    world_size = check_world_size(world_size)
    rows = parse_values(values, world_size)
    try:
        dst = check_src(dst, world_size)
    except ConfigError as e:
        raise ConfigError({"dst": e.errors["src"]}) from None
    return Collective("reduce", tuple(map(tuple, rows)), op=check_op(op), dst=dst)


def all_gather_job(world_size: int = 3, values=None) -> Collective:
    world_size = check_world_size(world_size)
    return Collective("all_gather", tuple(map(tuple, parse_values(values, world_size))))


def reduce_scatter_job(world_size: int = 3, op: str = "sum", values=None) -> Collective:
    """A validated reduce_scatter: the tensor must split into N equal chunks, one per rank."""
    world_size = check_world_size(world_size)
    rows = parse_values(values, world_size)
    if len(rows[0]) % world_size:
        raise ConfigError({"values": f"reduce_scatter gives each of the {world_size} ranks one "
                                     f"equal chunk: the length must be a multiple of "
                                     f"{world_size}, got {len(rows[0])}"})
    return Collective("reduce_scatter", tuple(map(tuple, rows)), op=check_op(op))


KINDS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")


@dataclass
class RankOutcome:
    rank: int
    before: list[float]
    after: list[float]
    finished_ms: float  # after the first rank to finish this collective


@dataclass
class CollectiveResult:
    kind: str
    op: str | None
    src: int | None
    world_size: int
    ranks: list[RankOutcome]  # by rank
    arrival_order: list[int]  # ranks by the moment each finished, first first
    dst: int | None = None  # reduce only; the other ranks' ``after`` is scratch (undefined)

    def to_dict(self) -> dict:
        return asdict(self)


def run_collectives(jobs: Sequence[Collective], timeout_s: float = DEFAULT_TIMEOUT_S,
                    ) -> list[CollectiveResult]:
    """Run every job, in order, on one set of real Gloo processes (one start-up for all).

    A job for fewer ranks than the largest runs on a process group of ranks 0..n-1, which is as
    real an n-rank collective as a world of n.
    """
    if not jobs:
        return []
    world_size = max(job.world_size for job in jobs)
    reports = run_ranks(_collectives_rank, world_size, (list(jobs),), timeout_s=timeout_s)
    return [_result(job, [r for r in reports if r[0] == i]) for i, job in enumerate(jobs)]


def allreduce(world_size: int = 3, op: str = "sum", values=None,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> CollectiveResult:
    """``dist.all_reduce`` on real processes; rank r holds tensor([r]) unless ``values`` says."""
    return run_collectives([all_reduce_job(world_size, op, values)], timeout_s)[0]


def broadcast(world_size: int = 3, src: int = 0, values=None,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> CollectiveResult:
    """``dist.broadcast`` from rank ``src`` on real processes."""
    return run_collectives([broadcast_job(world_size, src, values)], timeout_s)[0]


def _collectives_rank(rank: int, world_size: int, report, jobs: list[Collective]) -> None:
    import torch
    import torch.distributed as dist

    groups: dict[int, Any] = {}
    for i, job in enumerate(jobs):
        group = _group_of_first(job.world_size, world_size, groups)
        if rank >= job.world_size:
            continue
        tensor = torch.tensor(job.values[rank], dtype=torch.float32)
        before = tensor.tolist()
        op = getattr(dist.ReduceOp, job.op.upper())
        n = job.world_size
        if job.kind == "all_reduce":
            dist.all_reduce(tensor, op=op, group=group)
            after = tensor
        elif job.kind == "broadcast":
            dist.broadcast(tensor, src=job.src, group=group)
            after = tensor
        elif job.kind == "reduce":  # ranks 0..n-1 of the group: group ranks are global ranks
            dist.reduce(tensor, dst=job.dst, op=op, group=group)
            after = tensor
        elif job.kind == "all_gather":
            after = torch.empty(n * tensor.numel())
            dist.all_gather_single(after, tensor, group=group)
        elif job.kind == "reduce_scatter":
            after = torch.empty(tensor.numel() // n)
            dist.reduce_scatter_single(after, tensor, op=op, group=group)
        else:
            raise ValueError(f"unknown collective {job.kind!r}; known: {', '.join(KINDS)}")
        report((i, rank, before, after.tolist(), time.time()))


def _group_of_first(n: int, world_size: int, groups: dict):
    """The process group of ranks 0..n-1; every rank must ask, in the same order, to create it."""
    if n == world_size:
        return None  # the default group
    if n not in groups:
        import torch.distributed as dist

        groups[n] = dist.new_group(list(range(n)))
    return groups[n]


def _result(job: Collective, reports: list[tuple]) -> CollectiveResult:
    first = min(r[4] for r in reports)
    by_rank = {r[1]: RankOutcome(r[1], r[2], r[3], round((r[4] - first) * 1e3, 3)) for r in reports}
    # Times come from one clock (same machine); the sort is stable, so ties keep receipt order.
    order = [r[1] for r in sorted(reports, key=lambda r: r[4])]
    return CollectiveResult(job.kind, job.op if job.kind in REDUCING else None,
                            job.src if job.kind == "broadcast" else None, job.world_size,
                            [by_rank[r] for r in sorted(by_rank)], order,
                            job.dst if job.kind == "reduce" else None)


# ============================================================================ ring on paper
@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    chunk: int
    values: tuple[float, ...]
    nbytes: int
    action: str  # what the receiver does: "reduce" (combine with its own) or "copy"


@dataclass(frozen=True)
class Step:
    index: int  # 1-based
    phase: str
    transfers: tuple[Transfer, ...]
    holdings: tuple[tuple[tuple[float, ...], ...], ...]  # [rank][chunk] values after this step
    contributors: tuple[tuple[tuple[int, ...], ...], ...]  # [rank][chunk] ranks folded in


@dataclass(frozen=True)
class Trace:
    scheme: str  # "ring" or "naive"
    op: str
    world_size: int
    chunks: tuple[tuple[int, int], ...]  # [start, stop) of each chunk in the tensor
    initial: tuple[tuple[tuple[float, ...], ...], ...]
    steps: tuple[Step, ...]
    itemsize: int = ITEMSIZE

    @property
    def result(self) -> list[list[float]]:
        """Every rank's whole tensor after the last step."""
        last = self.steps[-1].holdings if self.steps else self.initial
        return [[x for chunk in rank for x in chunk] for rank in last]

    @property
    def bytes_sent(self) -> list[int]:
        return self._bytes("src")

    @property
    def bytes_received(self) -> list[int]:
        return self._bytes("dst")

    def _bytes(self, side: str) -> list[int]:
        out = [0] * self.world_size
        for step in self.steps:
            for t in step.transfers:
                out[getattr(t, side)] += t.nbytes
        return out


_COMBINE = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum,
            "product": np.multiply}


def chunk_bounds(length: int, world_size: int) -> tuple[tuple[int, int], ...]:
    """Split ``length`` elements into ``world_size`` contiguous chunks, the first ones longer."""
    base, extra = divmod(length, world_size)
    sizes = [base + (i < extra) for i in range(world_size)]
    starts = np.cumsum([0] + sizes)
    return tuple((int(starts[i]), int(starts[i + 1])) for i in range(world_size))


class _Board:
    """The mutable state a trace is recorded from: what each rank holds, chunk by chunk."""

    def __init__(self, values: Sequence[Sequence[float]], bounds, op: str, itemsize: int):
        self.op, self.itemsize, self.n = op, itemsize, len(values)
        self.data = [[np.asarray(v[a:b], dtype=np.float64) for a, b in bounds] for v in values]
        self.who = [[frozenset([r]) for _ in bounds] for r in range(self.n)]
        self.steps: list[Step] = []

    def snapshot(self):
        return (tuple(tuple(tuple(float(x) for x in c) for c in rank) for rank in self.data),
                tuple(tuple(tuple(sorted(w)) for w in rank) for rank in self.who))

    def step(self, phase: str, moves: list[tuple[int, int, int, str]],
             completes: Sequence[tuple[int, int]] = ()) -> None:
        """Apply simultaneous sends (src, dst, chunk, action): all read before any write.

        ``completes`` names the (rank, chunk) pairs that now hold every rank's contribution; for
        AVG those are divided by N once, there, before anyone passes them on.
        """
        sent = [(s, d, c, a, self.data[s][c].copy(), self.who[s][c]) for s, d, c, a in moves]
        for _s, d, c, action, values, who in sent:
            if action == "reduce":
                self.data[d][c] = _COMBINE[self.op](self.data[d][c], values)
                self.who[d][c] = self.who[d][c] | who
            else:
                self.data[d][c], self.who[d][c] = values, who
        if self.op == "avg":
            for r, c in completes:
                self.data[r][c] = self.data[r][c] / self.n
        transfers = tuple(Transfer(s, d, c, tuple(float(x) for x in v), v.size * self.itemsize, a)
                          for s, d, c, a, v, _ in sent)
        holdings, contributors = self.snapshot()
        self.steps.append(Step(len(self.steps) + 1, phase, transfers, holdings, contributors))


def ring_trace(values: Sequence[Sequence[float]], op: str = "sum",
               itemsize: int = ITEMSIZE) -> Trace:
    """Ring allreduce, step by step: N-1 reduce-scatter steps, then N-1 all-gather steps.

    The tensor is cut into N chunks.  In reduce-scatter step k every rank r sends chunk (r-k) mod
    N to rank r+1, which combines it with its own copy; afterwards rank r holds the complete
    result for chunk (r+1) mod N.  In all-gather step k rank r passes the finished chunk
    (r+1-k) mod N on to rank r+1, which keeps it.  Every rank sends 2(N-1) chunks of S/N.
    """
    op, n = check_op(op), len(values)
    bounds = chunk_bounds(len(values[0]), n)
    board = _Board(values, bounds, op, itemsize)
    initial = board.snapshot()[0]
    for k in range(n - 1):
        done = [(r, (r + 1) % n) for r in range(n)] if k == n - 2 else ()
        board.step("reduce-scatter", [(r, (r + 1) % n, (r - k) % n, "reduce") for r in range(n)],
                   done)
    for k in range(n - 1):
        board.step("all-gather", [(r, (r + 1) % n, (r + 1 - k) % n, "copy") for r in range(n)])
    return Trace("ring", op, n, bounds, initial, tuple(board.steps), itemsize)


def naive_trace(values: Sequence[Sequence[float]], op: str = "sum",
                itemsize: int = ITEMSIZE) -> Trace:
    """Everyone sends the whole tensor to rank 0, which combines and sends the result back.

    Rank 0's one link carries every message, one at a time: N-1 gather steps, N-1 broadcast
    steps, each moving the whole tensor.
    """
    op, n = check_op(op), len(values)
    bounds = ((0, len(values[0])),)
    board = _Board(values, bounds, op, itemsize)
    initial = board.snapshot()[0]
    for r in range(1, n):
        board.step("gather to rank 0", [(r, 0, 0, "reduce")], [(0, 0)] if r == n - 1 else ())
    for r in range(1, n):
        board.step("broadcast from rank 0", [(0, r, 0, "copy")])
    return Trace("naive", op, n, bounds, initial, tuple(board.steps), itemsize)


def compare_with_real(trace: Trace, real: CollectiveResult, rtol: float = 1e-5,
                      atol: float = 1e-6) -> tuple[bool, float]:
    """(whether the simulation equals the real all_reduce, the largest |difference|).

    Equal means to float32 rounding: the real all_reduce adds in its own order, in float32.
    """
    sim = np.asarray(trace.result, dtype=np.float64)
    got = np.asarray([r.after for r in real.ranks], dtype=np.float64)
    if sim.shape != got.shape:
        raise ValueError(f"the simulation holds {sim.shape}, the real run {got.shape}")
    err = float(np.abs(sim - got).max()) if sim.size else 0.0
    return bool(np.allclose(sim, got, rtol=rtol, atol=atol)), err


# ============================================================================ what it costs
@dataclass(frozen=True)
class SchemeCost:
    """Traffic of one allreduce of ``size_bytes``, when each link moves one message at a time."""

    scheme: str
    steps: int
    message_bytes: float  # what one message carries
    max_sent_bytes: float  # by the busiest rank
    max_received_bytes: float
    serial_bytes: float  # steps x message size: the time, in units of bytes over link bandwidth


def scheme_costs(size_bytes: float, world_size: int) -> list[SchemeCost]:
    """Ring against naive (gather to rank 0, broadcast back), for a tensor of ``size_bytes``.

    Both take 2(N-1) steps; a ring step moves S/N on every link at once, a naive step moves all
    of S through rank 0.  So the ring is N times faster on bandwidth, and no rank is a hot spot.
    """
    n, s = world_size, float(size_bytes)
    steps = ring.steps(n)
    return [SchemeCost("ring", steps, s / n, ring.wire_bytes(s, n), ring.wire_bytes(s, n),
                       steps * s / n),
            SchemeCost("naive", steps, s, (n - 1) * s, (n - 1) * s, steps * s)]
