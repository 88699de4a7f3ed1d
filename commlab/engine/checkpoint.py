"""A run's checkpoint, and resuming a run from it into a new run folder.

When a run finishes (``save_checkpoint``) every rank writes ``checkpoint/rank<k>.pt``: rank 0 the
model and the optimizer (the same on every rank: each steps with the same averaged gradients),
every rank its own hook state (PowerSGD's error memory is a rank's own) and torch's RNG; once all
have, rank 0 writes ``checkpoint.json`` (``{"step": last step, "world_size": N}``), which says the
checkpoint is complete.  ``commlab run --resume RUN_DIR`` (``resume_config`` + ``launch.start(...,
resume=RUN_DIR)``) starts a new folder whose launch.json names the first (``resumed_from``); its
steps go on from the first run's numbering, and ``steps`` counts from the first run's step 0.

Resuming gives the trajectory of an uninterrupted run, bit for bit, because the resumed run
1. draws and discards the batches the first run trained on (the workload's stream, seeded as
   before), so that it trains on the very batches an uninterrupted run would;
2. restores PowerSGD's whole state (iteration, error feedback, warm-start P and Q, the random
   generator's state and the statistics), and torch's RNG;
3. runs one backward pass that synchronises gradients with DDP's own allreduce before it
   registers the hook, and discards those gradients.  PowerSGD keys its memories by bucket index,
   and a new DDP cuts its first iteration's buckets differently from the layout it rebuilds after
   it (the layout every later step of the first run used): restored memories would meet other
   buckets (a wrong result, or a size mismatch).  After that pass DDP has rebuilt its buckets,
   and the first resumed step sees the layout the memories were made in.  This holds for
   commlab's PowerSGD and PyTorch's alike (PyTorch's ``PowerSGDState`` pickles without its
   process group, but a training script that loads it into a fresh DDP meets the first problem).
"""
from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

from commlab import workloads
from commlab.config import ConfigError, RunConfig
from commlab.engine import store
from commlab.hook_specs import SPECS

FOLDER, RECORD = "checkpoint", "checkpoint.json"
# The settings a resumed run may change: they decide how long it goes and what is measured or
# recorded, not the values it computes.  Every other setting must stay as the checkpoint's run had it.
FREE = ("steps", "eval_every", "save_checkpoint", "instrument", "error_every", "save_grads_at",
        "stall_timeout_s", "emulate_bandwidth_gbps", "emulate_latency_us", "runs_dir")
# PowerSGDState's fields that change as it runs (the rest are its settings, from the config).
POWERSGD_MUTABLE = ("iter", "error_dict", "p_memory_dict", "q_memory_dict",
                    "total_numel_before_compression", "total_numel_after_compression",
                    "next_stats_report")


def rank_file(run_dir: str | os.PathLike, rank: int) -> Path:
    return Path(run_dir) / FOLDER / f"rank{rank}.pt"


