"""Collective bandwidth, measured the way nccl-tests measures it, beside a memory copy.

For each collective (all_reduce, all_gather, reduce_scatter, broadcast, reduce) and message size
S, as nccl-tests' columns have it, out-of-place and in-place:

* time: one call, averaged over iterations and over ranks (nccl-tests' default report);
* algbw = S / time, the rate the caller sees; S is the call's largest buffer (all_gather's
  output, reduce_scatter's input, as nccl-tests prints it);
* busbw = algbw * the collective's bus factor (``commlab.analysis.ring.bus_factor``, from
  nccl-tests' PERFORMANCE.md: all_reduce 2(N-1)/N, all_gather and reduce_scatter (N-1)/N,
  broadcast and reduce 1), the rate each rank's link carried, comparable across N and with the
  hardware;
* #wrong: after the timed calls, every rank fills its buffers with a known pattern, runs the
  call once more, and counts the elements that differ from the exact answer (summed over ranks;
  for reduce, on the root only, the one rank that receives a result).

Out-of-place writes the result to a second buffer.  torch.distributed's all_reduce, broadcast
and reduce only work in place, so their out-of-place form copies into the second buffer first,
as torch's functional collectives do; in place, all_gather's input is its own slice of the output and
reduce_scatter's output its own slice of the input, as in nccl-tests.

The ceiling beside it: how fast this machine copies S bytes from one buffer to another
(``dst.copy_(src)`` by rank 0 on its own device, one CPU thread for Gloo), measured in the same
run.  Over loopback Gloo every byte is copied into a socket, out of it, and reduced, so busbw
stays well below the copy rate.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from commlab.analysis import ring
from commlab.analysis.ring import algbw, busbw  # nccl-tests' figures, shared with the run ledger
from commlab.config import BACKENDS, ConfigError
from commlab.devices import gpu_count, pick_backend
from commlab.engine.ranks import run_ranks
from commlab.teach.classroom import check_world_size

# As in nccl-tests, K, M and G are powers of 1024.
UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
         "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
ITEMSIZE = 4  # float32
MAX_SIZE = 1 << 30
DEFAULT_SIZES = "1KB,16KB,256KB,1MB,4MB,16MB,64MB"
COLLECTIVES = ring.COLLECTIVES
ROOT = 0  # broadcast's source and reduce's destination, as nccl-tests' default root
PATTERN = 5  # buffers hold i % PATTERN + rank: small whole numbers, exact in float32 sums


# ============================================================================ arithmetic
def parse_size(text: str) -> int:
    """'64MB' -> 67108864; raises ConfigError naming ``sizes``."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m and m.group(2).upper()
    if not m or unit not in UNITS:
        raise ConfigError({"sizes": f"{text!r} is not a size; write a number with B, KB, MB or "
                                    "GB (powers of 1024), e.g. 64MB"})
    size = int(float(m.group(1)) * UNITS[unit])
    if not ITEMSIZE <= size <= MAX_SIZE:
        raise ConfigError({"sizes": f"{text!r}: each message must be from {ITEMSIZE} B (one "
                                    f"float32) to {format_size(MAX_SIZE)}"})
    return size


def parse_sizes(sizes: str | Sequence[str | int]) -> list[int]:
    """A comma-separated list (or a sequence) of sizes, in bytes, rounded down to whole float32s."""
    items = [s for s in sizes.split(",") if s.strip()] if isinstance(sizes, str) else list(sizes)
    if not items:
        raise ConfigError({"sizes": "give at least one message size, e.g. 1KB,1MB"})
    parsed = [parse_size(s) if isinstance(s, str) else parse_size(f"{int(s)}B") for s in items]
    return [s - s % ITEMSIZE for s in parsed]


def format_size(size_bytes: float) -> str:
    for unit in ("GB", "MB", "KB"):
        if size_bytes >= UNITS[unit]:
            return f"{size_bytes / UNITS[unit]:g}{unit}"
    return f"{size_bytes:g}B"


def message_bytes(size_bytes: int, collective: str, world_size: int) -> int:
    """The size actually sent: whole float32s, and for all_gather and reduce_scatter whole chunks
    of S/N (at least one float32 each), as nccl-tests rounds its counts."""
    unit = ITEMSIZE * (world_size if collective in ("all_gather", "reduce_scatter") else 1)
    return max(unit, size_bytes - size_bytes % unit)


def check_collectives(collectives: str | Sequence[str]) -> tuple[str, ...]:
    items = [c.strip() for c in collectives.split(",") if c.strip()] \
        if isinstance(collectives, str) else list(collectives)
    names = tuple(str(c).lower().replace("-", "_") for c in items)
    unknown = [c for c in names if c not in COLLECTIVES]
    if unknown or not names:
        raise ConfigError({"collectives": f"unknown collective(s) {unknown}; choose from "
                                          f"{', '.join(COLLECTIVES)}" if unknown else
                                          "give at least one of " + ", ".join(COLLECTIVES)})
    return tuple(dict.fromkeys(names))


