"""One communication thread per process, so that a hook that must wait for its own collectives
does not hold up backward.

Gloo pairs collectives across ranks by the order each rank issues them, and a collective must not
be issued from a future callback (Gloo runs those on its own two threads).  commlab's PowerSGD
waits in its body for its uncompressed and P allreduces before it can issue the Q allreduce; run
in the hook itself, that wait stops backward.  Here the hook hands its body to one thread per
process and returns a future at once: the thread takes the bodies in the order DDP called the
hooks (bucket order, the same on every rank), so every rank issues the same collectives in the
same order, and it completes the hook's future with what the body's last future yields.

A body may end its first part by returning ``Deferred(rest)``: the thread then runs the next
body's first part before ``rest`` (at once for a body submitted as ``last``, the step's last
bucket: no body follows),
so that the next bucket's first collectives are in flight while this one waits for its own.  The
order stays the program's, ``first(i), first(i+1), rest(i), first(i+2), rest(i+1), …``, the same
on every rank, since DDP hands every rank the same buckets in the same order.

A body that fails fails its hook's future (DDP raises it in backward); every body queued after
it is failed unrun, because the ranks' collective order is lost by then.  ``close()`` ends the
thread.  The blocking variants (``powersgd.blocking_powerSGD_hook``, the lab's ``overlap`` off)
run their bodies in place instead, kept for comparison; ``run_in_place`` runs a deferred rest at
once.
"""
from __future__ import annotations

import atexit
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from commlab.hooks import futures  # imported first: its exit wait runs after close()

JOIN_TIMEOUT_S = 5.0  # a thread stuck in a collective whose peer is gone is left to die with us

Job = Callable[[], Any]  # returns a value, a Future whose value completes the hook's future, or Deferred


class Deferred:
    """What a job returns after issuing its first collectives: ``rest``, which returns a value or
    a Future (not another Deferred), finishes it once the next job has issued its own, or at once
    for a job submitted as the last."""

    def __init__(self, rest: Job):
        self.rest = rest


def run_in_place(job: Job) -> Any:
    """``job`` run whole, here: the blocking variant's way."""
    result = job()
    return result.rest() if isinstance(result, Deferred) else result


def _complete(outer: torch.futures.Future, inner: torch.futures.Future) -> None:
    try:
        outer.set_result(inner.value())
    except Exception as e:  # a failed collective: the hook's future carries the error
        outer.set_exception(e)


class CommThread:
    """A FIFO of hook bodies, run in turn on a thread of their own (a deferred rest after the
    next body's first part)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._issued = threading.Condition(self._lock)  # notified as each job ends issuing
        self._unissued = 0  # bodies submitted whose collectives are not all issued yet
        self._failed: BaseException | None = None
        self.pid = os.getpid()
        self._thread = threading.Thread(target=self._serve, name="commlab-comm", daemon=True)
        self._thread.start()

    def submit(self, job: Job, tag: Any = None, last: bool = False) -> torch.futures.Future:
        """Queue ``job``; the returned future completes with its result.  ``tag`` (a bucket's
        index) is what ``job_tag()`` returns while the job runs; ``last``: no job follows it this
        step, so a rest it defers runs at once."""
        fut: torch.futures.Future = torch.futures.Future()
        with self._lock:
            self._unissued += 1
        self._queue.put((job, fut, tag, last))
        return fut

    def idle(self) -> bool:
        """True when every submitted body has issued all its collectives.  Only the thread that
        submits (DDP's, which calls the hooks) may rely on it staying true."""
        with self._lock:
            return self._unissued == 0

    def wait_idle(self) -> None:
        """Block until ``idle()`` (or the thread is gone)."""
        with self._issued:
            while self._unissued and self._thread.is_alive():
                self._issued.wait(0.1)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _serve(self) -> None:
        held = None  # (rest, future, tag) of the job before: run after this job's first part
        while (item := self._queue.get()) is not None:
            job, fut, tag, last = item
            deferred = self._run(job, fut, tag)
            if held is not None:
                self._run(*held, rest=True)
                held = None
            if deferred is not None:
                if last:
                    self._run(deferred.rest, fut, tag, rest=True)
                else:
                    held = (deferred.rest, fut, tag)
            # Nothing of a finished job stays referenced while the thread waits: its Future
            # holds Gloo's work, which must not outlive the process group it belongs to.
            item = job = fut = deferred = None
        if held is not None:  # closed with a rest still held: a step left unfinished
            self._run(*held, rest=True)

    def _run(self, job: Job, fut: torch.futures.Future, tag: Any, rest: bool = False) -> Deferred | None:
        """Run ``job`` (or, ``rest``, a job's rest) under ``tag``; complete ``fut`` with its
        outcome, unless a job (not a rest) returns a Deferred, which is returned."""
        _running.tag = tag
        result, error = None, None
        try:
            if self._failed is not None:
                raise RuntimeError("not issued: an earlier collective on this rank's "
                                   f"communication thread failed ({self._failed!r})")
            result = job()
            if rest and isinstance(result, Deferred):
                raise TypeError("a deferred rest returned another Deferred")
        except BaseException as e:
            # A Future carries only an Exception; the thread must outlive any of them.
            error = e if isinstance(e, Exception) else RuntimeError(f"the hook body raised {e!r}")
            self._failed = self._failed or error
        finally:
            _running.tag = None
        if error is None and isinstance(result, Deferred):
            return result
        # Counted as issued before its future completes: whoever that wakes sees it so.
        with self._issued:
            self._unissued -= 1
            self._issued.notify_all()
        if error is not None:
            fut.set_exception(error)
        elif isinstance(result, torch._C.Future):  # what Work.get_future() returns too
            futures.on_done(result, lambda inner, outer=fut: _complete(outer, inner))
        else:
            fut.set_result(result)
        return None

    def close(self) -> None:
        """Stop after the queued bodies; a body still queued past the join timeout dies with us."""
        self._queue.put(None)
        self._thread.join(JOIN_TIMEOUT_S)


_current: CommThread | None = None
_lock = threading.Lock()
_running = threading.local()  # on the thread: the tag of the job it runs


def job_tag() -> Any:
    """The tag of the job the calling thread runs for a hook (None off the thread, or untagged)."""
    return getattr(_running, "tag", None)


def current() -> CommThread:
    """This process's communication thread, started on first use."""
    global _current
    with _lock:
        # A forked child inherits the object but not the thread.
        if _current is None or _current.pid != os.getpid() or not _current.alive:
            _current = CommThread()
        return _current


def in_order(job: Job, tag: Any = None) -> torch.futures.Future:
    """Run ``job`` (which issues collectives) where it keeps this process's collective order: on
    the thread when it has collectives yet to issue (as the next job, so ahead of a deferred
    rest), else here and now; either way in the same place on every rank.  For collectives issued
    from a hook that may or may not use the thread (the instrument's exact mean)."""
    comm = _current if _current is not None and _current.pid == os.getpid() else None
    if comm is not None and comm.alive and not comm.idle():
        return comm.submit(job, tag)
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(job())
    return fut


def close() -> None:
    """End this process's communication thread, if it started one."""
    global _current
    with _lock:
        comm, _current = _current, None
    if comm is not None and comm.pid == os.getpid():
        comm.close()


atexit.register(close)
