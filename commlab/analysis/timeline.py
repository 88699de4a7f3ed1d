"""One step's timeline, rank by rank: what it holds, how much communication backward hid, and the
same timeline as a Chrome trace (the JSON format Perfetto and chrome://tracing open).

A rank's step is a list of events, each a dict with ``kind``, ``start`` and ``end`` (seconds on the
rank's ``time.perf_counter``, one clock for every rank of a machine) and, by kind:

- ``forward``, ``backward``, ``optimizer``, ``averaging``: the compute thread's phases
  (``loss.backward()`` ends once DDP has waited for every bucket's future, FSDP for its
  reduce-scatters; ``averaging``, after the optimizer step, is a model averager's: post-local SGD's,
  DiLoCo's outer step; files written before have no ``forward``);
- ``hook``: DDP calling the hook for ``bucket`` (its gradients are ready) until the hook returned;
  on a sharded run, FSDP calling the lab's hook between HSDP's replicas for ``unit`` (its gradients
  reduce-scattered) until it returned, its collectives waited for;
- ``future``: from DDP's call until the hook's future completed (the bucket's window);
- ``collective``: one collective, from its issue until it completed, with ``collective`` (its kind:
  all_reduce, all_gather, reduce_scatter; files written before have none), ``bucket`` (None when
  issued outside a hook), ``category`` (the ledger's traffic: hook, measure, other, sharding: see
  ``commlab.analysis.ledger``), ``bytes`` (as metrics.jsonl counts them: the allreduce payload that
  puts as much on the wire), ``size_bytes`` and ``ranks`` (the ledger's message size S and the
  ranks of its group), ``thread`` (the issuing thread's name) and ``link_s``, the part of it that
  only the emulated link held back (0 without one).

On a sharded run (FSDP2, HSDP) the units stand where DDP's buckets do: each collective a unit issued
(its all-gather in forward, again in backward when resharded after forward, prefetched by FSDP as
the unit after it starts its backward; its reduce-scatter; the all-reduce between HSDP's replicas after it, FSDP's
or the lab's hook's) and each call of the lab's hook has ``unit``, the name of the module
``fully_shard`` went on ("" for the root's own parameters), and no ``bucket``.

On CUDA (NCCL runs) the host's clock says when work was queued, not when it ran, so every event
is timed on the device as well, and its ``start`` and ``end`` are the device's, on the same
perf_counter clock (``commlab.hooks.instrument.DeviceClock``): CUDA events recorded on the stream
the work is on (a collective from when its issuing stream had its input ready until its result
was ready; a hook call from when its bucket's gradients were ready; backward and the optimizer
around what they queued), resolved after the step from their elapsed time since a reference event
recorded at a synchronize at the step's start, plus that synchronize's perf_counter time.  Such an
event has ``clock: "cuda"``, and its host times as ``host_start`` and ``host_end``; an event
without ``clock`` is the host's.
"""
from __future__ import annotations

from commlab.analysis import ring

COMPUTE, COMM = "compute", "comm"  # the two threads of a rank in the Chrome trace
PHASES = ("forward", "backward", "optimizer", "averaging", "hook")  # drawn on the compute thread; the rest on comm


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def covered_s(intervals: list[tuple[float, float]]) -> float:
    """The time at least one of ``intervals`` is open (overlaps counted once)."""
    return _length(_union(intervals))


def backward_compute(events: list[dict]) -> tuple[float, float] | None:
    """From backward's start to the last hook call: after it, autograd has nothing left to compute
    and backward only waits for the buckets' futures."""
    backward = [e for e in events if e["kind"] == "backward"]
    hooks = [e["start"] for e in events if e["kind"] == "hook"]
    if not backward or not hooks:
        return None
    return backward[0]["start"], max(hooks)


