"""One run's configuration: a dataclass that validates with messages a person can act on.

Settings are spelled as PyTorch spells them where PyTorch has a name (``PowerSGDState``'s
arguments keep their exact spelling, ``start_powerSGD_iter`` included).  Files are JSON or TOML;
unknown keys are refused, as Accelerate's config classes refuse them.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOOKS = ("allreduce", "fp16", "bf16", "powersgd", "batched_powersgd", "noop")
WRAPPERS = ("none", "fp16", "bf16")
IMPLS = ("auto", "stock", "commlab")
RESOLVED_BACKENDS = ("gloo", "nccl")  # what "auto" resolves to on a machine
BACKENDS = ("auto", *RESOLVED_BACKENDS)
OPTIMIZERS = ("sgd", "adam", "adamw")
POWERSGD_HOOKS = ("powersgd", "batched_powersgd")
# The settings that PowerSGDState takes, in its own order and spelling.
POWERSGD_FIELDS = (
    "matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate",
    "use_error_feedback", "warm_start", "orthogonalization_epsilon", "random_seed",
    "batch_tensors_with_same_shape",
)


def default_runs_dir() -> str:
    return os.environ.get("COMMLAB_RUNS_DIR", "./runs")


@dataclass
class RunConfig:
    # -- the communication hook
    hook: str = "allreduce"
    wrapper: str = "none"
    impl: str = "auto"
    # -- PowerSGDState (only read by the PowerSGD hooks); lab defaults suit a 200-step run
    matrix_approximation_rank: int = 1
    start_powerSGD_iter: int = 20
    min_compression_rate: float = 2.0
    use_error_feedback: bool = True
    warm_start: bool = True
    orthogonalization_epsilon: float = 0.0
    random_seed: int = 0
    batch_tensors_with_same_shape: bool = False
    # -- the job
    world_size: int = 2
    backend: str = "auto"
    bucket_cap_mb: float = 25.0
    workload: str = "charlm"
    steps: int = 200
    batch_size: int = 16
    lr: float = 3e-3
    optimizer: str = "adamw"
    seed: int = 0
    # -- instrumentation
    instrument: bool = True
    error_every: int = 0  # record the approximation error every K steps; 0 = never
    save_grads_at: list[int] = field(default_factory=list)  # steps whose gradients are saved
    stall_timeout_s: float = 120.0
    # -- an emulated network link (0 = off): each collective the hook issues completes no
    #    earlier than a ring allreduce over it would, 2(N-1)·latency + 2(N-1)/N·bytes/bandwidth,
    #    after it started; collectives share the one link (see commlab.hooks.instrument)
    emulate_bandwidth_gbps: float = 0.0
    emulate_latency_us: float = 0.0
    runs_dir: str = field(default_factory=default_runs_dir)

    def __post_init__(self):
        if isinstance(self.save_grads_at, (list, tuple)):
            self.save_grads_at = sorted(set(self.save_grads_at))

    # ------------------------------------------------------------------ validation
    def errors(self, gpu_count: int | None = None) -> dict[str, str]:
        """Every problem with these settings, by field name; empty when the run may start."""
        return _field_errors(self, gpu_count)

    def check(self, gpu_count: int | None = None) -> RunConfig:
        errs = self.errors(gpu_count)
        if errs:
            raise ConfigError(errs)
        return self

    # ------------------------------------------------------------------ conversions
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> RunConfig:
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError({k: f"unknown setting in {source}; valid settings are: "
                                  f"{', '.join(known)}" for k in unknown})
        errs: dict[str, str] = {}
        values = {}
        for key, value in data.items():
            try:
                values[key] = _coerce(known[key], value)
            except (TypeError, ValueError) as e:
                errs[key] = str(e)
        if errs:
            raise ConfigError(errs)
        return cls(**values)

    def with_overrides(self, **overrides: Any) -> RunConfig:
        data = self.to_dict()
        data.update({k: v for k, v in overrides.items() if v is not None})
        return RunConfig.from_dict(data, "overrides")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str, source: str = "JSON") -> RunConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError({"file": f"{source} does not parse: {e.msg} at line {e.lineno}, "
                                       f"column {e.colno}"}) from None
        if not isinstance(data, dict):
            raise ConfigError({"file": f"{source} must hold one object of settings, "
                                       f"not {type(data).__name__}"})
        return cls.from_dict(data, source)

    @classmethod
    def from_toml(cls, text: str, source: str = "TOML") -> RunConfig:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError({"file": f"{source} does not parse: {e}"}) from None
        return cls.from_dict(data, source)

    @classmethod
    def load(cls, path: str | os.PathLike) -> RunConfig:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise ConfigError({"file": f"cannot read {p}: {e.strerror}"}) from None
        if p.suffix == ".toml":
            return cls.from_toml(text, str(p))
        return cls.from_json(text, str(p))

    def save(self, path: str | os.PathLike) -> Path:
        p = Path(path)
        p.write_text(self.to_toml() if p.suffix == ".toml" else self.to_json())
        return p

    # ------------------------------------------------------------------ derived
    @property
    def is_powersgd(self) -> bool:
        return self.hook in POWERSGD_HOOKS

    def powersgd_kwargs(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in POWERSGD_FIELDS}

    def label(self) -> str:
        return label_of(self.to_dict())


def is_plain_allreduce(cfg: dict) -> bool:
    """Whether a stored config is DDP's own behaviour: the baseline every comparison is made against."""
    return cfg.get("hook") == "allreduce" and cfg.get("wrapper", "none") == "none"


