"""The run folder: the launcher, the supervisor and rank 0 write it, the UI, the CLI and
notebooks read it.

Layout of ``<runs_dir>/<run_id>/``:
  config.json      the resolved RunConfig, written last by the launcher: a folder is a run once
                   it has one       launch.json  backend, hook plan, the command, the launching
                   process and (once spawned) the supervisor's PID and create time
  meta.json        torch version, hook implementation (written by rank 0 once DDP is up)
  status.json      starting | running | finished | failed | diverged | stopped | stalled, with
                   the error; read as "lost" when it says starting or running but the process
                   answerable for it is gone (see ``RunFolder.status_record``)
  metrics.jsonl    one line per step, appended and flushed by rank 0
  errors.jsonl     approximation error every K steps      buckets.json  DDP's bucket layouts
  layers.json      the rule's decision per parameter      grads/        saved mean gradients
  supervisor.json  the PIDs that own the run, written by the supervisor once it is up
  supervisor.log   the supervisor's output                launcher.log  torchrun's output
  rank<k>.error.json  a rank's traceback, written as it dies
Small JSON files are replaced atomically; JSON-lines readers keep a byte offset and only ever
consume complete lines, so a half-written last line never breaks them.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

FINAL = ("finished", "failed", "diverged", "stopped", "stalled")
GOING = ("starting", "running")  # starting: the folder exists, its supervisor is not up yet


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=_jsonable))
    os.replace(tmp, path)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def _jsonable(x: Any) -> Any:
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"cannot write {type(x).__name__} as JSON")


class JsonlWriter:
    """Appends one JSON object per line and flushes it, so readers see every finished step."""

    def __init__(self, path: Path):
        self._f = open(path, "a", buffering=1)

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record, default=_jsonable, allow_nan=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class JsonlTail:
    """Reads only the complete lines added since the last call."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0

    def read_new(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1  # a trailing partial line waits for the next call
        self.offset += end
        out = []
        for line in chunk[:end].splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


def read_jsonl(path: Path) -> list[dict]:
    return JsonlTail(path).read_new()


def new_run_dir(runs_dir: str | os.PathLike, label: str) -> Path:
    """A fresh folder; an existing one is never reused, so runs are never overwritten."""
    root = Path(runs_dir)
    root.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-")[:40] or "run"
    while True:
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{slug}-{secrets.token_hex(2)}"
        try:
            (root / run_id).mkdir()
            return root / run_id
        except FileExistsError:
            continue


class Folder:
    """A folder named by its id whose ``MARKER`` file says it is complete; cheap to construct,
    reads lazily."""

    MARKER = ""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @property
    def id(self) -> str:
        return self.path.name

    def file(self, name: str) -> Path:
        return self.path / name

    def exists(self) -> bool:
        return self.file(self.MARKER).exists()


class RunFolder(Folder):
    """Read access to one run folder."""

    MARKER = "config.json"

    def config_dict(self) -> dict:
        return read_json(self.file("config.json"), {})

    def config(self):
        from commlab.config import RunConfig

        return RunConfig.from_dict(self.config_dict(), str(self.file("config.json")))

    def launch_info(self) -> dict:
        return read_json(self.file("launch.json"), {})

    def meta(self) -> dict:
        return read_json(self.file("meta.json"), {})

    def status_record(self) -> dict:
        """status.json, checked against the process answerable for a run still going: the
        supervisor once it is up (it writes supervisor.json, then says running), before that the
        supervisor the launcher spawned, before that the launching process itself.  When that
        process is gone the run is lost: it can never record an end."""
        from commlab.engine.procs import alive

        rec = read_json(self.file("status.json"), {"status": "starting"})
        if rec.get("status") not in GOING:
            return rec
        up = self.file("supervisor.json").exists()
        if up:
            rec = {**rec, "status": "running"}
        owner = self.supervisor() or self.launch_info().get("launcher", {})
        if alive(owner.get("pid"), owner.get("create_time")):
            return rec
        why = ("the run's processes are gone and it never recorded an end (machine restarted or "
               "processes killed from outside)" if up else
               f"its supervisor never came up (see {self.file('supervisor.log')})")
        return {**rec, "status": "lost", "error": why}

    def status(self) -> str:
        return self.status_record()["status"]

    def supervisor(self) -> dict:
        """The supervisor's record: its own (supervisor.json) once it is up, before that the PID
        and create time the launcher recorded as it spawned it; {} before it is spawned."""
        return read_json(self.file("supervisor.json")) or self.launch_info().get("supervisor", {})

    def metrics_records(self) -> list[dict]:
        return read_jsonl(self.file("metrics.jsonl"))

    def metrics(self):
        import pandas as pd

        return pd.DataFrame(self.metrics_records())

    def error_records(self) -> list[dict]:
        return read_jsonl(self.file("errors.jsonl"))

    def errors(self):
        import pandas as pd

        return pd.DataFrame(self.error_records())

    def buckets(self) -> dict:
        return read_json(self.file("buckets.json"), {})

    def layers(self) -> list[dict]:
        return read_json(self.file("layers.json"), [])

    def grad_steps(self) -> list[int]:
        return sorted(int(p.stem.split("_")[1]) for p in self.path.glob("grads/step_*.pt"))

    def grads(self, step: int) -> dict:
        import torch

        return torch.load(self.file(f"grads/step_{step}.pt"), map_location="cpu", weights_only=True)

    def summary(self) -> dict:
        """One row for tables and ``commlab runs``: settings, status and headline figures
        (``commlab.analysis.metrics.headline``)."""
        from commlab.analysis import metrics

        cfg = self.config_dict()
        rows = self.metrics_records()
        status = self.status_record()
        last = rows[-1] if rows else {}
        return {
            "run_id": self.id,
            "run_dir": str(self.path),
            "status": status["status"],
            "hook": cfg.get("hook"),
            "wrapper": cfg.get("wrapper"),
            "hook_impl": self.meta().get("hook_impl") or self.launch_info().get("hook_impl"),
            "world_size": cfg.get("world_size"),
            "workload": cfg.get("workload"),
            "rank": cfg.get("matrix_approximation_rank"),
            "start_iter": cfg.get("start_powerSGD_iter"),
            "steps": len(rows),
            "steps_planned": cfg.get("steps"),
            **metrics.headline(rows, cfg),
            "compression_ratio": last.get("compression_ratio"),
            "error": status.get("error"),
        }


def list_runs(runs_dir: str | os.PathLike) -> list[RunFolder]:
    """Every run in the folder, newest first."""
    root = Path(runs_dir)
    if not root.is_dir():
        return []
    runs = [RunFolder(p) for p in root.iterdir() if (p / "config.json").exists()]
    return sorted(runs, key=lambda r: r.id, reverse=True)
