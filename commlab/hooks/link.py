"""The emulated link: a collective the hook issues completes no earlier than a ring allreduce of
its bytes over a link of the set bandwidth and latency would (``Link.seconds``) after it started.
Collectives share the one link, so one issued while another is on it waits for the link to be free,
as on a real network card (``commlab.hooks.instrument.CollectiveCounter`` keeps that queue); here
is the link's price and how a completion is held back (``EmulatedWork``, ``LinkClock``).
"""
from __future__ import annotations

import heapq
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

from commlab.analysis import ring
from commlab.hooks import futures


def sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


class LinkClock:
    """Runs callbacks at their deadlines, on a thread of its own: the emulated link holds a
    collective's completion back there, not on the Gloo thread that completed it (Gloo has two,
    and a thread asleep for the link could not carry the next collective meanwhile)."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._wake = threading.Condition()
        self._count = 0
        self._thread: threading.Thread | None = None

    def at(self, deadline: float, callback: Callable[[], None]) -> None:
        if deadline <= time.perf_counter():
            callback()
            return
        with self._wake:
            if self._thread is None or not self._thread.is_alive():  # a forked child has none
                self._thread = threading.Thread(target=self._serve, name="commlab-link", daemon=True)
                self._thread.start()
            self._count += 1
            heapq.heappush(self._due, (deadline, self._count, callback))
            self._wake.notify()

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.perf_counter():
                    self._wake.wait(self._due[0][0] - time.perf_counter() if self._due else None)
                _, _, callback = heapq.heappop(self._due)
            try:
                callback()
            except Exception:  # the thread serves every later deadline too: say it, go on
                traceback.print_exc()


CLOCK = LinkClock()


class EmulatedWork:
    """A collective's Work whose completion is held back until the emulated link would finish."""

    def __init__(self, work, deadline: float, cuda: bool):
        self._work, self._deadline, self._cuda = work, deadline, cuda

    def wait(self, *args, **kwargs):
        out = self._work.wait(*args, **kwargs)
        sleep_until(self._deadline)
        return out

    def get_future(self):
        deadline = self._deadline
        if self._cuda:  # a CUDA future's child keeps its stream semantics: hold it in place
            def held(fut):
                sleep_until(deadline)
                return fut.value()

            return futures.then(self._work.get_future(), held)
        out: torch.futures.Future = torch.futures.Future()

        def release(fut):
            try:
                value = fut.value()
            except Exception as e:  # the collective failed: no link to wait for
                out.set_exception(e)
                return
            CLOCK.at(deadline, lambda: out.set_result(value))

        futures.on_done(self._work.get_future(), release)
        return out

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
