"""What a rank measures of its hook, step by step: the worker's one view of the instrumentation.

``Measurement`` wraps the hook (``commlab.hooks.instrument.HookInstrument``) and counts the bytes of
every collective (``CollectiveCounter``); ``Unmeasured``, for a run with ``instrument`` off, has
the same methods and does nothing, so the training loop reads the same either way.  Every rank
measures (a traced step's timeline is gathered from all of them); rank 0 alone writes what was
measured (``commlab.engine.rank0``).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from commlab.analysis import ring
from commlab.analysis.metrics import relative_error
from commlab.analysis.ring import wire_bytes
from commlab.analysis.rule import shard_name
from commlab.engine.sharding import issuing_unit
from commlab.hooks.instrument import (
    MEASURE,
    OTHER,
    SHARDING,
    CollectiveCounter,
    HookInstrument,
    Link,
    StepRecord,
    error_feedback_norm,
)


@dataclass
class Measured:
    """One step's measurements: the metrics row's fields, and what else rank 0 writes."""

    row: dict = field(default_factory=dict)
    layout: list | None = None  # the step's bucket layout, at the steps that record one
    errors: dict | None = None  # the approximation error, at the steps that measure it
    grads: dict = field(default_factory=dict)  # exact mean gradients to save, by parameter
    layer_errors: list = field(default_factory=list)


class Unmeasured:
    """``instrument`` off: the hook as chosen, and nothing measured."""

    def __init__(self, hook):
        self.hook = hook

    def begin(self, step: int) -> None:
        pass

    def phase(self, kind: str):
        return contextlib.nullcontext()

    def not_the_hooks(self):
        return contextlib.nullcontext()

    def timeline(self) -> list | None:
        return None

    def ledger(self) -> list | None:
        return None

    def take(self, step: int, state) -> Measured:
        return Measured()

    def close(self) -> None:
        pass


class Measurement(Unmeasured):
    """The hook wrapped and every collective counted, over the emulated link the settings name."""

    def __init__(self, cfg, choice, names_by_ptr: dict[int, str], compressed: set[str], world: int,
                 first: int, device: torch.device, rank: int):
        self.cfg, self.first, self.world, self.rank = cfg, first, world, rank
        self.counter = CollectiveCounter(Link(cfg.emulate_bandwidth_gbps, cfg.emulate_latency_us),
                                         world).install()
        self.instrument = HookInstrument(choice.hook, self.counter, names_by_ptr, compressed, world,
                                         cuda_device=device if device.type == "cuda" else None)
        super().__init__(self.instrument)
        self.sent_total = self.plain_total = 0
        self.measuring = False

    def begin(self, step: int) -> None:
        cfg = self.cfg
        self.measuring = cfg.error_every > 0 and step % cfg.error_every == 0
        # Iteration 0 shows DDP's first layout, iteration 1 the one it rebuilt after it.
        self.instrument.begin_step(self.measuring, step in cfg.save_grads_at,
                                   record_layout=step < 2 or step == self.first,
                                   trace=step in cfg.trace_steps)

    def phase(self, kind: str):
        return self.instrument.phase(kind)

    def not_the_hooks(self):
        """Collectives issued here are the lab's own, not the hook's traffic."""
        return self.counter.category(OTHER)

    def timeline(self) -> list | None:
        return _gathered(self.instrument.record, self.world)

    def ledger(self) -> list[dict]:
        """This rank's communication ledger of the run so far (``commlab.analysis.ledger``)."""
        return self.counter.ledger_rows()

    def take(self, step: int, state) -> Measured:
        """The step's counts, taken (the counter starts again from zero)."""
        nbytes, calls, timing = self.counter.take()
        rec = self.instrument.record
        self.sent_total += nbytes["hook"]
        self.plain_total += rec.plain_bytes
        row = {"payload_bytes": nbytes["hook"], "wire_bytes": wire_bytes(nbytes["hook"], self.world),
               "plain_bytes": rec.plain_bytes, "collectives": calls["hook"],
               "compression_ratio": self.plain_total / self.sent_total if self.sent_total else None,
               "hook_s": rec.hook_s, **timing, "measure_bytes": nbytes["measure"],
               "powersgd_iter": getattr(state, "iter", None)}
        errors = None
        if self.measuring and self.rank == 0:  # rank 0 records them (the error feedback's norm syncs)
            errors = {"step": step, "measure_bytes": nbytes["measure"], "buckets": rec.bucket_errors,
                      "layers": rec.layer_errors, "ef_residual_norm": error_feedback_norm(state)}
        layout = sorted(rec.layouts, key=lambda b: b["index"]) if rec.layouts else None
        return Measured(row, layout, errors, rec.grads, rec.layer_errors if self.measuring else [])

    def close(self) -> None:
        self.counter.uninstall()


