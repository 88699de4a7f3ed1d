"""What rank 0 writes of a run, step by step: the one owner of the run folder's writers.

Rank 0 alone records (``commlab.engine.store`` says what each file holds): meta.json and
layers.json once, then each step's metrics line, the bucket layouts, the approximation errors,
saved gradients, PowerSGD's pitfalls, the traced steps' timeline, the held-out evaluations, its
communication ledger (about once a second, and as the run ends), and how the run ended.  Every
other rank gets ``NoRecord``, whose methods do nothing, so the training loop is the same on every
rank; in a sharded run, ``ShardedPeer``, which evaluates with rank 0 (FSDP gathers each layer's
parameters from every rank for the forward).  ``close`` closes every file it opened.
"""
from __future__ import annotations

import math
import sys
import time

import torch

from commlab import workloads
from commlab.analysis import timeline
from commlab.engine import status_file, store
from commlab.engine.run_state import RunStatus
from commlab.hooks import pitfalls
from commlab.hooks.instrument import Link

LEDGER_EVERY_S = 1.0  # ledger.json rewritten at most this often while a run goes (a live view's pace)


class NoRecord:
    """A rank other than 0: it writes nothing."""

    def step(self, step: int, loss: float, step_s: float, measured) -> None:
        pass

    def timeline(self, step: int, gathered: list | None) -> None:
        pass

    def evaluate(self, step: int) -> None:
        pass

    def memory(self, per_rank: list[dict]) -> None:
        pass

    def diverged(self, step: int, loss: float) -> None:
        pass

    def finished(self, step: int) -> None:
        pass

    def end(self) -> None:
        pass

    def close(self) -> None:
        pass


