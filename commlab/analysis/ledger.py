"""A run's communication ledger: every collective it issued, by traffic, kind, ranks and message size.

What DeepSpeed's comms logger prints, with nccl-tests' definitions: for each kind of collective and
message size, how many calls, their total and mean latency, the algorithm bandwidth (algbw = S /
mean latency, ``ring.algbw``) and the bus bandwidth (busbw = algbw * ``ring.bus_factor``), and the
bytes.  S is nccl-tests' size, the largest buffer of the call (``message_size``): an allgather's
output, N pieces of what each rank hands over.

Each call is filed under the traffic it belongs to (``TRAFFIC``): the hook's (what metrics.jsonl's
``payload_bytes`` and ``collectives`` count), the lab's exact mean for the approximation error
(``measure_bytes``), and the lab's own (the worker's mean loss over the ranks, one scalar allreduce
a step, outside the hook).  Only the hook's is the algorithm's traffic; the other two are listed
apart so that nothing the instrument counts goes unaccounted.  It holds the calls of
``dist.all_reduce`` and ``dist.all_gather``, the two collectives the lab's hooks issue, and of
``dist.all_gather_single`` and ``dist.reduce_scatter_single``, FSDP2's (a sharded run's); the lab's object collectives (the checkpoint decision's broadcast, the
traced steps' gathers) and DDP's own allreduce before a hook is registered (a resumed run's first
pass) are not in it.

A call's latency runs from its issue (the call of ``dist.all_reduce``) to the completion of its
work, on the host's clock (``Ledger.completed``).  On a run with an emulated link, each of the
hook's collectives completes no earlier than the link would have carried it
(``commlab.hooks.link.Link``), and the link carries one collective at a time.
``link_wait_s`` is what the link's hold added to their latency past the real completions: their
own link time and their wait behind the hook's other collectives on it, less what the real
collective took meanwhile; ``link_share`` is its share of the latency, what the link made of it.
``link_s`` is the link's own time for the calls (what metrics.jsonl's ``link_s`` sums).  On NCCL a collective's work completes for the host once
it is queued on the GPU: there the ledger's latencies are launch times, and the traced steps'
timeline has the device's.

Pure: the instrument (``commlab.hooks.instrument``) feeds it, rank 0 writes its rows to ledger.json.
"""
from __future__ import annotations

from dataclasses import dataclass

from commlab.analysis import ring

HOOK, MEASURE, OTHER, SHARDING = "hook", "measure", "other", "sharding"
# A row's bandwidths are gigabytes a second (GB/s), as nccl-tests prints them, while every *_gbps
# of the lab (a link, a cluster) is gigabits: their names say so.  ledger.json files written before
# named them algbw_gbps and busbw_gbps; ``upgraded`` reads those with today's names.
BANDWIDTHS = {"algbw_gbps": "algbw_gbytes_s", "busbw_gbps": "busbw_gbytes_s"}
TRAFFIC = {
    HOOK: "the hook's collectives: what metrics.jsonl's payload_bytes and collectives count",
    MEASURE: "the lab's exact mean gradient for the approximation error (every error_every steps; "
             "metrics.jsonl's measure_bytes)",
    OTHER: "the lab's own: the worker's mean loss over the ranks, one scalar allreduce a step, "
           "issued outside the hook",
    SHARDING: "a sharded run's FSDP collectives: each layer's parameters all-gathered (in forward, "
              "and again in backward when resharded after forward) and its gradients reduce-scattered "
              "(metrics.jsonl's sharding_bytes)",
}


def message_size(collective: str, tensor_bytes: int, group_size: int) -> int:
    """nccl-tests' S for one call in which this rank hands ``tensor_bytes`` to ``collective`` on
    ``group_size`` ranks: the call's largest buffer, an allgather's output (g pieces of what each
    hands over), a reduce_scatter's input (the tensor handed over), the tensor itself otherwise."""
    ring.bus_factor(collective, group_size)  # names an unknown collective
    return tensor_bytes * group_size if collective == "all_gather" else tensor_bytes


