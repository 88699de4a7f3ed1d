"""A run's states and the moves between them, stated once.

Modelled on torch's elastic ``WorkerState`` (``torch.distributed.elastic.agent.server.api``: a
``str`` enum, ``is_running``): a ``str`` (``StrEnum``: shown as the word itself) so that status.json
holds the same words as ever and a word read from it compares equal to its member.  ``commlab.engine.status_file`` is the one writer,
and asks ``allowed`` before every write.

    pending ─► starting ─► running ─► finished | diverged      (rank 0's own end: final for good)
       ▲          │           │   └─► failed | stopped | stalled  (the supervisor's, a Stop's, Slurm's)
       └──────────┘           └ ─ ─ ► orphaned, lost, damaged    (read from the folder, never written)

A recorded end may be replaced by a later end (Slurm's word on a job, a Stop that came after a
crash), except the end the run recorded itself: a Stop after the last step does not make a
finished run a stopped one.
"""
from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    PENDING = "pending"  # a Slurm job waiting in the queue
    STARTING = "starting"  # the folder exists, its supervisor is not up yet
    RUNNING = "running"
    ORPHANED = "orphaned"  # the supervisor is gone, some of the run's processes still run: Stop ends them
    FINISHED = "finished"
    FAILED = "failed"
    DIVERGED = "diverged"  # the loss stopped being finite (rank 0 ended the run there)
    STOPPED = "stopped"
    STALLED = "stalled"  # no step for stall_timeout_s
    LOST = "lost"  # every process gone with no end recorded: nothing can ever record one
    DAMAGED = "damaged"  # a file every listing reads is not what commlab writes


FINAL = (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.DIVERGED, RunStatus.STOPPED, RunStatus.STALLED)
GOING = (RunStatus.PENDING, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.ORPHANED)
STOPPABLE = (*GOING, RunStatus.LOST)  # a lost run's torchrun or workers may still live: Stop ends them
OWN_END = (RunStatus.FINISHED, RunStatus.DIVERGED)  # recorded by rank 0: never replaced
# What status.json may say next, given what it says: the rows above as a table.  The states only
# ever read (orphaned, lost, damaged) are never written, so they have no row.
WRITTEN_AFTER: dict[RunStatus | None, tuple[RunStatus, ...]] = {
    None: (RunStatus.PENDING, RunStatus.STARTING, *FINAL),  # a fresh folder (a node's records)
    RunStatus.PENDING: (RunStatus.STARTING, RunStatus.RUNNING, *FINAL),
    RunStatus.STARTING: (RunStatus.PENDING, RunStatus.RUNNING, *FINAL),
    RunStatus.RUNNING: FINAL,
    RunStatus.FAILED: FINAL, RunStatus.STOPPED: FINAL, RunStatus.STALLED: FINAL,
    RunStatus.FINISHED: (), RunStatus.DIVERGED: (),
}


def allowed(now: str | None, then: str) -> bool:
    """Whether status.json saying ``now`` (None: no status yet) may come to say ``then``.  Saying
    the same again is always allowed (a Slurm reason, the time an end was recorded, added)."""
    if now == then:
        return True
    try:
        return RunStatus(then) in WRITTEN_AFTER.get(None if now is None else RunStatus(now), ())
    except ValueError:  # a word commlab never writes
        return False
