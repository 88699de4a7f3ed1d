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
import gc
import itertools
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from commlab import model_io, workloads
from commlab.analysis.rule import RuleSummary, apply_rule, layouts, named_shapes, on_shards
from commlab.analysis.units import human_bytes
from commlab.config import RunConfig
from commlab.engine import checkpoint, procs, run_folder, sharding, store
from commlab.engine.measurement import Measurement, ShardedMeasurement, Unmeasured
from commlab.engine.rank0 import NoRecord, Rank0Record, ShardedPeer
from commlab.engine.teardown import end_process_group
from commlab.hooks import comm_thread, registry
from commlab.seeds import stream_seed

# When this rank reached each phase of its start (wall clock): rank 0 records them in meta.json,
# where benchmarks/startup.py reads them.
PHASES: dict[str, float] = {}
RANK_NAME = "commlab-rank"  # a rank's process name: this, then its global rank


def train(run_dir: Path, rendezvous: dist.Store | None = None) -> None:
    """One run, start to end, in a process group of its own: torchrun's (``env://``), or on warm
    ranks the run's own ``rendezvous`` store (``commlab.engine.pool`` forks a process per run)."""
    folder = run_folder.RunFolder(run_dir)
    # Collectives time out too, as a backstop behind the supervisor, which calls the run stalled first.
    timeout = datetime.timedelta(seconds=2 * folder.config().stall_timeout_s + 30)
    joined = {} if rendezvous is None else {"store": rendezvous, "rank": int(os.environ["RANK"]),
                                            "world_size": int(os.environ["WORLD_SIZE"])}
    dist.init_process_group(folder.launch_info()["backend"], timeout=timeout, **joined)
    PHASES["process_group"] = time.time()
    run(run_dir)
    end_process_group()


def run(run_dir: Path) -> None:
    """One run in the process group this process has joined: setup, the loop, rank 0's record;
    everything it changed in the process undone as it ends (the communication thread closed, the
    collectives' counter removed, its objects dropped)."""
    job = setup(run_dir)
    cfg, measure = job.cfg, job.measure
    record = Rank0Record(job) if job.rank == 0 else ShardedPeer(job) if job.sharded else NoRecord()
    try:
        for step in range(job.first, cfg.steps):
            batch = model_io.to_device(next(job.batches), job.device)
            measure.begin(step)
            with profiled(job, step):
                loss, step_s = train_step(job, batch)
            record.timeline(step, measure.timeline())
            record.step(step, loss, step_s, measure.take(step, job.choice.state))
            if step == job.first:  # the optimizer's state exists from its first step on
                record.memory(memory_per_rank(job))
            if not math.isfinite(loss):  # every rank sees the same mean loss, and stops here
                record.diverged(step, loss)
                break
            record.evaluate(step)
        else:
            if job.save_checkpoint:
                checkpoint.save(job.folder, job.rank, job.world, cfg.steps - 1, job.model,
                                job.optimizer, job.choice.state, job.choice.spec, sharded=bool(job.sharded))
            record.finished(cfg.steps - 1)
        record.end()
    finally:
        record.close()
    comm_thread.close()  # idle by now: DDP waited for every hook's future
    measure.close()
    del job, measure, record  # nothing of Gloo's may outlive its process group
    gc.collect()


def train_step(job: Job, batch) -> tuple[float, float]:
    """One training step, the same on every rank: the loss averaged over the ranks, and its time."""
    t0 = time.perf_counter()
    with job.measure.phase("forward"):  # a sharded run all-gathers each unit here
        loss = job.work.loss_of(job.trained, batch)
    # The mean loss over ranks: every rank then agrees on divergence at the same step.  Issued
    # before backward, so that it overlaps it, and before any hook's collective, so that every
    # rank issues it in the same place.
    mean_loss = loss.detach().clone()
    with job.measure.not_the_hooks():
        loss_work = dist.all_reduce(mean_loss, async_op=True)
    job.optimizer.zero_grad(set_to_none=True)
    with job.measure.phase("backward"):
        loss.backward()  # DDP waits here for every bucket's hook future, FSDP for its reduce-scatters
    with job.measure.phase("optimizer"):
        job.optimizer.step()
    if job.choice.averager:  # post-local SGD's, DiLoCo's: its collectives are the hook's traffic
        with job.measure.phase("averaging"):
            job.choice.averager.average_parameters(job.trained.parameters())
    loss_work.wait()
    return mean_loss.item() / job.world, time.perf_counter() - t0


def memory_per_rank(job: Job) -> list[dict[str, int]]:
    """What every rank holds of the parameters, gradients and optimizer state, in bytes, by rank
    (``sharding.memory_held``): a collective, outside the timed step."""
    gathered: list = [None] * job.world
    with job.measure.not_the_hooks():
        dist.all_gather_object(gathered, sharding.memory_held(job.model, job.optimizer))
    return gathered