@dataclass
class Entry:
    """The calls of one (traffic, collective, ranks, size): counted as issued, timed as completed."""

    traffic: str
    collective: str
    ranks: int
    size_bytes: int
    count: int = 0
    counted_bytes: int = 0  # the instrument's allreduce-payload ruler (metrics.jsonl's payload_bytes)
    timed: int = 0  # calls whose completion was seen
    total_s: float = 0.0
    link_s: float = 0.0
    link_wait_s: float = 0.0

    def row(self) -> dict:
        """The ledger's row: the sums and their figures (None where nothing was timed yet, or the
        call's size or time is zero)."""
        mean = self.total_s / self.timed if self.timed else None
        alg = ring.algbw(self.size_bytes, mean) if mean else None
        bus = None if alg is None else ring.busbw(alg, self.ranks, self.collective)
        return {"traffic": self.traffic, "collective": self.collective, "ranks": self.ranks,
                "size_bytes": self.size_bytes, "count": self.count,
                "bytes": self.count * self.size_bytes, "counted_bytes": self.counted_bytes,
                "timed": self.timed, "total_s": self.total_s, "mean_s": mean,
                # gigabytes, 1e9 bytes, a second, as nccl-tests prints them (``BANDWIDTHS``)
                "algbw_gbytes_s": None if alg is None else alg / 1e9,
                "busbw_gbytes_s": None if bus is None else bus / 1e9,
                "bus_factor": ring.bus_factor(self.collective, self.ranks),
                "link_s": self.link_s, "link_wait_s": self.link_wait_s,
                "link_share": self.link_wait_s / self.total_s if self.total_s else None}


class Ledger:
    """Every call filed by (traffic, collective, ranks, size).  Not thread-safe on its own: its
    caller holds a lock (the instrument's counter does)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, Entry] = {}

    def issued(self, traffic: str, collective: str, ranks: int, tensor_bytes: int,
               counted_bytes: int) -> Entry:
        """One call issued; returns its entry, for ``completed``."""
        size = message_size(collective, tensor_bytes, ranks)
        key = (traffic, collective, ranks, size)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = Entry(traffic, collective, ranks, size)
        entry.count += 1
        entry.counted_bytes += counted_bytes
        return entry

    @staticmethod
    def completed(entry: Entry, latency_s: float, link_s: float = 0.0, link_wait_s: float = 0.0) -> None:
        """One call of ``entry`` done ``latency_s`` after its issue; ``link_s`` the emulated link's
        time for it, ``link_wait_s`` of the latency its hold past the real completion."""
        entry.timed += 1
        entry.total_s += latency_s
        entry.link_s += link_s
        entry.link_wait_s += link_wait_s

    def rows(self) -> list[dict]:
        """Every entry's row, hook traffic first, then by collective and size."""
        order = list(TRAFFIC)
        return [e.row() for e in sorted(self._entries.values(), key=lambda e: (
            order.index(e.traffic), e.collective, e.ranks, e.size_bytes))]


def upgraded(written: dict) -> dict:
    """ledger.json as written, its rows' bandwidths under today's names (``BANDWIDTHS``)."""
    if not written:
        return written
    return {**written, "rows": [{BANDWIDTHS.get(k, k): v for k, v in r.items()} for r in written["rows"]]}


def totals(rows: list[dict]) -> dict[str, dict]:
    """Per traffic: calls, bytes (S summed), counted bytes, total latency, the link's time, its
    share of the latency and its wait."""
    out: dict[str, dict] = {}
    for r in rows:
        t = out.setdefault(r["traffic"], {"count": 0, "bytes": 0, "counted_bytes": 0, "total_s": 0.0,
                                          "link_s": 0.0, "link_wait_s": 0.0})
        for k in t:
            t[k] += r[k]
    for t in out.values():
        t["link_share"] = t["link_wait_s"] / t["total_s"] if t["total_s"] else None
    return out
