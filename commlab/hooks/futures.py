"""Python callbacks on torch futures (``then``, ``on_done``) that the interpreter's exit waits for.

A collective's future runs its callbacks on the backend's thread (Gloo's worker), and that thread
drops each callback only after all of them ran, taking the GIL to do so (torch's
``PythonFunctionGuard``).  The hook's future is complete by then, so the main thread may already
be past its last step and finalizing the interpreter; a thread that takes the GIL during
finalization is ended with ``pthread_exit``, which unwinds through that C++ destructor and aborts
the process: "terminate called without an active exception", SIGABRT, after a run that trained
to its end (measured: 2 of 25 runs of an exported PowerSGD script at load 4 before this module,
0 of 50 after).

So every Python callback commlab hands a torch future goes through here: it runs its function
once and drops it at once, leaving the backend's thread a small object to release, and the exit
(``atexit``) waits until every callback that ran has been released.  A callback whose future never
completed is not waited for: nothing will run it.
"""
from __future__ import annotations

import atexit
import time
from collections.abc import Callable
from typing import Any

import torch

EXIT_WAIT_S = 5.0  # a backend thread that never lets go is left to the interpreter's exit

_ran: set[int] = set()  # ids of callbacks that ran and that their future's thread holds yet


class _Once:
    """``fn`` for one call; its id is in ``_ran`` from that call until this object is freed."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[torch.futures.Future], Any]):
        self.fn = fn

    def __call__(self, fut: torch.futures.Future) -> Any:
        _ran.add(id(self))
        fn, self.fn = self.fn, None
        return fn(fut)  # fn and what it holds are freed here, on return, with the GIL held

    def __del__(self) -> None:
        _ran.discard(id(self))


def then(fut: torch.futures.Future, fn: Callable[[torch.futures.Future], Any]) -> torch.futures.Future:
    """``fut.then(fn)``, waited for at exit."""
    return fut.then(_Once(fn))


def on_done(fut: torch.futures.Future, fn: Callable[[torch.futures.Future], Any]) -> None:
    """``fut.add_done_callback(fn)``, waited for at exit."""
    fut.add_done_callback(_Once(fn))


def wait_released(timeout_s: float = EXIT_WAIT_S) -> bool:
    """Block until no callback that ran is still held by its future's thread; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while _ran:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)  # releases the GIL the holding thread needs
    return True


atexit.register(wait_released)
