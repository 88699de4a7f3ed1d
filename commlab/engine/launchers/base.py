"""What every way of running a run answers: the one interface ``commlab.engine.launch`` asks.

A launcher is chosen when a run starts (``launch.start(cfg, launcher)``) and found again from the
run folder's launch.json by anyone who stops or supervises the run later (``owns``, ``of_record``):
each way records what it needs there, and nothing else tells the ways apart.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import ClassVar

from commlab.devices import ranks_forkable
from commlab.engine import procs, run_folder, store
from commlab.engine.commands import LOOPBACK, run_argv, supervisor_argv, worker_env
from commlab.engine.run_state import RunStatus


class Launcher:
    """A run on this machine under a detached supervisor of its own; the other ways override what
    differs.  ``owner``: what the starting process is (``"sweep <id>"``) when the run must not
    outlive it; ``resume``: the folder of a finished run this one continues from its checkpoint."""

    name: ClassVar[str]  # how a person and ``launchers.kinds`` call it
    place = LOOPBACK  # where the agent meets the others and the ranks talk (``commlab.engine.commands``)

    def __init__(self, owner: str | None = None, resume: str | os.PathLike | None = None):
        self.owner, self.resume = owner, resume

    # ------------------------------------------------------------------ found again from launch.json
    @classmethod
    def owns(cls, info: dict) -> bool:
        """Whether a run whose launch.json is ``info`` was started this way."""
        raise NotImplementedError

    @classmethod
    def of_record(cls, info: dict) -> Launcher:
        """This way, as launch.json recorded it (to stop or supervise the run)."""
        return cls()

    # ------------------------------------------------------------------ prepare the run folder's records
    def errors(self, cfg) -> dict[str, str]:
        """What this way refuses of the run (a field name each): nothing here."""
        return {}

    def make_folder(self, cfg) -> Path:
        """The folder this process writes the run's records in: a new run folder."""
        return store.new_run_dir(cfg.runs_dir, cfg.label())

    def records(self, cfg, records: Path) -> dict:
        """This way's entries of launch.json: the exact command the supervisor runs."""
        return {"command": run_argv(cfg.world_size, records.resolve(), sys.executable, self.place,
                                    fork=ranks_forkable())}

    # ------------------------------------------------------------------ start, stop, show
    def start(self, folder: run_folder.RunFolder, cfg) -> None:
        """Hand the prepared run to what runs it: here a detached supervisor, recorded at once."""
        me = str(folder.path.resolve())
        child = procs.spawn(supervisor_argv(me), log=folder.file("supervisor.log"),
                            env={**worker_env(cfg, place=self.place), procs.OWNER_ENV: me}, detached=True)
        store.write_json(folder.file("launch.json"), {**folder.launch_info(), "supervisor": procs.identity(child.pid)})

    def start_failure(self, e: BaseException) -> str:
        """The error a run that could not be started records."""
        return f"the supervisor could not be started: {e!r}"

    def ask_to_stop(self, folder: run_folder.RunFolder, grace_s: float) -> None:
        """What this way does on Stop before the run's processes are signalled: nothing here (its
        supervisor is signalled and ends its own tree)."""

    def signalled(self, folder: run_folder.RunFolder) -> tuple[dict, str] | None:
        """The supervisor a Stop signals, and the folder it works for; None: none to signal."""
        return folder.supervisor(), str(folder.path.resolve())

    def describe(self, cfg, info: dict) -> str:
        """Where its ranks run, for a person (``commlab run``'s first line)."""
        return f"{cfg.world_size} {info['backend']} rank(s)"

    # ------------------------------------------------------------------ what its supervisor asks
    def terminated(self, run_dir: Path) -> dict:
        """How the run ends when its supervisor is sent SIGTERM: here, a Stop."""
        return {"status": RunStatus.STOPPED, "error": "stopped by the user"}

    def ended_elsewhere(self, run_dir: Path) -> dict | None:
        """An ending another part of the run calls for (a node's bad end); None here."""
        return None

    def never_started(self, run_dir: Path) -> dict | None:
        """Why the run failed when its agent never started ranks, if this way knows; None here."""
        return None

    def join_deadline_s(self) -> float | None:
        """Seconds from its agent's start by which the run's ranks must have started (the nodes
        met), else it ends as ``never_started`` says; None: no such bound (the stall timeout's)."""
        return None
