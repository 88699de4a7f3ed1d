"""A setting's row of the settings table as ``RunConfig`` declares it (``setting``: its default,
help, group, allowed values, CLI spelling), and a value read against it: coerced to the field's
type, checked against its choices and bounds, quoted in a message (``shown``).  ``ConfigError`` is
what a setting that cannot run raises.  ``commlab.config`` holds the table itself."""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from commlab.hook_specs import BASELINE

IMPLS = ("auto", "stock", "commlab")
RESOLVED_BACKENDS = ("gloo", "nccl")  # what "auto" resolves to on a machine
BACKENDS = ("auto", *RESOLVED_BACKENDS)
OPTIMIZERS = ("sgd", "adam", "adamw")
# How the model is spread over the ranks: DDP replicates it, FSDP2 shards it over every rank, HSDP
# shards it within each of ``replicas`` groups and replicates it across them.
SHARDINGS = ("ddp", "fsdp", "hsdp")
REDUCE_DTYPES = ("fp32", "bf16")  # MixedPrecisionPolicy's reduce_dtype, as the lab spells it
# The hooks with a sharded form: what HSDP's all-reduce between replicas may be (on each rank's
# shard); the others send what only DDP's buckets give them.
REPLICA_HOOKS = ("allreduce", "fp16", "bf16", "powersgd")


def lab_between_replicas(cfg: Any) -> bool:
    """Whether the lab's hook runs between HSDP's replicas (``commlab.hooks.replica``): any but plain
    allreduce, which FSDP's own HSDP all-reduce runs."""
    return cfg.sharding == "hsdp" and cfg.hook != BASELINE


# The sections of the settings table, in the Launch form's order: group -> its heading.
GROUPS = {"hook": "Hook and wrapper", "job": "Job", "powersgd": "PowerSGD settings",
          "workload": "Workload", "instrument": "Instrumentation and an emulated link",
          "localsgd": "Post-local SGD settings", "compressors": "Quantization and sparsification settings",
          "diloco": "DiLoCo settings", "sharding": "Sharding (FSDP2, HSDP)"}


def default_runs_dir() -> str:
    return os.environ.get("COMMLAB_RUNS_DIR", "./runs")


# The longest run, and the last step any step-numbered setting may name: a line of metrics per step.
MAX_STEPS = 1_000_000
# The most steps a run traces: each is gathered from every rank, and with torch.profiler each rank
# writes megabytes of trace a step (150 profiled steps of 2 ranks wrote 35 MB in 300 files).
MAX_TRACED_STEPS = 16
SHOWN_CHARS = 80  # a value quoted in a message is cut to this many characters
# The steps a run traces unless told: the first after DDP rebuilt its buckets.
DEFAULT_TRACE_STEPS = (1,)


