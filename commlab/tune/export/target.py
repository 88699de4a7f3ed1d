"""Where an export is for (``Target``), what one is (``Export``), and what keeps one from being made."""
from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field

from commlab.config import RunConfig
from commlab.engine.launchers.slurm import sbatch_line_errors
from commlab.hooks import registry

# Settings of the lab, not of the training: a config file leaves them out (the runs folder is a
# path of the exporting machine; the loading machine uses its own default).
LAB_ONLY = ("runs_dir",)


class ExportRefused(ValueError):
    """The target cannot express these settings; the message says why and what to do instead."""


@dataclass
class Target:
    """Where the job will run: the launch formats read it, the config formats ignore it."""

    nnodes: int = 1
    nproc_per_node: int | None = None  # None: the run's world size on one node
    backend: str = "nccl"  # what production runs on; decides which hooks and warnings
    script: str = "train.py"
    script_args: list[str] = field(default_factory=list)
    rdzv_endpoint: str | None = None  # host:port of the first node; None: $HEAD_NODE:29500
    job_name: str = "commlab"
    time_limit: str = "01:00:00"
    partition: str | None = None
    threads_per_process: int = 1  # OMP_NUM_THREADS; torchrun's own default is 1

    @classmethod
    def from_entries(cls, script_args: str | None = None, **entries) -> Target:
        """A target from what a person typed (CLI flags, a form): the script's arguments as one
        shell-quoted string, an empty entry for an optional field meaning "not given".  Raises
        ValueError for unbalanced quotes."""
        optional = {f.name for f in dataclasses.fields(cls) if f.default is None}
        given = {k: None if k in optional and v == "" else v for k, v in entries.items()}
        return cls(script_args=shlex.split(script_args or ""), **given)

    def procs(self, cfg: RunConfig) -> int:
        return self.nproc_per_node or cfg.world_size

    def errors(self) -> dict[str, str]:
        e = {}
        for name, lowest in (("nnodes", 1), ("nproc_per_node", 1), ("threads_per_process", 1)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < lowest):
                e[name] = f"must be a whole number of at least {lowest}, got {value!r}"
        if self.backend not in registry.BACKENDS:
            e["backend"] = f"must be one of {', '.join(registry.BACKENDS)}, got {self.backend!r}"
        if not self.script.strip():
            e["script"] = "name the training script torchrun starts"
        return e | sbatch_line_errors({n: getattr(self, n) for n in ("job_name", "time_limit", "partition")})


@dataclass
class Export:
    format: str
    text: str
    filename: str
    language: str  # for st.code
    mime: str
    notes: list[str]  # warnings a person should read before using the text


def export_errors(cfg: RunConfig) -> dict[str, str]:
    """What keeps ``cfg`` from being exported: its own errors, less those about this machine (its
    GPUs, its runs folder), which production does not run on."""
    return {k: v for k, v in cfg.errors(gpu_count=cfg.world_size).items() if k not in LAB_ONLY}