def eval_due(cfg, step: int) -> bool:
    """Whether the held-out set is evaluated after ``step``: every ``eval_every`` steps and after the last."""
    return cfg.eval_every > 0 and ((step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1)


class ShardedPeer(NoRecord):
    """A rank other than 0 of a sharded run: it writes nothing, and runs the held-out evaluation's
    forward passes with rank 0, whose all-gathers need every rank of the shard group."""

    def __init__(self, job):
        self.job = job
        self.held_out = workloads.held_out(job.work) if job.cfg.eval_every > 0 else None

    def evaluate(self, step: int) -> None:
        if self.held_out and eval_due(self.job.cfg, step):
            work = self.job.work
            with self.job.measure.not_the_hooks():  # its all-gathers are not a step's
                workloads.evaluate(self.job.model, self.held_out, work.eval_metric, self.job.device, work.loss)


class Rank0Record(NoRecord):
    def __init__(self, job):
        self.job, cfg, folder = job, job.cfg, job.folder
        self.folder = folder
        self.meta = {
            "torch_version": torch.__version__, "python": sys.version.split()[0],
            "backend": job.backend, "world_size": job.world, "device": str(job.device),
            "hook_impl": job.choice.impl, "hook_name": job.choice.name, "hook_reason": job.choice.reason,
            "num_parameters": sum(p.numel() for p in job.model.parameters()),
            "loss": job.loss_source, "sharding": cfg.sharding,
            **({"sharded": job.sharded.record()} if job.sharded else {}),
            "instrumented": cfg.instrument and not job.sharded, "emulated_link": {
                "bandwidth_gbps": cfg.emulate_bandwidth_gbps, "latency_us": cfg.emulate_latency_us}
            if (cfg.emulate_bandwidth_gbps or cfg.emulate_latency_us) else None,
            "checkpoint": job.checkpoint_note, "phases": job.phases, "started_at": time.time()}
        store.write_json(folder.file("meta.json"), self.meta)
        store.write_json(folder.file("layers.json"), [
            # the rule applies where the hook runs it: DDP's buckets, or on HSDP the shards the lab's
            # hook between replicas gets (the rule's rows are those shards: ``worker.setup``)
            {**d.as_dict(), "applies": job.choice.spec.layerwise and (not job.sharded or bool(job.sharded.replica))}
            for d in job.rule.layers])
        self.metrics = store.JsonlWriter(folder.file("metrics.jsonl"))
        self.errors = store.JsonlWriter(folder.file("errors.jsonl"))
        self.pitfalls = None  # made with the first pitfall: most runs have none
        # PowerSGD's memories watched for its pitfalls (rank 0's own: no collective); not in a
        # sharded run, whose memories no DDP bucket layout names.
        spec = job.choice.spec
        self.watch = (pitfalls.Watch(job.choice.state, layerwise=spec.layerwise)
                      if spec.pitfalls and not job.sharded else None)
        # A held-out set drawn once, before the clock starts.
        self.held_out = workloads.held_out(job.work) if cfg.eval_every > 0 else None
        self.evals = store.JsonlWriter(folder.file("evals.jsonl")) if self.held_out else None
        self.layouts: dict[str, list] = {}
        self.timelines: dict[str, dict[str, list]] = {}
        self.unwritten = False  # traced steps not yet in timeline.json
        self.eval_total = 0.0
        self.t_start = time.perf_counter()
        self.last_step: int | None = None
        self.ledger_written = -math.inf

    def step(self, step: int, loss: float, step_s: float, measured) -> None:
        # t: training time since the start; the held-out evaluations are not training
        row = {"step": step, "loss": loss, "step_s": step_s,
               "t": time.perf_counter() - self.t_start - self.eval_total, **measured.row}
        if measured.layout:
            self.layouts["iter0" if step == 0 else "rebuilt"] = measured.layout
            self._write_buckets()
        if measured.errors:
            self.errors.write(measured.errors)
        if measured.grads:
            self.folder.file("grads").mkdir(exist_ok=True)
            torch.save({k: v.cpu() for k, v in measured.grads.items()}, self.folder.file(f"grads/step_{step}.pt"))
        if self.watch:  # backward has returned: every hook future, and so every memory write, is done
            current = self.layouts.get("rebuilt") or self.layouts.get("iter0")
            for found in self.watch.after_step(step, current, measured.layer_errors, math.isfinite(loss)):
                self.pitfalls = self.pitfalls or store.JsonlWriter(self.folder.file(store.PITFALLS))
                self.pitfalls.write(found)
        self.metrics.write(row)
        self.last_step = step
        if time.perf_counter() - self.ledger_written >= LEDGER_EVERY_S:
            self._write_ledger()

    def _write_ledger(self) -> None:
        """ledger.json: rank 0's collectives of the run so far, after its last step recorded."""
        rows = self.job.measure.ledger()
        if rows is None or self.last_step is None:  # instrument off, or no step yet
            return
        cfg = self.job.cfg
        store.write_json(self.folder.file(store.LEDGER), {
            "step": self.last_step, "rank": 0, "world_size": self.job.world, "clock": "host",
            "emulated_link": Link(cfg.emulate_bandwidth_gbps, cfg.emulate_latency_us).on,
            "rows": rows})
        self.ledger_written = time.perf_counter()

    def timeline(self, step: int, gathered: list | None) -> None:
        """Every rank's events of a traced step, kept; timeline.json and trace.json written once
        a window of consecutive traced steps ends (not at each of its steps)."""
        if gathered is None:
            return
        self.timelines[str(step)] = {str(r): events for r, events in enumerate(gathered)}
        self.unwritten = True
        if step + 1 not in self.job.cfg.trace_steps:
            self._write_timeline()

    def _write_timeline(self) -> None:
        if self.unwritten:
            store.write_json(self.folder.file(store.TIMELINE), {
                "steps": self.timelines, "overlap_share": timeline.run_overlap_share(self.timelines)})
            store.write_json(self.folder.file(store.TRACE), timeline.chrome_trace(self.timelines))
            self.unwritten = False

    def evaluate(self, step: int) -> None:
        """On the held-out set every ``eval_every`` steps and after the last, outside the timed
        step (the other ranks wait in the next step's collectives)."""
        if not self.held_out or not eval_due(self.job.cfg, step):
            return
        t_eval = time.perf_counter()
        work = self.job.work
        with self.job.measure.not_the_hooks():  # a sharded run's all-gathers are not a step's
            result = workloads.evaluate(self.job.model, self.held_out, work.eval_metric, self.job.device, work.loss)
        eval_s = time.perf_counter() - t_eval
        self.eval_total += eval_s
        self.evals.write({"step": step, **result, "eval_s": eval_s})

    def memory(self, per_rank: list[dict]) -> None:
        """meta.json again, with what each rank holds of the parameters, gradients and optimizer
        state (bytes, by rank): what sharding divides."""
        self.meta["memory_per_rank"] = per_rank
        store.write_json(self.folder.file("meta.json"), self.meta)

    def diverged(self, step: int, loss: float) -> None:
        why = self.watch.reason() if self.watch else None
        after = f" after {why}" if why else ""
        status_file.record(self.folder.path, RunStatus.DIVERGED, step=step,
                           error=f"loss became {loss} at step {step}{after}; the run was stopped there")

    def finished(self, step: int) -> None:
        lost = self.job.cfg.save_checkpoint and not self.job.save_checkpoint  # no room for it
        note = {"note": f"checkpoint {self.job.checkpoint_note}"} if lost else {}
        status_file.record(self.folder.path, RunStatus.FINISHED, step=step, **note, at=time.time())

    def end(self) -> None:
        """The bucket file again, with DDP's logging data as the run ended; a trace window the
        run ended inside; the ledger as it ended."""
        self._write_timeline()
        self._write_ledger()
        if self.job.cfg.instrument and not self.job.sharded:  # DDP's buckets
            self._write_buckets()

    def close(self) -> None:
        """Every file it opened, closed (also after a failure)."""
        for writer in (self.metrics, self.errors, self.evals, self.pitfalls):
            if writer is not None:
                writer.close()

    def _write_buckets(self) -> None:
        logging = self.job.trained._get_ddp_logging_data()
        store.write_json(self.folder.file("buckets.json"), {
            "bucket_cap_mb": self.job.cfg.bucket_cap_mb, **self.layouts,
            "ddp_logging": {k: logging.get(k) for k in
                            ("bucket_sizes", "rebuilt_bucket_sizes", "has_rebuilt_buckets",
                             "rebuilt_per_bucket_param_indices", "prev_iteration_bucket_param_indices")
                            if k in logging}})