def _gathered(record: StepRecord, world: int) -> list | None:
    """At a traced step, every rank's events to rank 0 (a collective: every rank calls it, at the
    same step, with no collective in flight); None at the others."""
    if record.events is None:
        return None
    gathered: list = [None] * world
    # A collective's completion is noted by a callback that may still be on its way.
    dist.all_gather_object(gathered, [e for e in record.timeline() if e.get("end") is not None])
    return gathered


class ShardedMeasurement(Unmeasured):
    """A sharded run's: every collective counted (``CollectiveCounter``), over the emulated link the
    settings name.  HSDP's all-reduce between replicas, FSDP's own or the lab's
    (``commlab.hooks.replica``), is the hook's traffic (``replica_bytes``); FSDP's all-gathers and
    reduce-scatters are the sharding's (``sharding_bytes``), by the same ruler.  ``payload_bytes``
    is both, what the run put on the wire, against ``plain_bytes``, what DDP's plain allreduce of the
    whole model would (its fp32 gradients), so that a sharded run's bytes read beside a DDP run's.
    No DDP hook is wrapped: FSDP calls none.  The lab's hook between HSDP's replicas is, at the steps
    that measure the approximation error or save gradients (``ShardProbe``).  At a traced step, the
    counter files every collective in the step's timeline as it does DDP's, each named by the unit
    that issued it (``sharding.issuing_unit``), beside the step's phases and each call of the lab's
    hook between replicas."""

    def __init__(self, cfg, world: int, sharded, model_bytes: int, rank: int, compressed: set[str],
                 device: torch.device):
        self.cfg, self.world, self.rank, self.model_bytes = cfg, world, rank, model_bytes
        self.replica, self.replicas = sharded.replica, cfg.replicas
        self.cuda_device = device if device.type == "cuda" else None  # traced steps timed on it too
        self.counter = CollectiveCounter(Link(cfg.emulate_bandwidth_gbps, cfg.emulate_latency_us),
                                         world).install()
        self.counter.unit_of = issuing_unit
        super().__init__(None)
        self.sent_total = self.plain_total = 0
        self.record = StepRecord.begun(self.counter, trace=False)
        self.probe = None
        if self.replica and (cfg.error_every > 0 or cfg.save_grads_at):
            self.probe = ShardProbe(self.replica, self.counter, sharded, compressed)
            self.replica.hook = self.probe
        if self.replica:
            self.replica.watch = self._hook_call

    def _hook_call(self):
        """Around each call of the lab's hook between replicas: at a traced step, a ``hook`` event
        of its unit, from FSDP's call (the unit's gradients reduce-scattered) until it returned,
        its collectives waited for (``commlab.hooks.replica``): the time backward was held."""
        if self.record.events is None:
            return contextlib.nullcontext()
        return self.record.phase("hook", unit=issuing_unit())

    def begin(self, step: int) -> None:
        self.record = StepRecord.begun(self.counter, step in self.cfg.trace_steps, self.cuda_device)
        if self.probe:
            self.probe.begin_step(self.cfg.error_every > 0 and step % self.cfg.error_every == 0,
                                  step in self.cfg.save_grads_at)

    def phase(self, kind: str):
        return self.record.phase(kind)

    def timeline(self) -> list | None:
        return _gathered(self.record, self.world)

    def not_the_hooks(self):
        """Collectives issued here are the lab's own, not the hook's traffic."""
        return self.counter.category(OTHER)

    def ledger(self) -> list[dict]:
        return self.counter.ledger_rows()

    def take(self, step: int, state) -> Measured:
        nbytes, calls, timing = self.counter.take()
        replica = nbytes["hook"]
        # FSDP's own all-reduce is plain, and not timed: it is not a hook
        replica_plain, hook_s = replica, None
        if self.replica:
            handed, hook_s = self.replica.take()
            # counted as the counter counts each all-reduce on the replica group: by the world's ruler
            replica_plain = sum(round(ring.sent_bytes(ring.ALLREDUCE, b, self.replicas) / ring.factor(self.world))
                                for b in handed)
        sent = replica + nbytes[SHARDING]
        self.sent_total += sent
        self.plain_total += self.model_bytes
        errors, grads = self.probe.take(step, state, self.rank) if self.probe else (None, {})
        if errors:
            errors["measure_bytes"] = nbytes["measure"]
        return Measured(errors=errors, grads=grads, row={"payload_bytes": sent, "wire_bytes": wire_bytes(sent, self.world),
                         "plain_bytes": self.model_bytes, "collectives": calls["hook"] + calls[SHARDING],
                         "hook_s": hook_s,
                         "compression_ratio": self.plain_total / self.sent_total if self.sent_total else None,
                         "replica_bytes": replica, "replica_plain_bytes": replica_plain,
                         "replica_collectives": calls["hook"],
                         "sharding_bytes": nbytes[SHARDING], "sharding_collectives": calls[SHARDING],
                         **timing, "measure_bytes": nbytes["measure"],
                         "powersgd_iter": getattr(state, "iter", None)})

    def close(self) -> None:
        self.counter.uninstall()


