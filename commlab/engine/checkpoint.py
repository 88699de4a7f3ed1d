"""A run's checkpoint, and resuming a run from it into a new run folder.

When a run finishes (``save_checkpoint``) every rank writes ``checkpoint/rank<k>.pt``: its rank,
the step and the hook's name; rank 0 the model and the optimizer (the same on every rank: each
steps with the same averaged gradients); every rank its own hook state (what the hook's spec
``keeps``: PowerSGD's error memory is a rank's own) and torch's RNG; once all have, rank 0 writes
``checkpoint.json`` (``{"step": last step, "world_size": N, "run": the run's id}``), which says the
checkpoint is complete.  Before the first step the worker checks that the disk has room for it, and says in
meta.json when it will not be saved; a disk that fills while it is written ends the run naming
the file.  Before a resume starts anything, every file is opened and checked (``resume_errors``).  ``commlab run --resume RUN_DIR`` (``resume_config`` + ``launch.start(...,
resume=RUN_DIR)``) starts a new folder whose launch.json names the first (``resumed_from``); its
steps go on from the first run's numbering, and ``steps`` counts from the first run's step 0.

Resuming gives the trajectory of an uninterrupted run, bit for bit, because the resumed run
1. draws and discards the batches the first run trained on (the workload's stream, seeded as
   before), so that it trains on the very batches an uninterrupted run would;
2. restores the hook's whole state (PowerSGD's iteration, error feedback, warm-start P and Q, the
   random generator's state and the statistics; a compressor's memories and generators), and
   torch's RNG;
3. runs one backward pass that synchronises gradients with DDP's own allreduce before it
   registers the hook, and discards those gradients.  PowerSGD keys its memories by bucket index,
   and a new DDP cuts its first iteration's buckets differently from the layout it rebuilds after
   it (the layout every later step of the first run used): restored memories would meet other
   buckets (a wrong result, or a size mismatch).  After that pass DDP has rebuilt its buckets,
   and the first resumed step sees the layout the memories were made in.  This holds for
   commlab's PowerSGD and PyTorch's alike (PyTorch's ``PowerSGDState`` pickles without its
   process group, but a training script that loads it into a fresh DDP meets the first problem).

A sharded run (``sharding`` fsdp or hsdp) saves its model and optimizer through
``torch.distributed.checkpoint``, the ecosystem's format for sharded state, into ``checkpoint/dcp``
(each rank writes its own shards; ``get_state_dict`` names them as the unsharded model would), and
the rest (rank, step, hook state, RNG) in its rank files as above.  Its resume loads them back
into the freshly sharded model and optimizer (``set_state_dict``) and needs no rebuild pass (FSDP
has no buckets), so it runs none: the pass would call the hook between replicas and change its
state.
"""
from __future__ import annotations

import errno
import functools
import itertools
import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from commlab import files, model_io, workloads
from commlab.config import ConfigError, RunConfig
from commlab.engine import run_folder, store
from commlab.hook_specs import SPECS, HookSpec

FOLDER, RECORD = "checkpoint", "checkpoint.json"
SHARDED = "dcp"  # under FOLDER: a sharded run's model and optimizer, torch.distributed.checkpoint's
# The settings a resumed run may change: they decide how long it goes and what is measured or
# recorded, not the values it computes.  Every other setting must stay as the checkpoint's run had it.
FREE = ("steps", "eval_every", "save_checkpoint", "instrument", "error_every", "save_grads_at",
        "stall_timeout_s", "emulate_bandwidth_gbps", "emulate_latency_us", "runs_dir")
def rank_file(run_dir: str | os.PathLike, rank: int) -> Path:
    return Path(run_dir) / FOLDER / f"rank{rank}.pt"


# ---------------------------------------------------------------------------- saving (workers)
def hook_state(state: object, spec: HookSpec) -> dict | None:
    """What the hook's state holds that changes as it runs (its spec's ``checkpoint.keeps``), as tensors and
    numbers (loadable with ``weights_only``); None for a hook that keeps nothing."""
    if not spec.checkpoint.keeps:
        return None
    return {name: _plain(getattr(state, name)) for name in spec.checkpoint.keeps}


