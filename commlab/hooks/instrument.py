"""Instrumentation around any communication hook, stock or commlab's.

Bytes are counted where they are handed over: ``torch.distributed.all_reduce`` and ``all_gather``
are wrapped for the life of a run (an allgather counted as the allreduce payload that puts as many
bytes on the wire, ``CollectiveCounter.payload_of``), so PyTorch's hooks and commlab's are measured by the same ruler (both call it
through the module attribute).  The wrapper also records DDP's bucket layouts, the time from a
first hook call of a step to its last future's completion, and every K steps the approximation
error against the exact mean gradient, from one extra allreduce whose bytes are counted apart.  An
emulated link, when set, makes each collective the hook issues complete no earlier than a ring
allreduce of its bytes over that link would (``Link.seconds``) after it started; collectives share
the one link, so a collective issued while another is on it waits for the link to be free, as on
a real network card.  At the steps it is told to trace, it records the step's timeline (see
``commlab.analysis.timeline``): each hook call, each collective's issue and completion, each hook
future's completion, and what the worker adds (backward, the optimizer step).
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.distributed as dist

from commlab.analysis import ring
from commlab.analysis.metrics import relative_error
from commlab.hooks import comm_thread

HOOK, MEASURE, OTHER = "hook", "measure", "other"


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


class _EmulatedWork:
    """A collective's Work whose completion is held back until the emulated link would finish."""

    def __init__(self, work, deadline: float):
        self._work, self._deadline = work, deadline

    def wait(self, *args, **kwargs):
        out = self._work.wait(*args, **kwargs)
        _sleep_until(self._deadline)
        return out

    def get_future(self):
        deadline = self._deadline

        def held(fut):
            _sleep_until(deadline)
            return fut.value()

        return self._work.get_future().then(held)

    def __getattr__(self, name):
        return getattr(self._work, name)


@dataclass
class Link:
    bandwidth_gbps: float = 0.0
    latency_us: float = 0.0

    @property
    def on(self) -> bool:
        return self.bandwidth_gbps > 0 or self.latency_us > 0

    def seconds(self, nbytes: int, world_size: int, latency_steps: int | None = None) -> float:
        """A collective counted as a ring allreduce of nbytes on every rank (``payload_of``): its
        wire time, 2(N-1)/N * S / beta, and ``latency_steps`` latencies (None: an allreduce's
        2(N-1); an allgather on g ranks takes g-1, ``ring.latency_steps``)."""
        hops = ring.steps(world_size) if latency_steps is None else latency_steps
        return (ring.allreduce_s(nbytes, world_size, self.bandwidth_gbps)
                + hops * self.latency_us * 1e-6)