class ShardProbe:
    """The lab's hook between HSDP's replicas (``ReplicaAllReduce.hook``), measured at the steps told
    as ``HookInstrument`` measures DDP's: before the hook, the exact mean of the unit's shards over
    the replicas (one extra all-reduce on the replica group, its bytes counted apart as
    measurement), after it the hook's result against it, per unit (its "bucket") and per shard the
    rule compressed (named ``rule.shard_name``); at the steps that save gradients, that exact mean
    of each shard.  Each rank holds its own shards: ``take`` gathers them over the shard group, so
    that rank 0 records every shard of its replica (the replicas of a shard get the same result)."""

    def __init__(self, replica, counter: CollectiveCounter, sharded, compressed: set[str]):
        self.hook, self.counter, self.compressed = replica.hook, counter, compressed
        self.layouts = replica.layouts
        self.group, self.replicas = sharded.mesh["replicate"].get_group(), sharded.mesh["replicate"].size()
        self.shard_group, self.shard, self.shards = sharded.mesh["shard"].get_group(), sharded.shard, sharded.shards
        self.begin_step(False, False)

    def begin_step(self, measure: bool, save: bool) -> None:
        self.measure, self.save = measure, save
        self.units: list[dict] = []  # this rank's, per call: unit, |out - exact|², |exact|²
        self.layers: list[dict] = []
        self.grads: dict[str, torch.Tensor] = {}

    def __call__(self, state, bucket):  # a DDP hook's signature: ``ReplicaAllReduce`` calls it so
        if not (self.measure or self.save):
            return self.hook(state, bucket)
        exact = bucket.buffer().detach().clone()
        with self.counter.category(MEASURE):  # before the hook's own: every rank in the same order
            dist.all_reduce(exact, group=self.group)
        exact.div_(self.replicas)
        out = self.hook(state, bucket).wait()
        got, want = out.detach().double(), exact.double()
        index, offset = bucket.index(), 0
        self.units.append({"bucket": index, "diff_sq": float((got - want).pow(2).sum()),
                           "exact_sq": float(want.pow(2).sum())})
        for region in self.layouts[index]:
            n = region.shape.numel()
            name = shard_name(region.name, self.shard, self.shards)
            if self.measure and name in self.compressed:
                self.layers.append({"bucket": index, "layer": name, "rel_error": relative_error(
                    out[offset:offset + n].float(), exact[offset:offset + n].float())})
            if self.save:
                self.grads[name] = exact[offset:offset + n].reshape(region.shape).float().clone()
            offset += n
        done = torch.futures.Future()
        done.set_result(out)
        return done

    def take(self, step: int, state, rank: int) -> tuple[dict | None, dict]:
        """(errors, grads) of the step, every shard of rank 0's replica on rank 0, (None, {})
        elsewhere and at the steps that measure nothing; a collective on each shard group at the
        steps that measure (every rank takes them at the same step)."""
        if not (self.measure or self.save):
            return None, {}
        memory = error_feedback_norm(state)
        mine = (self.units, self.layers, self.grads, None if memory is None else memory ** 2)
        gathered: list = [None] * self.shards
        with self.counter.category(OTHER):
            dist.all_gather_object(gathered, mine, group=self.shard_group)
        measure, self.measure, self.save = self.measure, False, False
        if rank != 0:
            return None, {}
        grads = {name: g for _, _, saved, _ in gathered for name, g in saved.items()}
        if not measure:
            return None, grads
        by_unit: dict[int, list[float]] = {}
        for units, _, _, _ in gathered:
            for u in units:
                sums = by_unit.setdefault(u["bucket"], [0.0, 0.0])
                sums[0] += u["diff_sq"]
                sums[1] += u["exact_sq"]
        buckets = [{"bucket": i, "rel_error": _ratio(d, e)} for i, (d, e) in sorted(by_unit.items())]
        memories = [m for *_, m in gathered if m is not None]
        return {"step": step, "measure_bytes": 0, "buckets": buckets,  # ``ShardedMeasurement`` counts them
                "layers": [row for _, layers, _, _ in gathered for row in layers],
                "ef_residual_norm": math.sqrt(sum(memories)) if memories else None}, grads


def _ratio(diff_sq: float, exact_sq: float) -> float:
    """``metrics.relative_error`` from the squared norms summed over a unit's shards."""
    if exact_sq > 0:
        return math.sqrt(diff_sq / exact_sq)
    return 0.0 if diff_sq == 0 else float("inf")
