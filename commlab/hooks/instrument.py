"""Instrumentation around any communication hook, stock or commlab's.

Bytes are counted where they are handed over: ``torch.distributed.all_reduce`` and ``all_gather``
are wrapped for the life of a run (an allgather counted as the allreduce payload that puts as many
bytes on the wire, ``CollectiveCounter.payload_of``), so PyTorch's hooks and commlab's are measured by the same ruler (both call it
through the module attribute).  The wrapper also records DDP's bucket layouts, the time from a
first hook call of a step to its last future's completion, and every K steps the approximation
error against the exact mean gradient, from one extra allreduce whose bytes are counted apart.  An
emulated link, when set, makes each collective the hook issues complete no earlier than a ring
allreduce of its bytes over that link would (``commlab.hooks.link``) after it started; collectives
share the one link, so a collective issued while another is on it waits for the link to be free, as
on a real network card (``CollectiveCounter`` keeps that queue).  At the steps it is told to trace, it records the step's timeline (see
``commlab.analysis.timeline``): each hook call, each collective's issue and completion, each hook
future's completion, and what the worker adds (backward, the optimizer step); on CUDA each of
them is timed on the device too (``DeviceClock``).
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from commlab.analysis import ring, timeline
from commlab.analysis.ledger import HOOK, MEASURE, OTHER, SHARDING, Ledger
from commlab.analysis.metrics import relative_error
from commlab.hooks import comm_thread, futures
from commlab.hooks.link import EmulatedWork, Link, sleep_until


class CollectiveCounter:
    """Counts the bytes handed to ``dist.all_reduce``, by category, while installed; files every
    call in the run's ``ledger`` (``commlab.analysis.ledger``), timed from its issue to its work's
    completion."""

    def __init__(self, link: Link | None = None, world_size: int = 1):
        self.link = link or Link()
        self.world_size = world_size
        self.ledger = Ledger()  # the whole run's, never reset
        self._lock = threading.Lock()
        self._local = threading.local()
        self._original = None
        self._link_free = 0.0  # when the emulated link has carried everything handed to it so far
        self.events: list | None = None  # the traced step's timeline, while one is traced
        self.clock: DeviceClock | None = None  # ... and its device clock, on CUDA
        # On a sharded run, which FSDP unit issued the collective being called (its name; None
        # outside one): ``commlab.engine.sharding.issuing_unit``, read at traced steps only.
        self.unit_of: Callable[[], str | None] | None = None
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.bytes = {HOOK: 0, MEASURE: 0, OTHER: 0, SHARDING: 0}
            self.calls = {HOOK: 0, MEASURE: 0, OTHER: 0, SHARDING: 0}
            self.link_s = 0.0  # what the emulated link charged the hook's collectives (Link.seconds)
            self._spans: list[list] = []  # [issued, done on the real link] of those in a bucket

    def ledger_rows(self) -> list[dict]:
        """The ledger so far (``Ledger.rows``)."""
        with self._lock:
            return self.ledger.rows()

    def take(self) -> tuple[dict, dict, dict]:
        """This step's bytes and calls by category, and the hook's timing: ``link_s``, what the
        emulated link charged, and ``collective_s``, how long the bucket collectives took on the
        real link (their union: waiting for the other ranks too), what the hook did not compute."""
        with self._lock:
            spans = [(a, b) for a, b in self._spans if b is not None]
            out = dict(self.bytes), dict(self.calls), {
                "link_s": self.link_s, "collective_s": timeline.covered_s(spans)}
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

    def _in_bucket(self) -> bool:
        """Whether this thread issues for a bucket (the hook's body or its communication thread's
        job), not outside the hook (post-local SGD's averaging, after the optimizer step)."""
        return getattr(self._local, "bucket", None) is not None or comm_thread.job_tag() is not None

    def _traced(self, cat: str, kind: str, nbytes: int, entry) -> dict | None:
        events = self.events
        if events is None:
            return None
        bucket = getattr(self._local, "bucket", None)
        event = {"kind": "collective", "bucket": comm_thread.job_tag() if bucket is None else bucket,
                 "collective": kind, "category": cat, "bytes": nbytes, "size_bytes": entry.size_bytes,
                 "ranks": entry.ranks, "thread": threading.current_thread().name,
                 "start": time.perf_counter(), "end": None, "link_s": 0.0}
        if self.unit_of and (unit := self.unit_of()) is not None:
            event["unit"] = unit
        events.append(event)
        return event

    def install(self) -> CollectiveCounter:
        self._original = dist.all_reduce
        self._original_gather = dist.all_gather
        # FSDP2's, called through the module attribute as the hooks' are (torch 2.13)
        self._original_single = dist.all_gather_single, dist.reduce_scatter_single
        original, counted = self._original, self._counted

        def all_reduce(tensor, *args, **kwargs):
            return counted(original, "all_reduce", tensor, _group_arg(args, kwargs, 1),
                           tensor, *args, **kwargs)

        def all_gather(tensor_list, tensor, *args, **kwargs):
            return counted(self._original_gather, "all_gather", tensor, _group_arg(args, kwargs, 0),
                           tensor_list, tensor, *args, **kwargs)

        def all_gather_single(output_tensor, input_tensor, group=None, async_op=False):
            return counted(self._original_single[0], "all_gather", input_tensor, group, output_tensor,
                           input_tensor, group=group, async_op=async_op, traffic=SHARDING)

        def reduce_scatter_single(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
            return counted(self._original_single[1], "reduce_scatter", input, group, output, input,
                           op=op, group=group, async_op=async_op, traffic=SHARDING)

        dist.all_reduce, dist.all_gather = all_reduce, all_gather
        dist.all_gather_single, dist.reduce_scatter_single = all_gather_single, reduce_scatter_single
        return self

    def _counted(self, call, kind, tensor, group, /, *args, traffic=None, **kwargs):
        """``call`` (the original collective), counted in the ledger and held for the emulated link;
        ``traffic``: its category when not issued where the lab's own are (FSDP's)."""
        issued_at = time.perf_counter()  # the ledger's latency runs from here
        cat = getattr(self._local, "category", HOOK)
        if traffic and cat == HOOK:  # FSDP's own, unless issued where the lab's are (an evaluation)
            cat = traffic
        nbytes, entry, deadline, held, span = self._issue(cat, kind, tensor, group)
        event = self._traced(cat, kind, nbytes, entry)
        clock = self.clock if event is not None else None
        # On the issuing stream: the collective's input is ready when the device gets here.
        issued = clock.mark() if clock else None

        def ended():
            _ended(event, deadline)
            if clock:
                clock.span(event, issued)

        work = call(*args, **kwargs)

        def real_end(_=None):  # done on the real link (the emulated hold comes after)
            now = time.perf_counter()
            if span:
                span[1] = now
            end = max(now, deadline or now)
            with self._lock:
                self.ledger.completed(entry, end - issued_at, held, end - now)

        if work is None:  # a blocking call: the caller waits for the link too
            real_end()
            if event is not None:
                ended()  # NCCL made the current stream wait for the collective
            if deadline is not None:
                sleep_until(deadline)
            return None
        futures.on_done(work.get_future(), real_end)
        if event is not None:
            # A CUDA future runs its callbacks on streams that wait for its kernels.
            futures.on_done(work.get_future(), lambda _: ended())
        return work if deadline is None else EmulatedWork(work, deadline, tensor.is_cuda)

    def _issue(self, cat: str, kind: str, tensor, group) -> tuple:
        """One call issued: its bytes counted (``payload_of``) and filed in the ledger; for the
        hook's and FSDP's, the emulated link booked (it carries one collective at a time: this one starts
        when the link is free) and, in a bucket, its span on the real link opened.  Returns the
        bytes, the ledger's entry, the link's deadline and hold (None and 0 without a link) and
        the span (None outside a bucket)."""
        nbytes, deadline, held = self.payload_of(kind, tensor, group), None, 0.0
        with self._lock:
            self.bytes[cat] += nbytes
            self.calls[cat] += 1
            entry = self.ledger.issued(cat, kind, self._group_size(group),
                                       tensor.numel() * tensor.element_size(), nbytes)
            if cat in (HOOK, SHARDING) and self.link.on:  # what the algorithm puts on the wire
                start = max(time.perf_counter(), self._link_free)
                held = self.link.seconds(nbytes, self.world_size, self.hops(kind, group))
                deadline = self._link_free = start + held
                self.link_s += held
            span = [time.perf_counter(), None] if cat == HOOK and self._in_bucket() else None
            if span:
                self._spans.append(span)
        return nbytes, entry, deadline, held, span

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
            dist.all_gather_single, dist.reduce_scatter_single = self._original_single
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


class DeviceClock:
    """A traced step's times on the GPU.  CUDA kernels run after the host queues them, so on
    NCCL the host's perf_counter says when work was queued, not when it ran: each event gets a
    pair of CUDA events (``mark``, ``span``) on the stream its work is on, and ``resolve`` turns
    them into the host's clock.  ``reference`` was recorded on an idle device, right after a
    synchronize, at the perf_counter time ``anchor``: a mark's time is ``anchor`` plus its
    ``reference.elapsed_time`` (milliseconds), early by the launch of the reference (microseconds).
    """

    def __init__(self, reference: Any, anchor: float, record: Callable[[], Any]):
        self.reference, self.anchor, self._record = reference, anchor, record
        self._spans: list[tuple[dict, Any, Any]] = []  # (event, start mark, end mark)

    @classmethod
    def on_cuda(cls, device: torch.device) -> DeviceClock:
        """A clock for the step starting now: the device synchronized, its reference recorded."""
        torch.cuda.synchronize(device)

        def record():
            # The device named: a thread of commlab's own (the communication thread) has not set it.
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(device))
            return event

        reference = record()
        return cls(reference, time.perf_counter(), record)

    def mark(self) -> Any:
        """A CUDA event on this thread's current stream: the device reaches it once the work
        queued there before it is done."""
        return self._record()

    def span(self, event: dict, start_mark: Any) -> None:
        """``event`` ran on the device from ``start_mark`` until now (a mark made here)."""
        self._spans.append((event, start_mark, self.mark()))

    def resolve(self) -> None:
        """Every spanned event's ``start`` and ``end`` become its device times (``clock: "cuda"``),
        its host times kept as ``host_start`` and ``host_end``.  An emulated link held a collective
        until its host deadline, the host ``end`` then: its device ``end`` is the later of the two
        and ``link_s`` what the deadline added past the device's completion."""
        def at(mark) -> float:
            mark.synchronize()  # elapsed_time needs both events to have run
            return self.anchor + self.reference.elapsed_time(mark) / 1e3

        for event, start_mark, end_mark in list(self._spans):
            start, end = at(start_mark), at(end_mark)
            host_start, host_end = event["start"], event["end"]
            if event.get("link_s", 0) > 0:
                event["link_s"] = max(0.0, host_end - end)
                end = max(end, host_end)
            event.update(start=start, end=end, clock="cuda", host_start=host_start, host_end=host_end)
        self._spans.clear()


@dataclass
class StepRecord:
    """What the instrumentation saw during one step (filled from several threads): DDP's hook,
    or on a sharded run the timeline alone."""

    first_call: float | None = None  # perf_counter at the step's first hook call
    last_result: float | None = None  # ... and at its last bucket's result
    plain_bytes: int = 0  # what DDP's default allreduce would hand over: the buckets, as they are
    layouts: list = field(default_factory=list)
    bucket_errors: list = field(default_factory=list)
    layer_errors: list = field(default_factory=list)
    grads: dict = field(default_factory=dict)
    events: list | None = None  # the timeline, at a traced step
    clock: DeviceClock | None = None  # its device times, at a traced step on CUDA

    @classmethod
    def begun(cls, counter: CollectiveCounter, trace: bool, cuda_device=None) -> StepRecord:
        """A step's record, its timeline kept when ``trace`` (on ``cuda_device``'s clock too), and
        the counter filing the step's collectives in it."""
        rec = cls(events=[] if trace else None,
                  clock=DeviceClock.on_cuda(cuda_device) if trace and cuda_device is not None else None)
        counter.events, counter.clock = rec.events, rec.clock
        return rec

    def mark(self) -> Any:
        """Now on the device, on a traced CUDA step (``DeviceClock.mark``); None elsewhere."""
        return self.clock.mark() if self.clock else None

    @contextlib.contextmanager
    def phase(self, kind: str, **fields):
        """A span of the compute thread (forward, backward, the optimizer step; on a sharded run
        each call of the lab's hook between replicas), in a traced step's timeline with ``fields``."""
        start, start_mark = time.perf_counter(), self.mark()
        yield
        self.add({"kind": kind, **fields, "start": start, "end": time.perf_counter()}, start_mark)

    def add(self, event: dict, start_mark: Any = None) -> None:
        """An event of a traced step, ending now; on CUDA on the device from ``start_mark``."""
        if self.events is not None:
            self.events.append(event)
            if self.clock:
                self.clock.span(event, start_mark)

    def timeline(self) -> list[dict]:
        """The traced step's events, once every one has run; on CUDA with their device times."""
        if self.clock:
            self.clock.resolve()
        return self.events

    @property
    def hook_s(self) -> float:
        """The step's communication window: buckets overlap, so their own times are not summed."""
        if self.first_call is None or self.last_result is None:
            return 0.0
        return self.last_result - self.first_call


class HookInstrument:
    """Wraps a hook; the worker tells it, step by step, what to measure."""

    def __init__(self, hook: Callable, counter: CollectiveCounter, names_by_ptr: dict[int, str],
                 compressed: set[str], world_size: int, cuda_device=None):
        self.hook = hook
        self.cuda_device = cuda_device  # the GPU traced steps are timed on too (DeviceClock)
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
        self.record = StepRecord.begun(self.counter, trace, self.cuda_device)

    def phase(self, kind: str):
        return self.record.phase(kind)

    def __call__(self, state, bucket):  # no annotations: DDP compares them to real types
        t0 = time.perf_counter()
        rec = self.record
        called = rec.mark()  # on the stream that computed the gradients: when they are ready
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
                # Issued before the hook's own collectives, on the communication thread when it
                # has some yet to issue (``in_order``): the same order on every rank, which Gloo
                # needs (it pairs collectives across ranks by the order they come in).
                exact = comm_thread.in_order(self._exact_mean(buf.detach().clone()), index)
            fut = self.hook(state, bucket)
        rec.add({"kind": "hook", "bucket": index, "start": t0, "end": time.perf_counter()}, called)

        def finish(f):
            result = f.value()
            out = result[0] if isinstance(result, (list, tuple)) else result
            if exact is not None:
                self._compare(rec, index, names, shapes, out, exact.wait())
            now = time.perf_counter()
            rec.add({"kind": "future", "bucket": index, "start": t0, "end": now}, called)
            with self._lock:
                rec.last_result = max(rec.last_result or 0.0, now)
            return out

        return futures.then(fut, finish)

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
