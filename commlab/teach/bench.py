"""Allreduce bandwidth, measured the way nccl-tests measures it, beside a memory copy.

For a message of S bytes that one allreduce moves in t seconds (averaged over iterations and
over ranks, as nccl-tests does by default):

* algbw = S / t, the rate the caller sees;
* busbw = algbw * 2(N-1)/N, the rate each rank's link actually carried: a ring allreduce makes
  every rank send (and receive) 2(N-1)/N * S bytes, so busbw is comparable across world sizes
  and with the hardware's peak.

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


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth, bytes per second: the message size over the time of one allreduce."""
    return size_bytes / seconds


def bus_factor(world_size: int) -> float:
    """nccl-tests' allreduce factor 2(N-1)/N: the share of S each rank sends in a ring
    (``commlab.analysis.ring``)."""
    return ring.factor(world_size)


def busbw(algbw_bytes_per_s: float, world_size: int) -> float:
    """Bus bandwidth, bytes per second, as nccl-tests defines it for allreduce."""
    return algbw_bytes_per_s * bus_factor(world_size)


def iterations_for(size_bytes: int, budget_bytes: int = 256 << 20, lo: int = 3,
                   hi: int = 50) -> int:
    """Timed iterations for one size: enough to average small messages, few for large ones."""
    return max(lo, min(hi, budget_bytes // max(size_bytes, 1)))


# ============================================================================ the measurement
@dataclass
class BenchRow:
    size_bytes: int
    iters: int
    time_us: float  # one allreduce, averaged over iterations and ranks
    algbw_gbps: float  # GB/s, 1e9 bytes per second, as nccl-tests prints
    busbw_gbps: float
    memcpy_gbps: float  # rank 0 copying the same number of bytes on its device

    @property
    def size(self) -> str:
        return format_size(self.size_bytes)


@dataclass
class BenchResult:
    backend: str
    world_size: int
    rows: list[BenchRow]

    def to_dict(self) -> dict:
        return {"backend": self.backend, "world_size": self.world_size,
                "bus_factor": bus_factor(self.world_size),
                "rows": [{"size": r.size, **asdict(r)} for r in self.rows]}


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


def bench_plan(world_size: int = 2, sizes: str | Sequence = DEFAULT_SIZES, backend: str = "auto",
               iters: int | None = None, warmup: int = 2) -> BenchPlan:
    """Validated settings (ConfigError naming the field); ``iters`` None picks per size."""
    world_size = check_world_size(world_size)
    parsed = parse_sizes(sizes)
    if iters is not None and (isinstance(iters, bool) or not isinstance(iters, int) or iters < 1):
        raise ConfigError({"iters": f"must be a whole number of at least 1, got {iters!r}"})
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError({"warmup": f"must be a whole number, 0 or more, got {warmup!r}"})
    return BenchPlan(world_size, resolve_backend(backend, world_size),
                     tuple((s, iters or iterations_for(s)) for s in parsed), warmup)


def run_bench(world_size: int = 2, sizes: str | Sequence = DEFAULT_SIZES, backend: str = "auto",
              iters: int | None = None, warmup: int = 2, timeout_s: float = 600.0,
              on_row: Callable[[BenchRow], None] | None = None) -> BenchResult:
    """Time ``dist.all_reduce`` of each message size on ``world_size`` real ranks.

    Everything is validated before a process starts; ``on_row`` sees each size as it finishes.
    """
    return run_plan(bench_plan(world_size, sizes, backend, iters, warmup), timeout_s, on_row)


def run_plan(plan: BenchPlan, timeout_s: float = 600.0,
             on_row: Callable[[BenchRow], None] | None = None) -> BenchResult:
    rows: list[BenchRow] = []

    def collect(msg) -> None:
        size, n, seconds, copy_seconds = msg
        alg = algbw(size, seconds)
        rows.append(BenchRow(size, n, seconds * 1e6, alg / 1e9, busbw(alg, plan.world_size) / 1e9,
                             algbw(size, copy_seconds) / 1e9))
        if on_row:
            on_row(rows[-1])

    run_ranks(_bench_rank, plan.world_size, (list(plan.sizes), plan.warmup), backend=plan.backend,
              timeout_s=timeout_s, on_message=collect)
    return BenchResult(plan.backend, plan.world_size, rows)


def _bench_rank(rank: int, world_size: int, report, plan: list[tuple[int, int]],
                warmup: int) -> None:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    for size, iters in plan:
        x = torch.zeros(size // ITEMSIZE, device=device)  # stays zero: no overflow, no denormals
        copy_s = _time_copy(x, iters, warmup) if rank == 0 else 0.0
        for _ in range(warmup):
            dist.all_reduce(x)
        _sync(device)
        dist.barrier()  # start the clock together
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        _sync(device)
        mean = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64,
                            device=device)
        dist.all_reduce(mean)  # nccl-tests' default report: the time averaged over ranks
        if rank == 0:
            report((size, iters, mean.item() / world_size, copy_s))


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