# ---------------------------------------------------------------------------- saving (workers)
def hook_state(state: object) -> dict | None:
    """What a hook's state holds that changes as it runs, as tensors and numbers (loadable with
    ``weights_only``); None for a stateless hook (its state is a process group)."""
    if not isinstance(state, PowerSGDState):
        return None
    kind, key, pos, has_gauss, cached = state.rng.get_state()
    return {**{k: getattr(state, k) for k in POWERSGD_MUTABLE},
            "rng": {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                    "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}


def restore_hook_state(state: object, saved: dict | None) -> None:
    if saved is None:
        return
    for k in POWERSGD_MUTABLE:
        setattr(state, k, saved[k])
    rng = saved["rng"]
    state.rng.set_state((rng["kind"], rng["key"].numpy().astype(np.uint32), rng["pos"],
                         rng["has_gauss"], rng["cached_gaussian"]))


def save(folder: store.RunFolder, rank: int, world: int, step: int, model: torch.nn.Module,
         optimizer: torch.optim.Optimizer, state: object) -> None:
    """Every rank calls it after ``step``, the run's last; rank 0 marks the checkpoint complete
    once every rank has written its file (a barrier: no hook is involved)."""
    path = rank_file(folder.path, rank)
    path.parent.mkdir(exist_ok=True)
    saved = {"step": step, "hook": hook_state(state), "rng": torch.get_rng_state()}
    if rank == 0:
        saved |= {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(saved, tmp)
    os.replace(tmp, path)
    dist.barrier()
    if rank == 0:
        store.write_json(folder.file(RECORD), {"step": step, "world_size": world})


# ---------------------------------------------------------------------------- resuming (workers)
def load(run_dir: str | os.PathLike, rank: int) -> dict:
    """This rank's checkpoint, with rank 0's model and optimizer."""
    saved = torch.load(rank_file(run_dir, rank), map_location="cpu", weights_only=True)
    if rank != 0:
        first = torch.load(rank_file(run_dir, 0), map_location="cpu", weights_only=True)
        saved |= {"model": first["model"], "optimizer": first["optimizer"]}
    return saved


def continue_batches(ddp: torch.nn.Module, batches, done: int, device: torch.device):
    """The batches from step ``done`` on, after DDP has rebuilt its buckets (see the module's
    docstring, 1 and 3): call it before registering the hook."""
    it = iter(batches)
    for _ in range(done):
        next(it)
    x, y = next(it)
    workloads.loss_fn(ddp(x.to(device)), y.to(device)).backward()
    for p in ddp.parameters():
        p.grad = None
    return itertools.chain([(x, y)], it)


# ---------------------------------------------------------------------------- checking (launcher)
def checkpoint_record(run_dir: str | os.PathLike) -> dict:
    """checkpoint.json of a run folder; {} when it has none (or it is damaged)."""
    return store.read_json(Path(run_dir) / RECORD, {})


def resume_errors(cfg: RunConfig, run_dir: str | os.PathLike) -> dict[str, str]:
    """Why ``cfg`` cannot continue the run in ``run_dir``, by field; empty when it can."""
    source = store.RunFolder(run_dir)
    if not source.exists():
        return {"resume": f"{run_dir} is not a commlab run folder (no config.json)"}
    record = checkpoint_record(run_dir)
    if not record or not all(rank_file(run_dir, k).exists() for k in range(record["world_size"])):
        status = source.status()
        return {"resume": f"{run_dir} has no complete checkpoint: a run saves one when it finishes "
                          f"with save_checkpoint on (this one is {status})"}
    old = source.config().to_dict()  # a setting newer than the run: its default
    errors = {name: f"must stay {old.get(name)!r} as in the run resumed ({source.id}), got "
                    f"{value!r}: the checkpoint holds the state of that setting's run (only "
                    f"{', '.join(FREE)} may change)"
              for name, value in cfg.to_dict().items() if name not in FREE and old.get(name) != value}
    spec = SPECS.get(cfg.hook)
    if spec is not None and not spec.resumable:  # its state counts steps this checkpoint lacks
        errors.setdefault("hook", f"{cfg.hook} cannot be resumed yet: the checkpoint holds no "
                                  f"{spec.state.attr} iteration or averager step, so the resumed "
                                  "run would start local SGD over")
    done = record["step"] + 1
    if cfg.steps <= done:
        errors["steps"] = (f"must be more than the {done} steps the checkpoint holds, got "
                           f"{cfg.steps}: a resumed run's steps count from the first run's step 0")
    return errors


def resume_config(run_dir: str | os.PathLike, **overrides) -> RunConfig:
    """The config that continues the run in ``run_dir``: its own, with ``overrides``; without
    ``steps``, it trains as many steps again.  ConfigError when it cannot continue it."""
    source = store.RunFolder(run_dir)
    errors = resume_errors(source.config() if source.exists() else RunConfig(), run_dir)
    if "resume" in errors:
        raise ConfigError({"resume": errors["resume"]})
    done = checkpoint_record(run_dir)["step"] + 1
    given = {k: v for k, v in overrides.items() if v is not None}
    cfg = source.config().with_overrides(**{"steps": 2 * done, **given})
    errors = resume_errors(cfg, run_dir)
    if errors:
        raise ConfigError(errors)
    return cfg