def label_of(cfg: dict) -> str:
    """A run's settings in a few words, from its config as stored (any version of it)."""
    hook, wrapper = cfg.get("hook", "?"), cfg.get("wrapper", "none")
    name = hook if wrapper == "none" else f"{wrapper}_wrapper({hook})"
    if hook in POWERSGD_HOOKS:
        name += f" r={cfg.get('matrix_approximation_rank')} start={cfg.get('start_powerSGD_iter')}"
        if cfg.get("min_compression_rate", 2.0) != 2.0:
            name += f" rate={cfg['min_compression_rate']:g}"
    return name


class ConfigError(ValueError):
    """Settings that cannot run; ``errors`` maps each offending field to why."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(f"{k}: {v}" for k, v in self.errors.items()))


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise TypeError(f"must be true or false, got {value!r}")
    if kind == "int":
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise TypeError(f"must be a whole number, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise TypeError(f"must be a whole number, got {value!r}") from None
    if kind == "float":
        if isinstance(value, bool):
            raise TypeError(f"must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise TypeError(f"must be a number, got {value!r}") from None
    if kind == "str":
        if not isinstance(value, str):
            raise TypeError(f"must be text, got {value!r}")
        return value
    if kind == "list[int]":
        if isinstance(value, str):
            value = [v for v in value.replace(" ", "").split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"must be a list of step numbers, got {value!r}")
        try:
            return sorted({int(v) for v in value})
        except (TypeError, ValueError):
            raise TypeError(f"must be a list of step numbers, got {value!r}") from None
    return value


def _choice(value: str, allowed: tuple[str, ...], what: str) -> str | None:
    if value in allowed:
        return None
    return f"unknown {what} {value!r}; valid {what}s are: {', '.join(allowed)}"


def _field_errors(c: RunConfig, gpu_count: int | None) -> dict[str, str]:
    e: dict[str, str] = {}
    for name, allowed, what in (("hook", HOOKS, "hook"), ("wrapper", WRAPPERS, "wrapper"),
                                ("impl", IMPLS, "impl"), ("backend", BACKENDS, "backend"),
                                ("optimizer", OPTIMIZERS, "optimizer")):
        msg = _choice(getattr(c, name), allowed, what)
        if msg:
            e[name] = msg
    if c.hook == "noop" and c.wrapper != "none":
        e["wrapper"] = ("a compress wrapper cannot wrap noop: noop sends nothing, so there is "
                        "nothing to compress; use wrapper 'none'")
    if c.matrix_approximation_rank < 1:
        e["matrix_approximation_rank"] = (f"must be at least 1, got {c.matrix_approximation_rank}: "
                                          "P and Q need at least one column")
    if c.start_powerSGD_iter < 0:
        e["start_powerSGD_iter"] = f"must be 0 or more, got {c.start_powerSGD_iter}"
    elif c.is_powersgd and c.start_powerSGD_iter < 2 and (c.use_error_feedback or c.warm_start):
        e["start_powerSGD_iter"] = (
            f"must be at least 2 while use_error_feedback or warm_start is on, got "
            f"{c.start_powerSGD_iter}: DDP rebuilds its buckets after the first iteration, which "
            "conflicts with any tensor memorized before the rebuild (turn both off to start earlier)")
    if not (math.isfinite(c.min_compression_rate) and c.min_compression_rate > 0):
        e["min_compression_rate"] = (f"must be a finite number above 0, got {c.min_compression_rate}: "
                                     "it multiplies (n + m) * r in the rule (n + m) * r * rate < n * m")
    if c.orthogonalization_epsilon < 0 or not math.isfinite(c.orthogonalization_epsilon):
        e["orthogonalization_epsilon"] = f"must be 0 or a small positive number, got {c.orthogonalization_epsilon}"
    if c.world_size < 1:
        e["world_size"] = f"must be at least 1 process, got {c.world_size}"
    elif c.backend == "nccl":
        from commlab.devices import gpu_count as count_gpus

        gpus = count_gpus() if gpu_count is None else gpu_count
        if c.world_size > gpus:
            e["world_size"] = (f"{c.world_size} NCCL ranks need {c.world_size} GPUs, this machine "
                               f"has {gpus}: NCCL runs one rank per GPU (use backend gloo or auto)")
    if not (math.isfinite(c.bucket_cap_mb) and c.bucket_cap_mb > 0):
        e["bucket_cap_mb"] = f"must be a number of MiB above 0, got {c.bucket_cap_mb}"
    if c.steps < 1:
        e["steps"] = f"must be at least 1, got {c.steps}"
    if c.batch_size < 1:
        e["batch_size"] = f"must be at least 1, got {c.batch_size}"
    if not (math.isfinite(c.lr) and c.lr > 0):
        e["lr"] = f"must be a finite number above 0, got {c.lr}"
    if c.error_every < 0:
        e["error_every"] = f"must be 0 (never) or a number of steps, got {c.error_every}"
    bad = [s for s in c.save_grads_at if not 0 <= s < max(c.steps, 1)]
    if bad:
        e["save_grads_at"] = f"steps must lie in 0..{c.steps - 1}, got {bad}"
    if not (math.isfinite(c.stall_timeout_s) and c.stall_timeout_s > 0):
        e["stall_timeout_s"] = f"must be a number of seconds above 0, got {c.stall_timeout_s}"
    if c.emulate_bandwidth_gbps < 0 or not math.isfinite(c.emulate_bandwidth_gbps):
        e["emulate_bandwidth_gbps"] = f"must be 0 (off) or a bandwidth in Gb/s, got {c.emulate_bandwidth_gbps}"
    if c.emulate_latency_us < 0 or not math.isfinite(c.emulate_latency_us):
        e["emulate_latency_us"] = f"must be 0 or more microseconds, got {c.emulate_latency_us}"
    if not c.instrument:
        # These are carried out by the instrumentation; without it they would be silently ignored.
        for name, on in (("error_every", c.error_every > 0), ("save_grads_at", bool(c.save_grads_at)),
                         ("emulate_bandwidth_gbps", c.emulate_bandwidth_gbps > 0),
                         ("emulate_latency_us", c.emulate_latency_us > 0)):
            if on:
                e[name] = f"needs instrument on: the instrumentation carries it out (got {getattr(c, name)})"
    from commlab.workloads import workload_error

    msg = workload_error(c.workload)
    if msg:
        e["workload"] = msg
    return e

