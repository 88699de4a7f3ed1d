"""One rank's training loop: the program torchrun runs for a commlab run.

    python -m commlab.engine.torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:0 \
        --local-addr 127.0.0.1 -m commlab.engine.worker RUN_DIR

The launcher writes RUN_DIR/config.json and launch.json first; rank 0 alone writes the rest of
the run folder (see ``commlab.engine.store``).  Every rank writes its own traceback if it dies,
with the ranks already gone by then: one that failed because a peer closed the connection names
the rank that died first.  A worker dies with torchrun, which dies with the supervisor.
"""
from __future__ import annotations

import contextlib
import datetime
import math
import os
import sys
import time
import traceback
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from commlab import workloads
from commlab.analysis import timeline
from commlab.analysis.ring import wire_bytes as ring_wire_bytes
from commlab.analysis.rule import apply_rule, named_shapes
from commlab.config import POWERSGD_HOOKS, RunConfig
from commlab.engine import checkpoint, procs, store
from commlab.engine.teardown import end_process_group
from commlab.hooks import comm_thread, pitfalls, registry
from commlab.hooks.instrument import OTHER, CollectiveCounter, HookInstrument, Link, error_feedback_norm


def make_optimizer(cfg: RunConfig, params) -> torch.optim.Optimizer:
    kinds = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    return kinds[cfg.optimizer](params, lr=cfg.lr)