@dataclass(frozen=True)
class Bounds:
    """The values a number setting may take: ``lo`` to ``hi`` (above ``lo`` when ``lo_open``), or
    exactly ``off``; ``why`` says where the limits come from."""

    lo: float
    hi: float
    why: str
    lo_open: bool = False
    off: float | None = None

    def error(self, value: float) -> str | None:
        if value == self.off:
            return None
        if isinstance(value, float) and not math.isfinite(value):
            problem = "must be a finite number"
        elif value <= self.lo if self.lo_open else value < self.lo:
            problem = f"must be {'above' if self.lo_open else 'at least'} {_num(self.lo)}"
        elif value > self.hi:
            problem = f"must be at most {_num(self.hi)}"
        else:
            return None
        return f"{problem} (allowed: {self.text}), got {shown(value)}: {self.why}"

    @property
    def text(self) -> str:
        span = f"{'above ' if self.lo_open else ''}{_num(self.lo)} to {_num(self.hi)}"
        return span if self.off is None else f"{_num(self.off)} (off) or {span}"


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def shown(value: Any) -> str:
    """``repr(value)``, cut for a message: a value may be megabytes of text (or an integer of
    more digits than Python converts to text)."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text):,} characters)"


def setting(default: Any = dataclasses.MISSING, *, help: str, group: str, label: str | None = None,
            choices: tuple | None = None, bounds: Bounds | None = None,
            aliases: tuple[str, ...] = (), sweep: tuple | None = None,
            export: bool = False, form: bool = True, before: Any = dataclasses.MISSING,
            default_factory: Any = dataclasses.MISSING) -> Any:
    """A RunConfig field with its row of the settings table (read back with ``settings()``).

    label: the form's label (default: the name).  bounds: a number's allowed values, checked
    before anything starts (every number has them: values past them fail in the workers).
    aliases: CLI spellings beside the flag
    ``--name-in-dashes``; a boolean gets a ``--no-`` form of each.  sweep: None when the setting is
    not a sweep axis, else the values a sweep tries unless told (empty: the base's value).
    export: the Export page's form offers it (what an export renders).  form: False for the one
    setting the app sets itself (the runs folder it was started with).  before: what a run recorded
    before the setting existed did, when that differs from its default (``RunConfig.recorded``).
    """
    if group not in GROUPS:
        raise ValueError(f"unknown group {group!r}; groups are: {', '.join(GROUPS)}")
    return field(default=default, default_factory=default_factory, metadata={
        "help": help, "group": group, "label": label, "choices": choices, "bounds": bounds,
        "aliases": aliases, "sweep": sweep, "export": export, "form": form, "before": before})


class ConfigError(ValueError):
    """Settings that cannot run; ``errors`` maps each offending field to why."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(f"{k}: {v}" for k, v in self.errors.items()))


def coerce(f: dataclasses.Field, value: Any) -> Any:
    """``value`` as field ``f``'s type; TypeError saying what it must be."""
    kind = kind_of(f)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise TypeError(f"must be true or false, got {shown(value)}")
    if kind == "int":
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise TypeError(f"must be a whole number, got {shown(value)}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise TypeError(f"must be a whole number, got {shown(value)}") from None
    if kind == "float":
        if isinstance(value, bool):
            raise TypeError(f"must be a number, got {shown(value)}")
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError):  # OverflowError: a 400-digit integer
            raise TypeError(f"must be a number, got {shown(value)}") from None
    if kind == "str":
        if not isinstance(value, str):
            raise TypeError(f"must be text, got {shown(value)}")
        return value
    if kind == "list[int]":
        if isinstance(value, str):
            value = [v for v in value.replace(" ", "").split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"must be a list of step numbers, got {shown(value)}")
        try:
            return sorted({int(v) for v in value})
        except (TypeError, ValueError):
            raise TypeError(f"must be a list of step numbers, got {shown(value)}") from None
    return value


def choice_error(value: str, allowed: tuple[str, ...], what: str) -> str | None:
    if value in allowed:
        return None
    return f"unknown {what} {shown(value)}; valid {what}s are: {', '.join(allowed)}"


def kind_of(f: dataclasses.Field) -> str:
    """A field's type as written: str, int, float, bool or list[int]."""
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def link_of(cfg: dict) -> str | None:
    """A stored config's link, as ``link_label`` says it; None for loopback."""
    if rate := cfg.get("real_link_mbps"):  # the kernel's link; its latency netem's or the hooks' (launch.json says)
        return f"real {rate:g} Mb/s" + (f", {cfg.get('emulate_latency_us'):g} µs per hop"
                                        if cfg.get("emulate_latency_us") else "")
    return link_label(cfg.get("emulate_bandwidth_gbps", 0.0), cfg.get("emulate_latency_us", 0.0))


def link_label(bandwidth_gbps: float, latency_us: float) -> str | None:
    """'emulated 1 Gb/s, 20 µs' for a run over an emulated link, None for the real network."""
    if not (bandwidth_gbps or latency_us):
        return None
    bw = f"{bandwidth_gbps:g} Gb/s" if bandwidth_gbps else "unlimited bandwidth"
    return f"emulated {bw}, {latency_us:g} µs"


def is_plain_allreduce(cfg: dict) -> bool:
    """Whether a stored config is DDP's own behaviour: the run that calibrates the what-if model, and
    the default baseline (``commlab.tune.baseline`` has the 16-bit ones); a sharded run is not."""
    return (cfg.get("hook") == BASELINE and cfg.get("wrapper", "none") == "none"
            and cfg.get("sharding", "ddp") == "ddp")