def _minus(intervals: list[tuple[float, float]], holes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for a, b in intervals:
        for h0, h1 in _union(holes):
            if h1 <= a or h0 >= b:
                continue
            if h0 > a:
                out.append((a, h0))
            a = max(a, h1)
        if b > a:
            out.append((a, b))
    return out


def _intersect(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in xs for c, d in ys)


def _computing(events: list[dict]) -> list[tuple[float, float]] | None:
    """When backward computed: from its start to the last hook call, except while it was inside
    a hook call (a hook that waits for its collectives in its body stops backward)."""
    window = backward_compute(events)
    if window is None:
        return None
    return _minus([window], [(e["start"], e["end"]) for e in events if e["kind"] == "hook"])


def backward_compute_s(events: list[dict]) -> float | None:
    """Seconds backward computed (``_computing``): the same for a hook that blocks as for one
    that returns at once, where ``backward_compute``'s window also holds the blocking waits."""
    computing = _computing(events)
    return None if computing is None else _length(computing)


def overlap_share(events: list[dict]) -> float | None:
    """Communication hidden behind backward / all communication: the time the hook's collectives
    were in flight while backward computed (``_computing``), over the time they were in flight
    at all."""
    computing = _computing(events)
    comm = _union([(e["start"], e["end"]) for e in events
                   if e["kind"] == "collective" and e.get("category") == "hook"])
    total = _length(comm)
    if computing is None or total <= 0:
        return None
    return _intersect(comm, computing) / total


def link_share(events: list[dict]) -> float | None:
    """The part of the hook's collectives' time that only the emulated link held them (their
    ``link_s`` over their durations): near 1, they waited for the link; near 0, for loopback
    Gloo, a late peer or a busy core (and 0 without an emulated link)."""
    comm = [e for e in events if e["kind"] == "collective" and e.get("category") == "hook"]
    total = sum(e["end"] - e["start"] for e in comm)
    return sum(e.get("link_s", 0.0) for e in comm) / total if total > 0 else None


def _run_mean(steps: dict[str, dict[str, list[dict]]], share) -> float | None:
    shares = [s for ranks in steps.values() for events in ranks.values()
              if (s := share(events)) is not None]
    return sum(shares) / len(shares) if shares else None


def run_overlap_share(steps: dict[str, dict[str, list[dict]]]) -> float | None:
    """The mean of ``overlap_share`` over every traced step and rank that communicated."""
    return _run_mean(steps, overlap_share)


def run_link_share(steps: dict[str, dict[str, list[dict]]]) -> float | None:
    """The mean of ``link_share`` over every traced step and rank that communicated."""
    return _run_mean(steps, link_share)


def is_sharded(steps: dict[str, dict[str, list[dict]]]) -> bool:
    """Whether the traced steps are a sharded run's: an event names a unit."""
    return any("unit" in e for ranks in steps.values() for events in ranks.values() for e in events)


def where(e: dict) -> str:
    """What an event belongs to: its unit (a sharded run's), its bucket (DDP's), or "" for neither."""
    if "unit" in e:
        return f"unit {e['unit'] or 'root'}"
    return f"bucket {e['bucket']}" if e.get("bucket") is not None else ""


def _name(e: dict) -> str:
    at = f" {where(e)}" if where(e) else ""
    if e["kind"] == "collective":
        return f"{e.get('collective', ring.ALLREDUCE)} ({e.get('category')}){at}"
    return f"{e['kind']}{at}"


def chrome_trace(steps: dict[str, dict[str, list[dict]]]) -> dict:
    """``{"traceEvents": [...]}``: one process per rank, a compute and a communication thread,
    complete ("X") events in microseconds from the earliest event of any rank; the emulated part
    of a collective is a nested event of its own."""
    all_events = [e for ranks in steps.values() for events in ranks.values() for e in events]
    t0 = min((e["start"] for e in all_events), default=0.0)
    out: list[dict] = []
    ranks = sorted({int(r) for step in steps.values() for r in step})
    for rank in ranks:
        out.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for tid, name in enumerate((COMPUTE, COMM)):
            out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                        "args": {"name": name}})
    for step, by_rank in steps.items():
        for rank, events in by_rank.items():
            for e in events:
                tid = 0 if e["kind"] in PHASES else 1
                args = {k: v for k, v in e.items() if k not in ("kind", "start", "end")}
                out.append({"ph": "X", "name": _name(e), "cat": e["kind"], "pid": int(rank),
                            "tid": tid, "ts": (e["start"] - t0) * 1e6,
                            "dur": max(e["end"] - e["start"], 0.0) * 1e6,
                            "args": {"step": int(step), **args}})
                if e.get("link_s", 0) > 0:
                    out.append({"ph": "X", "name": "emulated link", "cat": "link", "pid": int(rank),
                                "tid": tid, "ts": (e["end"] - e["link_s"] - t0) * 1e6,
                                "dur": e["link_s"] * 1e6, "args": {"step": int(step)}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}