def iterations_for(size_bytes: int, budget_bytes: int = 256 << 20, lo: int = 3,
                   hi: int = 50) -> int:
    """Timed iterations for one size: enough to average small messages, few for large ones."""
    return max(lo, min(hi, budget_bytes // max(size_bytes, 1)))


# ============================================================================ the measurement
@dataclass
class Timing:
    """One column group of nccl-tests' table: out-of-place or in-place."""

    time_us: float  # one call, averaged over iterations and ranks
    algbw_gbytes_s: float  # GB/s, 1e9 bytes per second, as nccl-tests prints
    busbw_gbytes_s: float
    wrong: int  # elements that differ from the exact answer, summed over ranks


@dataclass
class BenchRow:
    collective: str
    size_bytes: int  # S: the largest buffer of the call
    iters: int
    out_of_place: Timing
    in_place: Timing
    memcpy_gbytes_s: float  # rank 0 copying the same number of bytes on its device

    @property
    def size(self) -> str:
        return format_size(self.size_bytes)

    @property
    def count(self) -> int:
        return self.size_bytes // ITEMSIZE


@dataclass
class BenchResult:
    backend: str
    world_size: int
    rows: list[BenchRow]

    def to_dict(self) -> dict:
        return {"backend": self.backend, "world_size": self.world_size,
                "bus_factors": {c: ring.bus_factor(c, self.world_size)
                                for c in dict.fromkeys(r.collective for r in self.rows)},
                "rows": [{"size": r.size, "count": r.count, **asdict(r)} for r in self.rows]}


def resolve_backend(backend: str, world_size: int, gpus: int | None = None) -> str:
    """The backend the bench runs on, by the runs' own rule; refuses NCCL without a GPU per rank."""
    if backend not in BACKENDS:
        raise ConfigError({"backend": f"unknown backend {backend!r}; valid backends are: "
                                      f"{', '.join(BACKENDS)}"})
    if backend == "nccl" and (gpus := gpu_count() if gpus is None else gpus) < world_size:
        raise ConfigError({"backend": f"NCCL runs one rank per GPU: {world_size} rank(s) need "
                                      f"{world_size} GPU(s), this machine has {gpus}"})
    return pick_backend(backend, world_size, gpus)[0]


@dataclass(frozen=True)
class BenchPlan:
    world_size: int
    backend: str
    sizes: tuple[tuple[int, int], ...]  # (bytes, timed iterations)
    warmup: int
    collectives: tuple[str, ...] = COLLECTIVES


def bench_plan(world_size: int = 2, sizes: str | Sequence = DEFAULT_SIZES, backend: str = "auto",
               iters: int | None = None, warmup: int = 2,
               collectives: str | Sequence[str] = COLLECTIVES) -> BenchPlan:
    """Validated settings (ConfigError naming the field); ``iters`` None picks per size."""
    world_size = check_world_size(world_size)
    parsed = parse_sizes(sizes)
    chosen = check_collectives(collectives)
    if iters is not None and (isinstance(iters, bool) or not isinstance(iters, int) or iters < 1):
        raise ConfigError({"iters": f"must be a whole number of at least 1, got {iters!r}"})
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError({"warmup": f"must be a whole number, 0 or more, got {warmup!r}"})
    return BenchPlan(world_size, resolve_backend(backend, world_size),
                     tuple((s, iters or iterations_for(s)) for s in parsed), warmup, chosen)


def run_bench(world_size: int = 2, sizes: str | Sequence = DEFAULT_SIZES, backend: str = "auto",
              iters: int | None = None, warmup: int = 2, timeout_s: float = 600.0,
              on_row: Callable[[BenchRow], None] | None = None,
              collectives: str | Sequence[str] = COLLECTIVES) -> BenchResult:
    """Time each collective at each message size on ``world_size`` real ranks.

    Everything is validated before a process starts; ``on_row`` sees each row as it finishes.
    """
    return run_plan(bench_plan(world_size, sizes, backend, iters, warmup, collectives),
                    timeout_s, on_row)


def run_plan(plan: BenchPlan, timeout_s: float = 600.0,
             on_row: Callable[[BenchRow], None] | None = None) -> BenchResult:
    rows: list[BenchRow] = []
    n = plan.world_size

    def timing(collective: str, size: int, seconds: float, wrong: int) -> Timing:
        alg = algbw(size, seconds)
        return Timing(seconds * 1e6, alg / 1e9, busbw(alg, n, collective) / 1e9, wrong)

    def collect(msg) -> None:
        collective, size, iters, oop_s, ip_s, oop_wrong, ip_wrong, copy_s = msg
        rows.append(BenchRow(collective, size, iters, timing(collective, size, oop_s, oop_wrong),
                             timing(collective, size, ip_s, ip_wrong), algbw(size, copy_s) / 1e9))
        if on_row:
            on_row(rows[-1])

    run_ranks(_bench_rank, n, (list(plan.collectives), list(plan.sizes), plan.warmup),
              backend=plan.backend, timeout_s=timeout_s, on_message=collect)
    return BenchResult(plan.backend, n, rows)


def _bench_rank(rank: int, world_size: int, report, collectives: list[str],
                plan: list[tuple[int, int]], warmup: int) -> None:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    copy_s: dict[int, float] = {}
    for collective in collectives:
        for requested, iters in plan:
            size = message_bytes(requested, collective, world_size)
            if rank == 0 and size not in copy_s:
                copy_s[size] = _time_copy(torch.zeros(size // ITEMSIZE, device=device), iters,
                                          warmup)
            seconds, wrong = [], []
            for in_place in (False, True):
                # Zeros while timing: sums of zeros cannot overflow or turn denormal.
                call, _ = _call(collective, size, in_place, rank, world_size, device, fill=False)
                seconds.append(_time(call, iters, warmup, device))
                call, check = _call(collective, size, in_place, rank, world_size, device, fill=True)
                call()
                _sync(device)
                wrong.append(check())
            totals = torch.tensor(seconds + wrong, dtype=torch.float64, device=device)
            dist.all_reduce(totals)  # nccl-tests' report: times averaged, errors summed over ranks
            oop_s, ip_s, oop_wrong, ip_wrong = totals.tolist()
            if rank == 0:
                report((collective, size, iters, oop_s / world_size, ip_s / world_size,
                        int(oop_wrong), int(ip_wrong), copy_s[size]))


@dataclass(frozen=True)
class _Patterns:
    """The buffers' contents.  With ``fill`` rank r's input holds i % PATTERN + r at the i-th
    element of the largest buffer, so that the exact answer is whole numbers; without it the
    buffers are zeros (timing: sums of zeros cannot overflow or turn denormal)."""

    count: int
    n: int
    device: object
    fill: bool

    def index(self):
        import torch

        return torch.arange(self.count, device=self.device)

    def of(self, r: int, part=slice(None)):
        import torch

        if not self.fill:
            return torch.zeros(self.count, device=self.device)[part]
        return (self.index()[part] % PATTERN + r).float()

    def reduced(self):
        """The sum of every rank's pattern."""
        return self.n * (self.index() % PATTERN).float() + self.n * (self.n - 1) / 2


def _call(collective: str, size: int, in_place: bool, rank: int, n: int, device, fill: bool):
    """(one call of ``collective`` on fresh buffers (``_Patterns``), a count of its wrong
    elements: 0 without ``fill``)."""
    import torch
    import torch.distributed as dist

    count = size // ITEMSIZE
    chunk = count // n
    mine = slice(rank * chunk, (rank + 1) * chunk)
    p = _Patterns(count, n, device, fill)

    if collective == "all_gather":
        out = torch.zeros(count, device=device)
        if in_place:
            out[mine] = p.of(rank, mine)
            inp = out[mine]
        else:
            inp = p.of(rank, mine)

        def want():
            return (p.index() % PATTERN + p.index() // chunk).float()

        def call():
            dist.all_gather_single(out, inp)
    elif collective == "reduce_scatter":
        inp = p.of(rank)
        out = inp[mine] if in_place else torch.zeros(chunk, device=device)

        def want():
            return p.reduced()[mine]

        def call():
            dist.reduce_scatter_single(out, inp)
    elif collective in ("all_reduce", "broadcast", "reduce"):
        src = p.of(rank)
        out = src if in_place else torch.zeros(count, device=device)

        def want():
            if collective == "reduce" and rank != ROOT:
                return out  # the other ranks' buffers are scratch: nothing to check
            return p.of(ROOT) if collective == "broadcast" else p.reduced()

        def call():
            if not in_place:  # torch has no out-of-place form: copy first, as functional ones do
                out.copy_(src)
            if collective == "all_reduce":
                dist.all_reduce(out)
            elif collective == "broadcast":
                dist.broadcast(out, src=ROOT)
            else:
                dist.reduce(out, dst=ROOT)
    else:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")

    def wrong() -> int:
        return int((out != want()).sum().item()) if fill else 0

    return call, wrong


def _time(call, iters: int, warmup: int, device) -> float:
    import torch.distributed as dist

    for _ in range(warmup):
        call()
    _sync(device)
    dist.barrier()  # start the clock together
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    _sync(device)
    return (time.perf_counter() - t0) / iters


def _time_copy(x, iters: int, warmup: int) -> float:
    dst = x.clone()
    for _ in range(warmup):
        dst.copy_(x)
    _sync(x.device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dst.copy_(x)
    _sync(x.device)
    return (time.perf_counter() - t0) / iters


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
