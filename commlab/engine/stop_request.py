"""A Stop asked in the run folder (``stop.json``), read by every supervisor of the run: on several
nodes a PID means nothing on another machine, and a pool's supervisor goes on to its next run, so
neither is signalled for a Stop."""
from __future__ import annotations

import time
from pathlib import Path

from commlab.engine import procs, store

STOP = "stop.json"
STOP_GRACE_S = 30.0  # for every supervisor of the run to see a Stop and end its agent


def request_stop(run_dir: Path, why: str = "stopped by the user") -> None:
    store.write_json(Path(run_dir) / STOP, {"error": why, "host": procs.HOST, "at": time.time()})


def stop_request(run_dir: Path) -> dict | None:
    return store.read_json(Path(run_dir) / STOP)