@dataclass
class Job:
    """One rank's run, set up: everything the loop and rank 0's record read."""

    cfg: RunConfig
    folder: run_folder.RunFolder
    backend: str
    rank: int
    world: int
    device: torch.device
    work: workloads.Workload
    model: torch.nn.Module
    trained: torch.nn.Module  # what forward and backward run on: DDP's wrapper, or the sharded model
    sharded: sharding.Sharded | None  # how a sharded run's model was sharded; None under DDP
    choice: registry.HookChoice
    rule: RuleSummary
    optimizer: torch.optim.Optimizer
    measure: Unmeasured
    batches: Iterator
    first: int  # the first step: 0, or the step after the checkpoint a resumed run goes on from
    save_checkpoint: bool  # the setting, unless the disk has no room for the checkpoint
    checkpoint_note: str  # what meta.json says of it
    phases: dict  # when this rank reached each phase of its start (``PHASES``)
    loss_source: str  # which loss trains (``model_io.loss_source``): meta.json says it


def setup(run_dir: Path) -> Job:
    """In the process group joined: the workload, DDP (or FSDP2's ``fully_shard``: ``sharding``),
    the hook (measured, unless instrument is off; on a sharded run its collectives counted, and the
    lab's hook between HSDP's replicas measured on the shards, ``ShardProbe``), the optimizer, and a
    resumed run's checkpoint, then the hook registered; and whether the disk has room for the
    checkpoint."""
    folder = run_folder.RunFolder(run_dir)
    cfg, launch = folder.config(), folder.launch_info()
    # what the way of running sets for the ranks (a real link whose netem holds the latency: none in the hooks)
    cfg = replace(cfg, **launch.get("rank_settings", {}))
    backend = launch["backend"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}" if backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    work = workloads.load(cfg.workload, rank, world, cfg.batch_size, cfg.seed)
    torch.manual_seed(stream_seed(cfg.seed, rank))  # each rank its own randomness from here on
    saved = checkpoint.load(launch["resumed_from"], rank) if launch.get("resumed_from") else None
    model = work.model.to(device)
    shapes, held_as = named_shapes(model), layouts(model)
    sharded = sharding.shard(model, cfg, world, device, backend) if cfg.sharding != "ddp" else None
    if sharded and sharded.replica:  # the lab's hook between replicas sees each rank's shards, not the layers
        shapes, held_as = on_shards(shapes, sharded.shards, held_as)
    rule = apply_rule(shapes, cfg.matrix_approximation_rank, cfg.min_compression_rate, held_as)
    trained = model if sharded else DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
                                        bucket_cap_mb=cfg.bucket_cap_mb)
    choice = sharded.choice if sharded else registry.choose(cfg, backend)
    first = saved["step"] + 1 if saved else 0  # a resumed run goes on with the first one's steps
    measure = Unmeasured(choice.hook)
    # the layers (on HSDP with the lab's hook, the shards) whose approximation error is measured
    compressed = {d.name for d in rule.layers if d.compressed} if choice.spec.layerwise else set()
    if cfg.instrument and sharded:
        # DDP's plain allreduce of the whole model, the ruler a sharded run's bytes are read against
        model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # a DTensor's whole
        measure = ShardedMeasurement(cfg, world, sharded, model_bytes, rank, compressed, device)
    elif cfg.instrument:
        names = {p.data_ptr(): n for n, p in model.named_parameters()}
        measure = Measurement(cfg, choice, names, compressed, world, first, device, rank)
    optimizer = make_optimizer(cfg, trained.parameters())
    batches = (resume(saved, trained, optimizer, choice, work, device, launch["resumed_from"] if sharded else None)
               if saved else iter(work.batches()))
    first_batch = next(batches)  # which loss trains is said in meta.json, from the batches' kind
    batches = itertools.chain([first_batch], batches)
    if not sharded:
        trained.register_comm_hook(choice.state, measure.hook)
    save, note = room_for_checkpoint(cfg, folder, model, world)
    PHASES["set_up"] = time.time()
    return Job(cfg, folder, backend, rank, world, device, work, model, trained, sharded, choice, rule,
               optimizer, measure, batches, first, save, note, dict(PHASES),
               model_io.loss_source(first_batch, work.loss))


