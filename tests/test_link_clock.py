"""The emulated link's clock (fast tier): a collective's completion is held until the link would
have carried it, on the clock's own thread, in deadline order; a failed collective fails at once.
(The link in real Gloo runs: tests/test_overlap.py and tests/test_sweep_whatif.py.)"""
import threading
import time

import pytest
import torch

from commlab.hooks import link


class _Work:
    """What ``EmulatedWork`` reads of a collective's Work: its future."""

    def __init__(self, fut: torch.futures.Future):
        self._fut = fut

    def get_future(self) -> torch.futures.Future:
        return self._fut


def test_callbacks_run_at_their_deadlines_in_deadline_order_off_the_caller():
    ran: list[tuple[str, float, str]] = []
    done = threading.Event()
    now = time.perf_counter()
    deadlines = {"c": now + 0.06, "a": now + 0.02, "b": now + 0.04}
    for name, at in deadlines.items():
        link.CLOCK.at(at, lambda name=name: (
            ran.append((name, time.perf_counter(), threading.current_thread().name)),
            len(ran) == 3 and done.set()))
    assert done.wait(5)
    assert [r[0] for r in ran] == ["a", "b", "c"]
    assert all(t >= deadlines[name] for name, t, _ in ran)
    assert {thread for *_, thread in ran} == {"commlab-link"}


def test_a_deadline_already_past_runs_in_place():
    ran = []
    link.CLOCK.at(time.perf_counter() - 1.0, lambda: ran.append(threading.current_thread()))
    assert ran == [threading.current_thread()]


def test_a_completed_collective_is_held_until_its_deadline_with_its_value():
    inner = torch.futures.Future()
    deadline = time.perf_counter() + 0.05
    held = link.EmulatedWork(_Work(inner), deadline, cuda=False).get_future()
    then = held.then(lambda f: (time.perf_counter(), f.value()))
    inner.set_result([torch.tensor([3.0])])
    assert not held.done()  # the real collective is done; the link is not
    t, value = then.wait()
    assert t >= deadline and torch.equal(value[0], torch.tensor([3.0]))


def test_a_failed_collective_fails_its_held_future_at_once():
    inner = torch.futures.Future()
    held = link.EmulatedWork(_Work(inner), time.perf_counter() + 60.0, cuda=False).get_future()
    inner.set_exception(RuntimeError("peer gone"))
    assert held.done()
    with pytest.raises(RuntimeError, match="peer gone"):
        held.wait()


def test_a_callback_that_raises_does_not_stop_the_clock():
    done = threading.Event()

    def fails():
        raise RuntimeError("a broken callback")

    now = time.perf_counter()
    link.CLOCK.at(now + 0.01, fails)
    link.CLOCK.at(now + 0.02, done.set)
    assert done.wait(5)
