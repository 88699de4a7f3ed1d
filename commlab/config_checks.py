"""The rules between settings, and checking a whole configuration: each field against its choices
and bounds, then the rules (the general ones here, a hook's own from its row of the hook table), in
the order their messages are given.  What can be told without running anything."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commlab import rules
from commlab.config_fields import (
    DEFAULT_TRACE_STEPS,
    MAX_STEPS,
    MAX_TRACED_STEPS,
    REPLICA_HOOKS,
    choice_error,
    lab_between_replicas,
    shown,
)
from commlab.hook_specs import BASELINE, SPECS
from commlab.rules import Rule


@dataclass
class _Checked:
    """A config as the rules read it: its settings, and ``gpus``, those of the machine it is
    checked for (this one's, unless told: an export is checked for the cluster it names)."""

    cfg: Any  # a RunConfig
    gpu_count: int | None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cfg, name)

    @property
    def gpus(self) -> int:
        from commlab.devices import gpu_count

        return gpu_count() if self.gpu_count is None else self.gpu_count


def _needs_instrument(name: str) -> Rule:
    # Carried out by the instrumentation: without it they would be silently ignored.
    return Rule(name, ("instrument", name), lambda c: not c.instrument and bool(getattr(c, name)),
                lambda c: f"needs instrument on: the instrumentation carries it out (got {getattr(c, name)})")


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


# The rules of a sharded run (``sharding`` fsdp or hsdp): what FSDP2 can be asked, refused before
# anything starts.
SHARDING_RULES: tuple[Rule, ...] = (
    Rule("replicas", ("sharding", "world_size", "replicas"),
         lambda c: c.sharding == "hsdp" and c.world_size % c.replicas != 0,
         lambda c: (f"{c.world_size} ranks cannot form {c.replicas} replicas of equal size: HSDP runs "
                    f"replicas x (ranks / replicas) shards; with {c.world_size} ranks use one of "
                    f"{_divisors(c.world_size)}")),
    Rule("hook", ("sharding", "hook"), lambda c: c.sharding == "fsdp" and c.hook != BASELINE,
         lambda c: (f"fsdp has no all-reduce between replicas for {c.hook} to compress (FSDP's own "
                    "reduce-scatter averages the gradients); use sharding hsdp, or hook allreduce")),
    Rule("hook", ("sharding", "hook"), lambda c: c.sharding == "hsdp" and c.hook not in REPLICA_HOOKS,
         lambda c: (f"{c.hook} has no sharded form: it sends what DDP's gradient buckets give it; "
                    f"between HSDP's replicas (on each rank's shard) the lab runs "
                    f"{', '.join(REPLICA_HOOKS)}")),
    Rule("wrapper", ("sharding", "wrapper"), lambda c: c.sharding != "ddp" and c.wrapper != "none",
         lambda c: (f"a compress wrapper casts DDP's gradient buckets, and a {c.sharding} run has none: "
                    "use wrapper none (reduce_dtype bf16 reduces the gradients in bf16)")),
    # Measured around the lab's hook between HSDP's replicas, on each rank's shards
    # (``commlab.engine.measurement.ShardProbe``): FSDP alone and native HSDP run none of the lab's.
    *(Rule(name, ("sharding", "hook", name),
           lambda c, name=name: c.sharding != "ddp" and not lab_between_replicas(c) and bool(getattr(c, name)),
           lambda c, name=name: (
               f"is not carried out on a {c.sharding} run with hook {c.hook} (got {shown(getattr(c, name))}): "
               "it is measured around a hook, DDP's or the lab's between HSDP's replicas, and FSDP's own "
               "reduce-scatter and all-reduce are none; use sharding hsdp with hook "
               f"{', '.join(h for h in REPLICA_HOOKS if h != BASELINE)} (on each rank's shards), or sharding ddp"))
      for name in ("error_every", "save_grads_at")),
)