def room_for_checkpoint(cfg: RunConfig, folder: run_folder.RunFolder, model: torch.nn.Module,
                        world: int) -> tuple[bool, str]:
    """Whether the checkpoint will be saved, said before the first step: rank 0 weighs the room it
    needs against the disk's, and every rank follows (each writes its own file)."""
    decided = [None]
    if dist.get_rank() == 0:
        need, free = checkpoint.room_needed(model, cfg, world), checkpoint.room_left(folder)
        if not cfg.save_checkpoint:
            decided[0] = (False, "off (save_checkpoint)")
        elif need > free:
            decided[0] = (False, f"not saved: it needs about {human_bytes(need)}, and the disk had "
                                 f"{human_bytes(free)} free before the first step")
        else:
            decided[0] = (True, f"saved as the run finishes (about {human_bytes(need)})")
    dist.broadcast_object_list(decided)
    return decided[0]


def resume(saved: dict, trained: torch.nn.Module, optimizer: torch.optim.Optimizer,
           choice: registry.HookChoice, work: workloads.Workload, device: torch.device,
           sharded_from: str | None = None):
    """Everything a checkpoint holds put back, and the batches from its next step on.  Before the
    hook is registered: DDP must first rebuild its buckets with its own allreduce, so that the
    hook's restored memories meet the layout they were made in (``commlab.engine.checkpoint``).
    ``sharded_from``: the run folder whose DCP files hold a sharded run's model and optimizer."""
    if sharded_from:
        checkpoint.load_sharded(sharded_from, trained, optimizer)
    else:
        trained.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    checkpoint.restore_hook_state(choice.state, saved["hook"], device)
    batches = checkpoint.continue_batches(trained, work, saved["step"] + 1, device, rebuild=not sharded_from)
    torch.set_rng_state(saved["rng"])  # after the rebuild pass, whose forward may draw (dropout)
    return batches


def make_optimizer(cfg: RunConfig, params) -> torch.optim.Optimizer:
    kinds = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    return kinds[cfg.optimizer](params, lr=cfg.lr)


@contextlib.contextmanager
def profiled(job: Job, step: int):
    """torch.profiler over a traced step when the settings ask for it (the host's operators, on
    CUDA its kernels too), each rank's Chrome trace written to profiler/; nothing otherwise."""
    if not (job.cfg.torch_profiler and step in job.cfg.trace_steps):
        yield
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if job.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities)
    profiler.start()
    try:
        yield
    finally:
        profiler.stop()
    job.folder.file(store.PROFILER).mkdir(exist_ok=True)
    profiler.export_chrome_trace(str(job.folder.file(f"{store.PROFILER}/step{step}.rank{job.rank}.json")))


def _ranks_gone(rank: int, world: int) -> list[int]:
    """The other ranks of this node whose processes have ended (torchrun's children, or on warm
    ranks the processes they forked for the run): on several nodes, a rank of another node is not
    seen from here."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    first = rank - int(os.environ.get("LOCAL_RANK", 0))
    running = set()
    launcher = int(os.environ.get(procs.LAUNCHER_ENV, os.getppid()))
    for p in psutil.Process(launcher).children(recursive=True):
        try:
            name = p.name()
            if p.status() != psutil.STATUS_ZOMBIE and name.startswith(RANK_NAME):
                running.add(int(name[len(RANK_NAME):]))
        except (psutil.Error, ValueError):
            pass
    return sorted(set(range(first, first + local)) - running - {rank})


def become_rank(parent: int | None = None, name: str = RANK_NAME) -> None:
    """This process as one of the run's ranks: it dies with ``parent`` (torchrun; on warm ranks the
    pool's rank that forked it), and is named for its rank (what ``_ranks_gone`` reads: a forked
    rank's environment, as /proc shows it, is torchrun's)."""
    # torchrun may start the workers in sessions of their own (exec'd ones: it does), so nothing
    # that ends it need end them: the kernel does.  torchrun itself dies with the supervisor
    # (``procs.spawn(die_with_caller)``).
    procs.die_with_parent(parent or int(os.environ.get(procs.LAUNCHER_ENV, os.getppid())))
    procs.set_name(f"{name}{os.environ.get('RANK', '')}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0])
    become_rank()
    PHASES["imported"] = time.time()  # the process started (or forked), torch and the lab imported
    try:
        train(run_dir)
    except BaseException as e:
        report_failure(run_dir, e)
        raise
    return 0


def report_failure(run_dir: Path, e: BaseException) -> None:
    """This rank's traceback into the run folder, with the ranks already gone (the supervisor
    names the rank that failed first); called from the ``except`` that caught ``e``."""
    if not isinstance(e, KeyboardInterrupt):
        rank = int(os.environ.get("RANK", 0))
        store.write_json(run_dir / f"rank{rank}.error.json", {
            "rank": rank, "time": time.time(), "error": f"{type(e).__name__}: {e}",
            "ranks_gone": _ranks_gone(rank, int(os.environ.get("WORLD_SIZE", 1))),
            "traceback": traceback.format_exc()})


if __name__ == "__main__":
    procs.exit_now(main())  # a failure raises out of main: Python reports it and exits 1