class CollectiveCounter:
    """Counts the bytes handed to ``dist.all_reduce``, by category, while installed."""

    def __init__(self, link: Link | None = None, world_size: int = 1):
        self.link = link or Link()
        self.world_size = world_size
        self._lock = threading.Lock()
        self._local = threading.local()
        self._original = None
        self._link_free = 0.0  # when the emulated link has carried everything handed to it so far
        self.events: list | None = None  # the traced step's timeline, while one is traced
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.bytes = {HOOK: 0, MEASURE: 0, OTHER: 0}
            self.calls = {HOOK: 0, MEASURE: 0, OTHER: 0}

    def take(self) -> tuple[dict, dict]:
        with self._lock:
            out = dict(self.bytes), dict(self.calls)
        self.reset()
        return out

    @contextlib.contextmanager
    def _scoped(self, attr: str, value, default):
        """This thread's ``attr`` is ``value`` inside the block, as it was after."""
        prev = getattr(self._local, attr, default)
        setattr(self._local, attr, value)
        try:
            yield
        finally:
            setattr(self._local, attr, prev)

    def category(self, name: str):
        """Attributes collectives issued from this thread to ``name`` (hooks' are HOOK by default)."""
        return self._scoped("category", name, HOOK)

    def in_bucket(self, index: int):
        """Attributes collectives issued from this thread to bucket ``index`` in the timeline (on
        the communication thread, the job's tag says which bucket)."""
        return self._scoped("bucket", index, None)

    def _traced(self, cat: str, nbytes: int) -> dict | None:
        events = self.events
        if events is None:
            return None
        bucket = getattr(self._local, "bucket", None)
        event = {"kind": "collective", "bucket": comm_thread.job_tag() if bucket is None else bucket,
                 "category": cat, "bytes": nbytes, "thread": threading.current_thread().name,
                 "start": time.perf_counter(), "end": None, "link_s": 0.0}
        events.append(event)
        return event

    def install(self) -> CollectiveCounter:
        self._original = dist.all_reduce
        self._original_gather = dist.all_gather
        original, counter = self._original, self

        def all_reduce(tensor, *args, **kwargs):
            group = _group_arg(args, kwargs, 1)
            nbytes = counter.payload_of("all_reduce", tensor, group)
            return counted(original, nbytes, counter.hops("all_reduce", group), tensor, *args, **kwargs)

        def all_gather(tensor_list, tensor, *args, **kwargs):
            group = _group_arg(args, kwargs, 0)
            nbytes = counter.payload_of("all_gather", tensor, group)
            return counted(counter._original_gather, nbytes, counter.hops("all_gather", group),
                           tensor_list, tensor, *args, **kwargs)

        def counted(call, nbytes, hops, *args, **kwargs):
            cat = getattr(counter._local, "category", HOOK)
            deadline = None
            with counter._lock:
                counter.bytes[cat] += nbytes
                counter.calls[cat] += 1
                if cat == HOOK and counter.link.on:
                    start = max(time.perf_counter(), counter._link_free)
                    deadline = counter._link_free = start + counter.link.seconds(
                        nbytes, counter.world_size, hops)
            event = counter._traced(cat, nbytes)
            work = call(*args, **kwargs)
            if work is None:  # a blocking call: the caller waits for the link too
                if event is not None:
                    _ended(event, deadline)
                if deadline is not None:
                    _sleep_until(deadline)
                return None
            if event is not None:
                work.get_future().add_done_callback(lambda _: _ended(event, deadline))
            return work if deadline is None else _EmulatedWork(work, deadline)

        dist.all_reduce, dist.all_gather = all_reduce, all_gather
        return self

    def payload_of(self, kind: str, tensor, group) -> int:
        """The bytes a collective is counted as: the allreduce payload over all ranks that puts the
        same bytes on each rank's wire, so that every hook is measured by one ruler.  An allreduce
        of S bytes on g ranks sends 2(g-1)/g * S; an allgather of s bytes from each of g ranks sends
        (g-1) * s, so on the whole world (g = N) it counts as N * s / 2, not s.  A subgroup's
        collective (post-local SGD's) counts for its g ranks; on one rank it sends nothing."""
        nbytes = tensor.numel() * tensor.element_size()
        g = self._group_size(group)
        if g == self.world_size and kind == "all_reduce":
            return nbytes
        sent = ring.sent_bytes(kind, nbytes, g)
        world_factor = ring.factor(self.world_size)
        return round(sent / world_factor) if world_factor else 0

    def _group_size(self, group) -> int:
        return dist.get_world_size(group) if group is not None else self.world_size

    def hops(self, kind: str, group) -> int:
        """Ring steps, each one latency, of a collective on ``group`` (``ring.latency_steps``)."""
        return ring.latency_steps(kind, self._group_size(group))

    def uninstall(self) -> None:
        if self._original is not None:
            dist.all_reduce, dist.all_gather = self._original, self._original_gather
            self._original = None


def _group_arg(args: tuple, kwargs: dict, before: int):
    """The ``group`` argument of a collective call, given its ``before`` positional parameters
    between the tensor(s) and the group (all_reduce: op; all_gather: none)."""
    return kwargs.get("group", args[before] if len(args) > before else None)


def _ended(event: dict, deadline: float | None) -> None:
    """The collective's end: when it completed, or when the emulated link let it."""
    now = time.perf_counter()
    event["link_s"] = max(0.0, (deadline or now) - now)
    event["end"] = now + event["link_s"]


@dataclass
class StepRecord:
    """What the instrumented hook saw during one step (filled from several threads)."""

    first_call: float | None = None  # perf_counter at the step's first hook call
    last_result: float | None = None  # ... and at its last bucket's result
    plain_bytes: int = 0  # what DDP's default allreduce would hand over: the buckets, as they are
    layouts: list = field(default_factory=list)
    bucket_errors: list = field(default_factory=list)
    layer_errors: list = field(default_factory=list)
    grads: dict = field(default_factory=dict)
    events: list | None = None  # the timeline, at a traced step

    def add(self, kind: str, start: float, end: float) -> None:
        """A compute phase of a traced step (backward, the optimizer step)."""
        if self.events is not None:
            self.events.append({"kind": kind, "start": start, "end": end})

    @property
    def hook_s(self) -> float:
        """The step's communication window: buckets overlap, so their own times are not summed."""
        if self.first_call is None or self.last_result is None:
            return 0.0
        return self.last_result - self.first_call


