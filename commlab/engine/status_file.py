"""The one writer of status.json: every process that records a run's state asks ``record``.

The file is replaced atomically (``store.write_json``: with the disk full, an end still goes into the
folder's reserve).  What it said is kept and the new fields merged over it, so that a Slurm reason or
a traceback written by one process is not dropped by the next; a move the state machine forbids
(``commlab.engine.run_state.allowed``: above all, rank 0's own end replaced) leaves the file as it is.
"""
from __future__ import annotations

import os
from pathlib import Path

from commlab.engine import store
from commlab.engine.run_state import RunStatus, allowed

NAME = "status.json"


def said(folder: str | os.PathLike) -> dict:
    """What the run folder's status.json says ({} when absent or damaged)."""
    return store.read_json(Path(folder) / NAME, {})


def record(folder: str | os.PathLike, status: RunStatus | None = None, **fields) -> bool:
    """Make ``folder``'s status.json say ``status`` (None: the status it has) with ``fields``
    merged over what it held; whether it was written (not when the move is not ``allowed``)."""
    before = said(folder)
    now = before.get("status")
    then = now if status is None else status
    if then is None or not allowed(now, then):
        return False
    store.write_json(Path(folder) / NAME, {**before, "status": then, **fields})
    return True
