"""Read access to one run folder (``RunFolder``) and the runs folder's listing: what the UI, the CLI
and notebooks read of a run.  The files themselves, their shapes and the readers that never raise
are ``commlab.engine.store``'s; the run's state is ``commlab.engine.run_state``'s.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from commlab import files
from commlab.engine.run_state import GOING, RunStatus
from commlab.engine.store import (
    ERRORS,
    EVAL,
    LEDGER,
    PITFALL,
    PITFALLS,
    PROFILER,
    TIMELINE,
    TRACE,
    Damaged,
    Folder,
    JsonlTail,
    _first_line_is_a_record,
    checker,
    load_json,
    read_json,
    read_jsonl,
    step_check,
    write_json,
)


class RunFolder(Folder):
    """Read access to one run folder."""

    MARKER = "config.json"

    def config_dict(self) -> dict:
        return read_json(self.file("config.json"), {})

    def config(self):
        from commlab.config import RunConfig

        return RunConfig.recorded(self.config_dict(), str(self.file("config.json")))

    def launch_info(self) -> dict:
        return read_json(self.file("launch.json"), {})

    def meta(self) -> dict:
        return read_json(self.file("meta.json"), {})

    def notes(self) -> dict:
        """What a person wrote about the run (notes.json): its ``name`` and ``note``, "" unset."""
        got = read_json(self.file("notes.json"), {}, NOTES)
        return {"name": got.get("name", ""), "note": got.get("note", "")}

    def set_notes(self, name: str, note: str) -> None:
        """Name the run and note something about it; the only file of a run a person writes."""
        if len(name) > MAX_NAME_CHARS:
            raise ValueError(f"a run name is at most {MAX_NAME_CHARS} characters, got {len(name):,}")
        write_json(self.file("notes.json"), {"name": name.strip(), "note": note})

    def status_record(self) -> dict:
        """status.json, checked against the process answerable for a run still going: the
        supervisor once it is up (it writes supervisor.json, then says running), before that the
        supervisor the launcher spawned, before that the launching process itself.  When that
        process is gone the run is orphaned while any other process of it still runs, lost once
        none does: it can never record an end."""
        from commlab.engine.procs import alive, elsewhere

        rec = read_json(self.file("status.json"), {"status": RunStatus.STARTING})
        if rec.get("status") not in GOING:
            return rec
        up = self.file("supervisor.json").exists()
        if up:
            rec = {**rec, "status": RunStatus.RUNNING}
        owner = self.supervisor() or self.launch_info().get("launcher", {})
        if elsewhere(owner):  # a compute node's process: what the folder says is all that is known here
            return rec
        if owner.get("create_time") is not None and alive(owner.get("pid"), owner["create_time"]):
            return rec
        if up and self.processes():
            return {**rec, "status": RunStatus.ORPHANED, "error": "its supervisor is gone but some of its "
                    "processes still run, unsupervised: Stop ends them"}
        why = ("the run's processes are gone and it never recorded an end (machine restarted or "
               "processes killed from outside)" if up else
               f"its supervisor never came up (see {self.file('supervisor.log')})")
        return {**rec, "status": RunStatus.LOST, "error": why}

    def status(self) -> str:
        return self.status_record()["status"]

    def supervisor(self) -> dict:
        """The supervisor's record: its own (supervisor.json) once it is up, before that the PID
        and create time the launcher recorded as it spawned it; {} before it is spawned."""
        return read_json(self.file("supervisor.json")) or self.launch_info().get("supervisor", {})

    def processes(self) -> list:
        """The run's processes still running (psutil), each proven to be this run's
        (``commlab.engine.procs.belonging``): the supervisor, torchrun and the workers it recorded."""
        from commlab.engine.procs import belonging

        sup = self.supervisor()
        created = sup.get("worker_create_times", {})
        return belonging([sup, {"pid": sup.get("torchrun_pid"), "create_time": sup.get("torchrun_create_time")},
                          *({"pid": pid, "create_time": created.get(str(pid))}
                            for pid in sup.get("worker_pids", []))], str(self.path.resolve()))

    def metrics_records(self, keep: tuple[str, ...] | None = None) -> list[dict]:
        """metrics.jsonl's step records (``step_check``), of each only ``keep`` when given."""
        return self.metrics_tail(keep).read_new()

    def metrics_tail(self, keep: tuple[str, ...] | None = None) -> JsonlTail:
        return JsonlTail(self.file("metrics.jsonl"), step_check(), keep)

    def metrics(self):
        import pandas as pd

        return pd.DataFrame(self.metrics_records())

    def evals(self) -> list[dict]:
        """evals.jsonl's held-out evaluations in step order ([] when none): step, loss, eval_s,
        and accuracy (classifiers) or bits_per_char (charlm)."""
        return self.evals_tail().read_new()

    def evals_tail(self) -> JsonlTail:
        return JsonlTail(self.file("evals.jsonl"), checker(EVAL))

    def pitfalls(self) -> list[dict]:
        """pitfalls.jsonl's PowerSGD pitfalls in the order caught ([] when none): step, layer,
        kind, detail and the setting that avoids it (fix)."""
        return read_jsonl(self.file(PITFALLS), checker(PITFALL))

    def resumed_from(self) -> str | None:
        """The folder of the run this one continues (``--resume``), or None."""
        return self.launch_info().get("resumed_from")

    def checkpoint_step(self) -> int | None:
        """The last step the run's checkpoint holds, or None when it has no complete one."""
        return read_json(self.file("checkpoint.json"), {}).get("step")

    def error_records(self) -> list[dict]:
        return read_jsonl(self.file("errors.jsonl"), checker(ERRORS))

    def errors(self):
        import pandas as pd

        return pd.DataFrame(self.error_records())

    def buckets(self) -> dict:
        return read_json(self.file("buckets.json"), {})

    def timeline(self) -> dict:
        """timeline.json: ``{"steps": {step: {rank: events}}, "overlap_share": ...}`` of the
        traced steps (``commlab.analysis.timeline``); empty when no step was traced."""
        return read_json(self.file(TIMELINE), {})

    def trace(self) -> bytes | None:
        """trace.json, the traced steps as a Chrome trace, as it lies (None when absent)."""
        try:
            with files.open_regular(self.file(TRACE)) as f:
                return f.read()
        except OSError:
            return None

    def ledger(self) -> dict:
        """ledger.json, rank 0's collectives by traffic, kind, ranks and size, with their figures
        (``commlab.analysis.ledger``, an older file's rows under today's names); {} when the run
        has none (instrument off, no step yet)."""
        from commlab.analysis.ledger import upgraded

        return upgraded(read_json(self.file(LEDGER), {}))

    def profiler_traces(self) -> list[Path]:
        """The torch.profiler Chrome traces in profiler/, by name ([] when none)."""
        try:
            return sorted(p for p in self.file(PROFILER).glob("*.json") if p.is_file())
        except OSError:
            return []

    def layers(self) -> list[dict]:
        return read_json(self.file("layers.json"), [])

    def listed_status_record(self) -> dict:
        """``status_record``, or status "damaged" with the damage as its error when a file every
        listing reads is damaged: the one place a run is called damaged."""
        damage = self.damage()
        return {"status": RunStatus.DAMAGED, "error": damage} if damage else self.status_record()

    def damage(self, *names: str) -> str | None:
        """``damaged: <file>: <what>`` for the first of ``names`` (by default the files every
        listing reads) that is damaged; None when none is."""
        for name in names or LISTED:
            path = self.file(name)
            try:
                if name.endswith(".jsonl"):
                    if path.is_dir():
                        raise Damaged(name, "a folder where a file belongs")
                    _first_line_is_a_record(path, name)
                else:
                    load_json(path)
            except FileNotFoundError:
                continue
            except (Damaged, OSError) as e:
                return f"damaged: {e}"
        return None

    def grad_steps(self) -> list[int]:
        """The steps whose mean gradient was saved (grads/step_<k>.pt; other names are left out)."""
        found = (re.fullmatch(r"step_(\d+)\.pt", p.name) for p in self.path.glob("grads/step_*.pt"))
        return sorted(int(m[1]) for m in found if m)

    def grads(self, step: int) -> dict:
        """The saved gradients of ``step``, name -> tensor; ``Damaged`` when the file is not that."""
        import torch

        name = f"grads/step_{step}.pt"
        try:
            with files.open_regular(self.file(name)) as f:
                grads = torch.load(f, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise
        except Exception as e:  # torch.load raises many kinds on a file that is not its own
            raise Damaged(name, f"not saved gradients ({type(e).__name__}: {str(e)[:80]})") from None
        if not (isinstance(grads, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in grads.items())):
            raise Damaged(name, "not a mapping of layer names to tensors")
        return grads

    def summary(self, records: list[dict] | None = None, skipped: int | None = None) -> dict:
        """One row for tables and ``commlab runs``: settings, status and headline figures
        (``commlab.analysis.metrics.headline``); ``records`` (at least SUMMARY_FIELDS of
        each) and ``skipped`` when the caller has read them already.  A damaged run's row says
        so in status ("damaged") and error, with nothing else read."""
        from commlab.analysis import metrics

        row = {"run_id": self.id, "run_dir": str(self.path)}
        listed = self.listed_status_record()
        if listed["status"] == RunStatus.DAMAGED:
            return {**row, **dict.fromkeys(SUMMARY_COLUMNS), **listed, "skipped_lines": 0}
        cfg = self.config_dict()
        if records is None:
            tail = self.metrics_tail(SUMMARY_FIELDS)
            records, skipped = tail.read_new(), tail.skipped
        status = listed  # not damaged: the status record itself
        return {
            **row,
            "status": status["status"],
            "hook": cfg.get("hook"),
            "wrapper": cfg.get("wrapper"),
            "hook_impl": self.meta().get("hook_impl") or self.launch_info().get("hook_impl"),
            "world_size": cfg.get("world_size"),
            "workload": cfg.get("workload"),
            "rank": cfg.get("matrix_approximation_rank"),
            "start_iter": cfg.get("start_powerSGD_iter"),
            "steps": len(records),
            "steps_planned": cfg.get("steps"),
            **metrics.headline(records, cfg),
            "steady_compression_ratio": metrics.steady_compression_ratio(records, cfg),
            "compression_ratio": metrics.cumulative_compression_ratio(records),
            "overlap_share": self.timeline().get("overlap_share"),
            **heldout(self.evals()),
            "error": status.get("error"),
            "skipped_lines": skipped or 0,
        }


NOTES = {"name?": str, "note?": str}  # notes.json, a person's name and note for a run
MAX_NAME_CHARS = 80  # a name shows in every run picker

# What every listing reads of a run: one of them damaged makes the run "damaged".
LISTED = ("config.json", "status.json", "launch.json", "supervisor.json", "meta.json",
          "metrics.jsonl", "evals.jsonl")
# What ``RunFolder.summary`` reads of each step record (the rest is left unparsed in memory).
SUMMARY_FIELDS = ("step", "loss", "step_s", "t", "payload_bytes", "plain_bytes", "compression_ratio")
SUMMARY_COLUMNS = ("hook", "wrapper", "hook_impl", "world_size", "workload", "rank", "start_iter",
                   "steps", "steps_planned", "final_loss", "median_step_s", "bytes_per_step",
                   "steady_steps", "steady_compression_ratio", "compression_ratio", "overlap_share",
                   "heldout_loss", "heldout_accuracy", "heldout_bits_per_char")


def heldout(evals: list[dict]) -> dict:
    """The latest held-out evaluation as a summary's columns (None where it has none)."""
    last = evals[-1] if evals else {}
    return {"heldout_loss": last.get("loss"), "heldout_accuracy": last.get("accuracy"),
            "heldout_bits_per_char": last.get("bits_per_char")}


def list_runs(runs_dir: str | os.PathLike) -> list[RunFolder]:
    """Every run in the folder, newest first."""
    root = Path(runs_dir)
    if not root.is_dir():
        return []
    runs = [run for run in map(RunFolder, root.iterdir()) if run.exists()]
    return sorted(runs, key=lambda r: r.id, reverse=True)