def _plain(value):
    """A random generator as its state; anything else as it is."""
    if isinstance(value, np.random.RandomState):
        kind, key, pos, has_gauss, cached = value.get_state()
        return {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    if isinstance(value, torch.Generator):
        return value.get_state()
    return value


def restore_hook_state(state: object, saved: dict | None, device: torch.device | str = "cpu") -> None:
    """The state's fields put back, its memories onto ``device`` (a checkpoint is loaded onto the
    CPU; on NCCL the hook adds them to CUDA tensors)."""
    for name, value in (saved or {}).items():
        current = getattr(state, name)
        if isinstance(current, np.random.RandomState):
            current.set_state((value["kind"], value["key"].numpy().astype(np.uint32), value["pos"],
                               value["has_gauss"], value["cached_gaussian"]))
        elif isinstance(current, torch.Generator):
            current.set_state(value)
        else:
            setattr(state, name, _onto(value, device))


def _onto(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _onto(v, device) for k, v in value.items()}
    return value


def room_needed(model: torch.nn.Module, cfg: RunConfig, world: int) -> int:
    """About the bytes a checkpoint of this run takes, known before its first step: rank 0's
    model and optimizer (Adam keeps two tensors a parameter), and every rank's hook state (at most
    a copy of the gradients: PowerSGD's and the sparsifiers' error feedback)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    per_param = {"sgd": 0, "adam": 2, "adamw": 2}[cfg.optimizer]
    return params * (1 + per_param) + (params * world if SPECS[cfg.hook].checkpoint.keeps else 0)


def room_left(folder: run_folder.RunFolder) -> int:
    return shutil.disk_usage(folder.path).free


def sharded_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / FOLDER / SHARDED


def _sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """A sharded model's and optimizer's state as DCP saves and loads it (each rank its shards)."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def save(folder: run_folder.RunFolder, rank: int, world: int, step: int, model: torch.nn.Module,
         optimizer: torch.optim.Optimizer, state: object, spec: HookSpec, sharded: bool = False) -> None:
    """Every rank calls it after ``step``, the run's last; rank 0 marks the checkpoint complete
    once every rank has written its file (a barrier: no hook is involved).  Each file says whose
    it is (its rank, the ranks and the run that saved it, the step, the hook), so that a resume
    can check it before anything starts.  ``sharded``: the model and optimizer through DCP, every
    rank's shards (a collective).
    A full disk is named (the file, no space left) and leaves no partial file."""
    path = rank_file(folder.path, rank)
    path.parent.mkdir(exist_ok=True)
    saved = {"rank": rank, "world_size": world, "run": folder.id, "step": step, "hook_name": spec.name,
             "hook": hook_state(state, spec), "rng": torch.get_rng_state(), "sharded": sharded}
    if sharded:
        dcp.save(_sharded_state(model, optimizer), checkpoint_id=sharded_dir(folder.path))
    elif rank == 0:
        saved |= {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        torch.save(saved, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        tmp.unlink(missing_ok=True)
        # torch's writer says "unexpected pos" when the disk fills, without an errno.
        if getattr(e, "errno", None) == errno.ENOSPC or room_left(folder) < 2**20:
            raise OSError(errno.ENOSPC, f"no space left on device writing {FOLDER}/{path.name}") from None
        raise
    dist.barrier()
    if rank == 0:
        store.write_json(folder.file(RECORD), {"step": step, "world_size": world, "run": folder.id})


# ---------------------------------------------------------------------------- resuming (workers)
def load(run_dir: str | os.PathLike, rank: int) -> dict:
    """This rank's checkpoint, with rank 0's model and optimizer (a sharded run's are in DCP's
    files: ``load_sharded``)."""
    saved = torch.load(rank_file(run_dir, rank), map_location="cpu", weights_only=True)
    if rank != 0 and not saved.get("sharded"):
        first = torch.load(rank_file(run_dir, 0), map_location="cpu", weights_only=True)
        saved |= {"model": first["model"], "optimizer": first["optimizer"]}
    return saved


def load_sharded(run_dir: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A sharded run's model and optimizer put back from DCP's files (every rank its shards)."""
    state = _sharded_state(model, optimizer)
    dcp.load(state, checkpoint_id=sharded_dir(run_dir))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def continue_batches(ddp: torch.nn.Module, work: workloads.Workload, done: int, device: torch.device,
                     rebuild: bool = True):
    """The workload's batches from step ``done`` on, after DDP has rebuilt its buckets (see the
    module's docstring, 1 and 3): call it before registering the hook.  ``rebuild`` False: no
    pass (a sharded run's)."""
    it = iter(work.batches())
    for _ in range(done):
        next(it)
    batch = next(it)
    if rebuild:
        work.loss_of(ddp, model_io.to_device(batch, device)).backward()
        for p in ddp.parameters():
            p.grad = None
    return itertools.chain([batch], it)


# ---------------------------------------------------------------------------- checking (launcher)
RECORD_KIND = {"step": int, "world_size": int, "run?": str}  # what checkpoint.json must hold


def checkpoint_record(run_dir: str | os.PathLike) -> dict:
    """checkpoint.json of a run folder; {} when it has none (or it is damaged)."""
    return store.read_json(Path(run_dir) / RECORD, {}, RECORD_KIND)


def resume_errors(cfg: RunConfig, run_dir: str | os.PathLike, files: bool = True) -> dict[str, str]:
    """Why ``cfg`` cannot continue the run in ``run_dir``, by field; empty when it can.  With
    ``files`` (as ``launch.prepare`` checks before anything starts) every rank's file is opened
    (``weights_only``) and must be that rank's, of the recorded step, ranks and run (files copied
    in from another run are refused by name: it would train on from that run's model), of this hook with the state
    its spec keeps, and (rank 0's) of a model of this workload's shapes (``file_errors``)."""
    source = run_folder.RunFolder(run_dir)
    if not source.exists():
        return {"resume": f"{run_dir} is not a commlab run folder (no config.json)"}
    try:
        record = store.load_json(Path(run_dir) / RECORD, RECORD_KIND)
    except FileNotFoundError:
        record = None
    except (store.Damaged, OSError) as e:
        return {"resume": f"{run_dir}: damaged: {e}"}
    if not record:
        return {"resume": f"{run_dir} has no complete checkpoint: a run saves one when it finishes "
                          f"with save_checkpoint on (this one is {source.status()})"}
    old = source.config().to_dict()  # a setting newer than the run: what the run did without it
    errors = {name: f"must stay {old.get(name)!r} as in the run resumed ({source.id}), got "
                    f"{value!r}: the checkpoint holds the state of that setting's run (only "
                    f"{', '.join(FREE)} may change)"
              for name, value in cfg.to_dict().items() if name not in FREE and old.get(name) != value}
    spec = SPECS.get(cfg.hook)
    if spec is not None and spec.checkpoint.not_resumable:
        errors.setdefault("hook", f"{cfg.hook} cannot be resumed yet: {spec.checkpoint.not_resumable}")
    done = record["step"] + 1
    if cfg.steps <= done:
        errors["steps"] = (f"must be more than the {done} steps the checkpoint holds, got "
                           f"{cfg.steps}: a resumed run's steps count from the first run's step 0")
    if files and not errors:
        why = file_errors(cfg, Path(run_dir), record)
        if why:
            errors["resume"] = f"{run_dir}: {why}; nothing was started"
    return errors


def file_errors(cfg: RunConfig, run_dir: Path, record: dict) -> str | None:
    """Why the checkpoint's files cannot continue ``cfg``: the first thing that does not fit.
    Asked twice of the same files (``resume_config``, then ``launch.prepare``), it opens them and
    builds the workload's model once."""
    stamp = tuple(map(_stamp, sorted((run_dir / FOLDER).glob("rank*.pt"))))
    return _file_errors(cfg.to_json(), str(run_dir.resolve()), json.dumps(record), stamp)


def _stamp(path: Path) -> tuple:
    """A file's name, size and time as the cache's key; its name alone when it cannot be stat'ed
    (a symlink to nothing: the check calls it missing)."""
    try:
        st = path.stat()
    except OSError:
        return (path.name,)
    return path.name, st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=8)
def _file_errors(cfg_json: str, run_dir: str, record_json: str, stamp: tuple) -> str | None:
    cfg, run_dir, record = RunConfig.from_json(cfg_json), Path(run_dir), json.loads(record_json)
    if record["world_size"] != cfg.world_size:
        return (f"{RECORD} holds {record['world_size']} ranks' files, the run has {cfg.world_size} "
                "ranks: a checkpoint continues on as many ranks as saved it")
    spec = SPECS[cfg.hook]
    for rank in range(cfg.world_size):
        name, path = f"{FOLDER}/rank{rank}.pt", rank_file(run_dir, rank)
        if not path.exists():
            return f"{name} is missing: the checkpoint is incomplete"
        try:  # a FIFO there would block the command, /dev/zero fill its memory: regular files only
            with files.open_regular(path) as f:
                if not zipfile.is_zipfile(f):  # torch.save writes a zip archive, its index at the end
                    return (f"{name} cannot be read (not a complete zip archive, "
                            f"{os.fstat(f.fileno()).st_size:,} bytes): a truncated file, or not a checkpoint")
                saved = torch.load(files.path_of(f), map_location="cpu", weights_only=True, mmap=True)
        except files.Refused as e:
            return f"{name} cannot be read: {e}, not a checkpoint"
        except Exception as e:  # whatever the file is, it is named and refused
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            return f"{name} cannot be read ({first}): a truncated file, or not a checkpoint"
        if not isinstance(saved, dict) or "step" not in saved:
            return f"{name} is not a commlab checkpoint: it holds {type(saved).__name__}"
        whose = saved.get("rank", 0 if "model" in saved else None)
        if whose != rank and not (whose is None and rank > 0):
            return f"{name} is rank {whose}'s file, not rank {rank}'s: the files were swapped or copied"
        if saved["step"] != record["step"]:
            return f"{name} is of step {saved['step']}, {RECORD} says {record['step']}: files of two checkpoints"
        if saved.get("world_size", record["world_size"]) != record["world_size"]:
            return (f"{name} was saved by a run of {saved['world_size']} ranks, {RECORD} says "
                    f"{record['world_size']}: files of another run's checkpoint")
        if saved.get("run", record.get("run")) != record.get("run", saved.get("run")):
            return (f"{name} was saved by run {saved['run']}, {RECORD} by run {record['run']}: "
                    "files of another run's checkpoint")
        if saved.get("hook_name", cfg.hook) != cfg.hook:
            return (f"{name} was saved by a run of {saved['hook_name']}, this run is {cfg.hook}: the "
                    "hook cannot change on resume")
        kept = sorted(saved.get("hook") or {})
        if "hook_name" not in saved and not kept and spec.checkpoint.keeps:
            return (f"{name} was saved before the lab's checkpoints held {cfg.hook}'s state: resumed, "
                    f"its {', '.join(spec.checkpoint.keeps)} would start over")
        if kept != sorted(spec.checkpoint.keeps):
            holds = f"a state of {', '.join(kept)}" if kept else "no hook state"
            wants = f"{spec.state.attr}'s {', '.join(spec.checkpoint.keeps)}" if spec.checkpoint.keeps else "no state"
            return (f"{name} holds {holds}, and {cfg.hook} keeps {wants}: it was saved by a run "
                    "of another hook")
        if rank == 0 and saved.get("sharded"):
            shapes = _sharded_shapes(run_dir)
            if shapes is None:
                return f"{FOLDER}/{SHARDED} cannot be read: the sharded checkpoint is missing or incomplete"
            why = _model_errors(cfg, shapes)
            if why:
                return f"{FOLDER}/{SHARDED}: {why}"
        elif rank == 0:
            model = saved.get("model")
            why = _model_errors(cfg, {k: tuple(v.shape) for k, v in model.items()}
                                if isinstance(model, dict) else None)
            if why:
                return f"{name}: {why}"
    return None


def _sharded_shapes(run_dir: Path) -> dict[str, tuple] | None:
    """The model's parameter shapes (whole, unsharded) in a sharded checkpoint's metadata; None
    when it cannot be read."""
    try:
        metadata = dcp.FileSystemReader(sharded_dir(run_dir)).read_metadata()
    except Exception:  # whatever is there, it is no readable checkpoint
        return None
    return {key[len("model."):]: tuple(held.size) for key, held in metadata.state_dict_metadata.items()
            if key.startswith("model.") and hasattr(held, "size")}


def _model_errors(cfg: RunConfig, model: dict[str, tuple] | None) -> str | None:
    """Why rank 0's model (its parameters' shapes by name) does not fit the run's workload."""
    from commlab.analysis.rule import named_shapes
    from commlab.engine import workload_probe

    if model is None:
        return "holds no model (rank 0's file holds it)"
    if cfg.workload in workloads.BUILTIN:
        shapes = named_shapes(workloads.load(cfg.workload, 0, cfg.world_size, cfg.batch_size, cfg.seed).model)
    else:
        shapes = workload_probe.shapes(cfg.workload)
    for name, shape in shapes:
        held = model.get(name)
        if held is None or held != tuple(shape):
            got = "no such parameter" if held is None else f"shape {held}"
            return (f"its model is not {cfg.workload}'s: parameter {name} is {tuple(shape)} in "
                    f"{cfg.workload}, {got} in the checkpoint")
    return None


def resume_config(run_dir: str | os.PathLike, **overrides) -> RunConfig:
    """The config that continues the run in ``run_dir``: its own, with ``overrides``; without
    ``steps``, it trains as many steps again.  ConfigError when it cannot continue it."""
    source = run_folder.RunFolder(run_dir)
    errors = resume_errors(source.config() if source.exists() else RunConfig(), run_dir, files=False)
    if "resume" in errors:
        raise ConfigError({"resume": errors["resume"]})
    done = checkpoint_record(run_dir)["step"] + 1
    given = {k: v for k, v in overrides.items() if v is not None}
    cfg = source.config().with_overrides(**{"steps": 2 * done, **given})
    errors = resume_errors(cfg, run_dir)  # the files too, once: refused here before anything starts
    if errors:
        raise ConfigError(errors)
    return cfg