# The rules between settings, in the order their messages are given; a hook's own (its spec's
# ``rules``) go after the first two.
RULES: tuple[Rule, ...] = (
    Rule("wrapper", ("hook", "wrapper"), lambda c: not SPECS[c.hook].wrappable and c.wrapper != "none",
         lambda c: f"a compress wrapper cannot wrap {c.hook}: {SPECS[c.hook].wrap_refusal}; use wrapper 'none'"),
    Rule("impl", ("hook", "impl"), lambda c: SPECS[c.hook].commlab_only and c.impl == "stock",
         lambda c: (f"PyTorch has no {c.hook} hook, so impl=stock cannot run it: commlab's is the "
                    "only one; use impl auto or commlab")),
    Rule("world_size", ("world_size", "backend"),
         lambda c: c.backend == "nccl" and c.world_size > c.gpus,
         lambda c: (f"{c.world_size} NCCL ranks need {c.world_size} GPUs, this machine has "
                    f"{c.gpus}: NCCL runs one rank per GPU (use backend gloo or auto)")),
    # A bad steps gives no range to name.
    Rule("save_grads_at", ("steps", "save_grads_at"),
         lambda c: any(not 0 <= s < c.steps for s in c.save_grads_at),
         lambda c: (f"each step must be from 0 to {c.steps - 1} (steps is {c.steps}; they count from 0), "
                    f"got {shown([s for s in c.save_grads_at if not 0 <= s < c.steps])}")),
    Rule("trace_steps", ("trace_steps",),
         lambda c: any(not 0 <= s < MAX_STEPS for s in c.trace_steps) or len(c.trace_steps) > MAX_TRACED_STEPS,
         lambda c: (f"at most {MAX_TRACED_STEPS} step numbers, each from 0 to {MAX_STEPS - 1}, got "
                    f"{shown(c.trace_steps)}: each traced step is gathered from every rank and "
                    "written out (with torch.profiler, megabytes a rank)")),
    *map(_needs_instrument, ("error_every", "save_grads_at", "emulate_bandwidth_gbps", "emulate_latency_us")),
    # The default (step 1) traces nothing with instrument off; any other steps are refused.
    Rule("trace_steps", ("instrument", "trace_steps"),
         lambda c: not c.instrument and c.trace_steps != list(DEFAULT_TRACE_STEPS) and bool(c.trace_steps),
         lambda c: (f"needs instrument on: the instrumentation records the timeline (got "
                    f"{shown(c.trace_steps)})")),
    Rule("workload", ("workload",), lambda c: bool(_workload_error(c.workload)),
         lambda c: f"{shown(c.workload)} {_workload_error(c.workload)}"),
    Rule("runs_dir", ("runs_dir",), lambda c: runs_dir_error(c.runs_dir) is not None,
         lambda c: runs_dir_error(c.runs_dir)),
    *SHARDING_RULES,
)


def _workload_error(workload: str) -> str | None:
    from commlab.workload_names import spec_error

    return spec_error(workload)


def field_errors(c: Any, gpu_count: int | None, known_bad: dict | None = None) -> dict[str, str]:
    """What can be told without running anything: the table's choices and bounds, the rules
    between settings, the runs folder; of a user's workload only how it is spelled (the engine's
    ``workload_probe`` runs it, in a child process, before a run starts).  ``known_bad``: fields
    already refused (their value here is a stand-in), left out, as is every rule reading one."""
    e: dict[str, str] = dict(known_bad or {})
    for f in dataclasses.fields(c):
        if f.name in e:
            continue
        value, m = getattr(c, f.name), f.metadata
        msg = None
        if m["choices"]:
            msg = choice_error(value, m["choices"], f.name)
        elif m["bounds"]:
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            msg = m["bounds"].error(value) if is_number else f"must be a number, got {shown(value)}"
        if msg:
            e[f.name] = msg
    own = () if "hook" in e else SPECS[c.hook].rules
    return rules.check(RULES[:2] + own + RULES[2:], _Checked(c, gpu_count), e)


def runs_dir_error(runs_dir: str) -> str | None:
    """Why runs cannot be written under this folder, or None; it creates nothing."""
    if not runs_dir:
        return ("is empty: name a folder (is COMMLAB_RUNS_DIR set to nothing? unset it for "
                "./runs)")
    if "\0" in runs_dir:
        return f"{shown(runs_dir)} holds a NUL character, which no path may"
    path = Path(runs_dir)
    try:
        if path.exists() and not path.is_dir():
            return f"{shown(runs_dir)} is not a folder: runs are folders inside it"
        existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
        if not existing.is_dir():
            return f"{shown(runs_dir)} cannot be made: {shown(str(existing))} is not a folder"
        read_only = os.statvfs(existing).f_flag & os.ST_RDONLY
    except OSError as err:
        return f"{shown(runs_dir)} cannot be used: {err.strerror}"
    if read_only or not os.access(existing, os.W_OK | os.X_OK):
        return f"{shown(runs_dir)} cannot be written: {shown(str(existing))} is read-only here"
    return None