def train(run_dir: Path) -> None:
    folder = store.RunFolder(run_dir)
    cfg = folder.config()
    launch = folder.launch_info()
    backend = launch["backend"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}" if backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # Collectives time out too, as a backstop behind the supervisor, which calls the run
    # stalled first.
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=2 * cfg.stall_timeout_s + 30))

    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    work = workloads.load(cfg.workload, rank, world, cfg.batch_size, cfg.seed)
    torch.manual_seed(cfg.seed * 1000 + rank)  # each rank its own randomness from here on
    resumed_from = launch.get("resumed_from")
    saved = checkpoint.load(resumed_from, rank) if resumed_from else None
    first = saved["step"] + 1 if saved else 0  # a resumed run goes on with the first one's steps
    if saved:
        work.model.load_state_dict(saved["model"])
        torch.set_rng_state(saved["rng"])
    model = work.model.to(device)
    shapes = named_shapes(model)
    names_by_ptr = {p.data_ptr(): n for n, p in model.named_parameters()}
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
              bucket_cap_mb=cfg.bucket_cap_mb)
    choice = registry.choose(cfg, backend)
    rule = apply_rule(shapes, cfg.matrix_approximation_rank, cfg.min_compression_rate)
    counter = instrument = None
    hook = choice.hook
    if cfg.instrument:
        link = Link(cfg.emulate_bandwidth_gbps, cfg.emulate_latency_us)
        counter = CollectiveCounter(link, world).install()
        compressed = {d.name for d in rule.layers if d.compressed} if cfg.hook == "powersgd" else set()
        instrument = hook = HookInstrument(choice.hook, counter, names_by_ptr, compressed, world,
                                           cuda_device=device if device.type == "cuda" else None)
    comm_thread.configure(cfg.overlap)
    batches = work.batches()
    if saved:
        checkpoint.restore_hook_state(choice.state, saved["hook"])
        batches = checkpoint.continue_batches(ddp, batches, first, device)  # before the hook
    ddp.register_comm_hook(choice.state, hook)
    optimizer = make_optimizer(cfg, ddp.parameters())
    if saved:
        optimizer.load_state_dict(saved["optimizer"])

    writer = errors_out = None
    if rank == 0:
        store.write_json(folder.file("meta.json"), {
            "torch_version": torch.__version__, "python": sys.version.split()[0],
            "backend": backend, "world_size": world, "device": str(device),
            "hook_impl": choice.impl, "hook_name": choice.name, "hook_reason": choice.reason,
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "instrumented": cfg.instrument, "emulated_link": {
                "bandwidth_gbps": cfg.emulate_bandwidth_gbps, "latency_us": cfg.emulate_latency_us}
            if (cfg.emulate_bandwidth_gbps or cfg.emulate_latency_us) else None,
            "started_at": time.time()})
        store.write_json(folder.file("layers.json"), [
            {**d.as_dict(), "applies": cfg.hook == "powersgd"} for d in rule.layers])
        writer = store.JsonlWriter(folder.file("metrics.jsonl"))
        errors_out = store.JsonlWriter(folder.file("errors.jsonl"))
    # Rank 0 watches PowerSGD's memories for its pitfalls (its own: no collective); the
    # sparsifiers' states keep an error_dict too, but none of PowerSGD's settings.
    watch = (pitfalls.Watch(choice.state, layerwise=cfg.hook == "powersgd")
             if rank == 0 and cfg.hook in POWERSGD_HOOKS else None)
    pitfalls_out = None  # made with the first pitfall: most runs have none
    # Rank 0 alone evaluates, on a held-out set drawn once, before the clock starts.
    held_out = workloads.held_out(work) if rank == 0 and cfg.eval_every > 0 else None
    evals_out = store.JsonlWriter(folder.file("evals.jsonl")) if held_out else None

    layouts: dict[str, list] = {}
    sent_total = plain_total = 0
    eval_total = 0.0
    t_start = time.perf_counter()
    save_at, trace_at = set(cfg.save_grads_at), set(cfg.trace_steps)
    timelines: dict[str, dict[str, list]] = {}
    phase = instrument.phase if instrument else lambda _: contextlib.nullcontext()
    for step in range(first, cfg.steps):
        x, y = next(batches)
        x, y = x.to(device), y.to(device)
        measure = cfg.error_every > 0 and step % cfg.error_every == 0
        if instrument:
            # Iteration 0 shows DDP's first layout, iteration 1 the one it rebuilt after it.
            instrument.begin_step(measure, step in save_at, record_layout=step < 2 or step == first,
                                  trace=step in trace_at)
        profiler = _profiler(device) if cfg.torch_profiler and step in trace_at else None
        t0 = time.perf_counter()
        loss = workloads.loss_fn(ddp(x), y)
        # The mean loss over ranks: every rank then agrees on divergence at the same step.
        # Issued before backward, so that it overlaps it, and before any hook's collective, so
        # that every rank issues it in the same place.
        mean_loss = loss.detach().clone()
        with counter.category(OTHER) if counter else contextlib.nullcontext():
            loss_work = dist.all_reduce(mean_loss, async_op=True)
        optimizer.zero_grad(set_to_none=True)
        with phase("backward"):
            loss.backward()  # DDP waits here for every bucket's hook future
        with phase("optimizer"):
            optimizer.step()
            if choice.averager:  # post-local SGD: its allreduce of the parameters is the hook's traffic
                choice.averager.average_parameters(ddp.parameters())
        loss_work.wait()
        loss_value = mean_loss.item() / world
        step_s = time.perf_counter() - t0
        if profiler:
            profiler.stop()
            folder.file(store.PROFILER).mkdir(exist_ok=True)
            profiler.export_chrome_trace(str(folder.file(f"{store.PROFILER}/step{step}.rank{rank}.json")))
        if instrument and instrument.record.events is not None:
            _gather_timeline(folder if rank == 0 else None, timelines, step, instrument.record.timeline())
        if rank != 0:
            if not math.isfinite(loss_value):
                break
            continue
        # t: training time since the start; rank 0's held-out evaluations are not training
        row = {"step": step, "loss": loss_value, "step_s": step_s,
               "t": time.perf_counter() - t_start - eval_total}
        if instrument:
            nbytes, calls, timing = counter.take()
            rec = instrument.record
            sent_total += nbytes["hook"]
            plain_total += rec.plain_bytes
            row.update({
                "payload_bytes": nbytes["hook"], "wire_bytes": ring_wire_bytes(nbytes["hook"], world),
                "plain_bytes": rec.plain_bytes, "collectives": calls["hook"],
                "compression_ratio": plain_total / sent_total if sent_total else None,
                "hook_s": rec.hook_s, **timing, "measure_bytes": nbytes["measure"],
                "powersgd_iter": getattr(choice.state, "iter", None)})
            if rec.layouts:
                layouts["iter0" if step == 0 else "rebuilt"] = sorted(rec.layouts, key=lambda b: b["index"])
                store.write_json(folder.file("buckets.json"), _bucket_file(layouts, cfg, ddp))
            if measure:
                errors_out.write({"step": step, "measure_bytes": nbytes["measure"],
                                  "buckets": rec.bucket_errors, "layers": rec.layer_errors,
                                  "ef_residual_norm": error_feedback_norm(choice.state)})
            if rec.grads:
                folder.file("grads").mkdir(exist_ok=True)
                torch.save({k: v.cpu() for k, v in rec.grads.items()}, folder.file(f"grads/step_{step}.pt"))
        if watch:  # backward has returned: every hook future, and so every memory write, is done
            current = layouts.get("rebuilt") or layouts.get("iter0")
            for found in watch.after_step(step, current, instrument.record.layer_errors
                                          if instrument and measure else [], math.isfinite(loss_value)):
                pitfalls_out = pitfalls_out or store.JsonlWriter(folder.file(store.PITFALLS))
                pitfalls_out.write(found)
        writer.write(row)
        if not math.isfinite(loss_value):
            why = watch.reason() if watch else None
            store.write_json(folder.file("status.json"), {
                "status": "diverged", "step": step,
                "error": f"loss became {loss_value} at step {step}"
                         + (f" after {why}" if why else "") + "; the run was stopped there"})
            break
        if held_out and ((step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1):
            t_eval = time.perf_counter()  # outside step_s; the other ranks wait in the next step
            result = workloads.evaluate(model, held_out, work.eval_metric, device)
            eval_s = time.perf_counter() - t_eval
            eval_total += eval_s
            evals_out.write({"step": step, **result, "eval_s": eval_s})
    else:
        if cfg.save_checkpoint:
            checkpoint.save(folder, rank, world, cfg.steps - 1, model, optimizer, choice.state)
        if rank == 0:
            store.write_json(folder.file("status.json"), {"status": "finished", "step": cfg.steps - 1})
    if instrument and rank == 0:
        store.write_json(folder.file("buckets.json"), _bucket_file(layouts, cfg, ddp))
    comm_thread.close()  # idle by now: DDP waited for every hook's future
    if counter:
        counter.uninstall()
    del ddp, instrument, hook
    end_process_group()


def _profiler(device: torch.device) -> torch.profiler.profile:
    """torch.profiler over one step, started: the host's operators, on CUDA its kernels too."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities)
    profiler.start()
    return profiler


def _gather_timeline(folder: store.RunFolder | None, timelines: dict, step: int, events: list) -> None:
    """Every rank's timeline of ``step`` to rank 0, which rewrites timeline.json and trace.json.
    Called on every rank at the same step, with no collective in flight."""
    gathered: list = [None] * dist.get_world_size()
    # A collective's completion is noted by a callback that may still be on its way.
    dist.all_gather_object(gathered, [e for e in events if e.get("end") is not None])
    if folder is None:
        return
    timelines[str(step)] = {str(r): ev for r, ev in enumerate(gathered)}
    store.write_json(folder.file(store.TIMELINE), {
        "steps": timelines, "overlap_share": timeline.run_overlap_share(timelines)})
    store.write_json(folder.file(store.TRACE), timeline.chrome_trace(timelines))


def _bucket_file(layouts: dict, cfg: RunConfig, ddp: DDP) -> dict:
    logging = ddp._get_ddp_logging_data()
    return {"bucket_cap_mb": cfg.bucket_cap_mb, **layouts,
            "ddp_logging": {k: logging.get(k) for k in
                            ("bucket_sizes", "rebuilt_bucket_sizes", "has_rebuilt_buckets",
                             "rebuilt_per_bucket_param_indices", "prev_iteration_bucket_param_indices")
                            if k in logging}}


def _ranks_gone(rank: int, world: int) -> list[int]:
    """The other ranks whose processes have ended (torchrun's children, one node)."""
    running = set()
    for p in psutil.Process(os.getppid()).children():
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                running.add(int(p.environ().get("RANK", -1)))
        except (psutil.Error, ValueError):
            pass
    return sorted(set(range(world)) - running - {rank})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0])
    # torchrun starts the workers in sessions of their own, so nothing that ends it ends them:
    # the kernel does.  torchrun itself dies with the supervisor (``procs.spawn(die_with_caller)``).
    procs.die_with_parent(int(os.environ.get(procs.LAUNCHER_ENV, os.getppid())))
    try:
        train(run_dir)
    except BaseException as e:
        if not isinstance(e, KeyboardInterrupt):
            rank = int(os.environ.get("RANK", 0))
            store.write_json(run_dir / f"rank{rank}.error.json", {
                "rank": rank, "time": time.time(), "error": f"{type(e).__name__}: {e}",
                "ranks_gone": _ranks_gone(rank, int(os.environ.get("WORLD_SIZE", 1))),
                "traceback": traceback.format_exc()})
        raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