class HookInstrument:
    """Wraps a hook; the worker tells it, step by step, what to measure."""

    def __init__(self, hook: Callable, counter: CollectiveCounter, names_by_ptr: dict[int, str],
                 compressed: set[str], world_size: int):
        self.hook = hook
        self.counter = counter
        self.names_by_ptr = names_by_ptr
        self.compressed = compressed
        self.world_size = world_size
        # DDP logs a hook by its name, so an instrumented hook is named after the one it wraps.
        self.__name__ = self.__qualname__ = getattr(hook, "__name__", type(hook).__name__)
        self._lock = threading.Lock()
        self.begin_step(measure=False, save_grads=False, record_layout=False)

    def begin_step(self, measure: bool, save_grads: bool, record_layout: bool,
                   trace: bool = False) -> None:
        self.measure, self.save_grads, self.record_layout = measure, save_grads, record_layout
        self.record = StepRecord(events=[] if trace else None)
        self.counter.events = self.record.events

    def __call__(self, state, bucket):  # no annotations: DDP compares them to real types
        t0 = time.perf_counter()
        rec = self.record
        buf = bucket.buffer()
        names = [self.names_by_ptr.get(p.data_ptr(), f"param{i}")
                 for i, p in enumerate(bucket.parameters())]
        shapes = [tuple(g.shape) for g in bucket.gradients()]
        with self._lock:
            if rec.first_call is None:
                rec.first_call = t0
            rec.plain_bytes += buf.numel() * buf.element_size()
            if self.record_layout:
                rec.layouts.append(_layout(bucket, names, shapes, buf))
        exact = None
        index = bucket.index()
        with self.counter.in_bucket(index):
            if self.measure or self.save_grads:
                # Issued before the hook's own collectives, and behind those the communication
                # thread has yet to issue: the same order on every rank, which Gloo needs (it
                # pairs collectives across ranks by the order they come in).
                exact = comm_thread.in_order(self._exact_mean(buf.detach().clone()), index)
            fut = self.hook(state, bucket)
        if rec.events is not None:
            rec.events.append({"kind": "hook", "bucket": index, "start": t0, "end": time.perf_counter()})

        def finish(f):
            result = f.value()
            out = result[0] if isinstance(result, (list, tuple)) else result
            if exact is not None:
                self._compare(rec, index, names, shapes, out, exact.wait())
            now = time.perf_counter()
            if rec.events is not None:
                rec.events.append({"kind": "future", "bucket": index, "start": t0, "end": now})
            with self._lock:
                rec.last_result = max(rec.last_result or 0.0, now)
            return out

        return fut.then(finish)

    def _exact_mean(self, tensor):
        def job():
            with self.counter.category(MEASURE):  # the category is the issuing thread's
                dist.all_reduce(tensor)
            return tensor.div_(self.world_size)
        return job

    def _compare(self, rec, index, names, shapes, out, exact) -> None:
        out = out.detach().float()
        offset, layer_rows, grads = 0, [], {}
        for name, shape in zip(names, shapes):
            n = math.prod(shape) if shape else 1
            e = exact[offset:offset + n]
            if self.measure and name in self.compressed:
                layer_rows.append({"bucket": index, "layer": name,
                                   "rel_error": relative_error(out[offset:offset + n], e)})
            if self.save_grads:
                grads[name] = e.reshape(shape).clone()
            offset += n
        with self._lock:
            if self.measure:
                rec.bucket_errors.append({"bucket": index, "rel_error": relative_error(out[:offset], exact[:offset])})
                rec.layer_errors.extend(layer_rows)
            rec.grads.update(grads)


def _layout(bucket, names, shapes, buf) -> dict:
    return {
        "index": bucket.index(),
        "is_last": bucket.is_last(),
        "numel": buf.numel(),
        "bytes": buf.numel() * buf.element_size(),
        "params": [{"name": n, "shape": list(s), "numel": math.prod(s) if s else 1}
                   for n, s in zip(names, shapes)],
    }


def error_feedback_norm(state) -> float | None:
    """Norm of PowerSGD's error-feedback memory over all buckets (None for stateless hooks)."""
    errors = getattr(state, "error_dict", None)
    if not errors:
        return None
    return math.sqrt(sum(float(t.float().norm()) ** 2 for t in errors.values()))
