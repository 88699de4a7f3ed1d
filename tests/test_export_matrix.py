"""Every export run as pasted: format × hook/wrapper × one or several buckets, on two Gloo ranks;
and every sharded (FSDP2, HSDP) export on four, under its own exported one-node torchrun line.

One job runs the whole matrix, launched by the exported several-nodes torchrun line itself, run
as two agents on 127.0.0.1 (two nodes of one process): each plain-DDP and Accelerate snippet (every
hook and wrapper, one bucket and several) and one Lightning snippet per distinct code path, each
pasted as it is into a function of one training script that trains a tiny model for a few steps
inside the one process group (a Lightning snippet is a whole script: it trains its own stand-in
model, of the same layers, with its own ``trainer.fit`` for the run's steps).  The hook is proven to have run by a counter: the training script
wraps ``DistributedDataParallel.register_comm_hook`` so that each registered hook counts its
calls; PowerSGD's state shows it compressed; a compressor's state holds the run's hyperparameters
and counted every step; post-local SGD's replicas drift apart between averagings and are
identical after each (its averager line is the snippet's own, pasted after ``optimizer.step()``);
the exported checkpoint lines save and load every state.  The same workers check that
``from commlab.hooks import ...`` imported none of the lab.

The rest is pure and fast: the text of every cell, the injection cases, exact floats, no path of
this machine in a file, a workload never imported.
"""
from __future__ import annotations

import ast
import dataclasses
import io
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path

import pytest
from script_end import END

from commlab.config import RunConfig
from commlab.hook_specs import HOOKS, SPECS, WHOLE_STATE, WRAPPERS
from commlab.hooks import registry
from commlab.tune import export
from commlab.tune.export import Target
from commlab.tune.export.hook_code import alias

ROOT = Path(__file__).resolve().parents[1]
JOB_TIMEOUT_S = 600
BUCKETS = {"one": 64.0, "several": 0.004}  # MiB: the tiny model below makes 2 buckets at 0.004
STEPS = 4
# Every hook production code can register (the registry's table names its functions), with each
# wrapper the settings allow around it.
CELLS = [(h, w) for h in HOOKS for w in WRAPPERS
         if not export.export_errors(RunConfig(hook=h, wrapper=w))]
# One Lightning snippet per distinct path: commlab's hook with state and a wrapper, PyTorch's
# hook without state, commlab's batched hook, PyTorch's hook with commlab's wrapper, a
# compressor's state, a hook with its own argument bound, post-local SGD's subgroups and averager.
LIGHTNING_CELLS = [("powersgd", "bf16", "several"), ("fp16", "none", "one"),
                   ("batched_powersgd", "none", "several"), ("allreduce", "bf16", "one"),
                   ("dgc", "none", "several"), ("quantize_perchannel", "none", "one"),
                   ("post_localsgd", "none", "several"), ("diloco", "none", "several")]
# The new hooks' settings, none at its default: each must reach the state the snippet builds.
# Local SGD from step 1, averaging at steps 1 and 3 of 4: step 2 is local and not averaged.
HOOK_SETTINGS = dict(start_localSGD_iter=1, averager_warmup_steps=1, averager_period=2,
                     post_local_gradient_allreduce=True, localsgd_subgroup_size=1,
                     compress_ratio=0.25, qsgd_levels=3, sparsify_threshold=5e-4,
                     compressor_momentum=0.5, dgc_clip_norm=1.0, terngrad_clip_sigmas=1.5,
                     sparse_error_feedback=False, quantization_bucket_size=64, seed=3, sync_every=2)
# A compressor state's attribute for each keyword its constructor takes
STATE_ATTRS = {"use_error_feedback": "error_feedback"}
# Every snippet is made for the two-node line that launches them: 2 nodes of 1 process.
NODES = Target(backend="gloo", nnodes=2, nproc_per_node=1, script="train.py")
# The configurations tests/test_export.py ran before this matrix: each setting spelled out reaches
# PowerSGDState (one bucket).
EARLIER = {
    "powersgd_fp16": RunConfig(hook="powersgd", wrapper="fp16", matrix_approximation_rank=2,
                               start_powerSGD_iter=2, min_compression_rate=1.5, random_seed=7,
                               bucket_cap_mb=64.0),
    "powersgd_plain": RunConfig(hook="powersgd", matrix_approximation_rank=1, start_powerSGD_iter=3,
                                use_error_feedback=False, warm_start=False, bucket_cap_mb=64.0),
}


def cfg_for(hook: str, wrapper: str, buckets: str) -> RunConfig:
    return RunConfig(hook=hook, wrapper=wrapper, bucket_cap_mb=BUCKETS[buckets], start_powerSGD_iter=2,
                     steps=STEPS, **HOOK_SETTINGS)


def _uncomment(text: str, starts: str) -> str:
    """The commented code line of ``text`` that begins with ``starts``, as code."""
    (line,) = [ln[4:] for ln in text.splitlines() if ln.startswith("#   " + starts)]
    return line.split("  # ")[0]


def _checkpoint_lines(text: str) -> tuple[str, str]:
    """The exported save and load lines, or two no-ops for a hook without state."""
    lines = [ln[4:].split("  # ")[0] for ln in text.splitlines()
             if ln.startswith("#   ") and ("comm_hook_state" in ln or "localsgd_steps" in ln)]
    return tuple(lines) if lines else ("pass", "pass")


def _after_step(text: str) -> str:
    """The snippet's line for the training loop after optimizer.step(), if it has one."""
    return _uncomment(text, "averager.average_parameters") if "averager = " in text else "pass"


# --------------------------------------------------------------------------- the training script
PRELUDE = '''
import collections, gc, inspect, json, os, sys
# commlab's hooks as a library: PyTorch's names, signatures and state class, none of the lab
from commlab.hooks import (DGCState, PowerSGDState, batched_powerSGD_hook, bf16_compress_hook,
                           bf16_compress_wrapper, powerSGD_hook, quantization_perchannel_hook,
                           quantization_pertensor_hook, topk_hook)
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as _torch_psgd
LIBRARY = {"lab_modules": sorted(m for m in ("streamlit", "plotly", "pandas") if m in sys.modules),
           "same_state": PowerSGDState is _torch_psgd.PowerSGDState,
           "same_signatures": all(inspect.signature(f) == inspect.signature(getattr(_torch_psgd, f.__name__))
                                  for f in (powerSGD_hook, batched_powerSGD_hook))}
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

CALLS = collections.Counter()  # registered hook -> how many buckets it reduced
NAMES = {}
LAST = []  # the DDP models hooks were registered on, last last (Lightning unwraps its own)
_register = DistributedDataParallel.register_comm_hook


def _counting_register(self, state, hook):
    key = id(self)
    NAMES[key] = (hook.__qualname__, hook.__module__)
    LAST.append(self)

    def counted(state, bucket):
        CALLS[key] += 1
        return hook(state, bucket)

    return _register(self, state, counted)


DistributedDataParallel.register_comm_hook = _counting_register


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))


def batches(n):
    g = torch.Generator().manual_seed(dist.get_rank())
    return [torch.randn(16, 32, generator=g) for _ in range(n)]


def loss_of(out, x):
    return nn.functional.cross_entropy(out, x[:, :8].argmax(1))


def replica_diff(module):
    flat = torch.cat([p.detach().flatten() for p in module.parameters()])
    every = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(every, flat)
    return max((t - flat).abs().max().item() for t in every), bool(torch.isfinite(flat).all())


def summary(ddp_model, module, state, averager=None):
    max_diff, finite = replica_diff(module)
    data = ddp_model._get_ddp_logging_data()
    out = {"max_diff": max_diff, "finite": finite, "calls": CALLS[id(ddp_model)],
           "hook": NAMES.get(id(ddp_model), (None, None))[0],
           "module": NAMES.get(id(ddp_model), (None, None))[1], "buckets": len(data.get("rebuilt_bucket_sizes", "").split(","))}
    if state is not None:
        out.update(iter=getattr(state, "iter", None), cls=type(state).__name__)
    if type(state).__name__ == "PowerSGDState":
        out.update(before=state.total_numel_before_compression,
                   after=state.total_numel_after_compression,
                   rank=state.matrix_approximation_rank, start=state.start_powerSGD_iter,
                   ef=state.use_error_feedback, warm=state.warm_start,
                   rate=state.min_compression_rate)
    elif type(state).__name__ == "PostLocalSGDState":
        out.update(start=state.start_localSGD_iter, post_local=state.post_local_gradient_allreduce,
                   subgroup_size=state.subgroup.size())
    elif state is not None:  # a compressor: its hyperparameters
        out["params"] = {k: v for k, v in vars(state).items() if isinstance(v, (bool, int, float))
                         and k != "iter"}
    if averager is state and state is not None:  # DiLoCo's state steps itself
        out.update(cls=type(state).__name__, outer_steps=state.outer_steps, sync_every=state.sync_every)
    elif averager is not None:
        out["averager"] = [averager.period, averager.warmup_steps, averager.step]
    return out


def run_cell(fn):
    import time
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # every rank fails alike at registration; the test reports the cell
        out = {"error": f"{type(e).__name__}: {e}"[:300]}
    return {**out, "seconds": round(time.perf_counter() - t0, 3)}
'''

DDP_CELL = '''
def ddp_{i}():
    model = tiny()
{ddp_line}
{snippet}
    state, averager = locals().get("state"), locals().get("averager")
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.05)
    diffs = []
    for x in batches({steps}):
        opt.zero_grad()
        loss_of(ddp_model(x), x).backward()
        opt.step()
        {after_step}
        diffs.append(replica_diff(model)[0])
    out = {{**summary(ddp_model, model, state, averager), "diffs": diffs}}
    if state is not None and hasattr(state, "iter"):  # a state that counts steps is checkpointed
        os.makedirs(f"rank{{dist.get_rank()}}", exist_ok=True)
        os.chdir(f"rank{{dist.get_rank()}}")
        {save}
        state.iter = -1
        if averager is not None:
            averager.step = -1
        {load}
        os.chdir("..")
        out["resumed_iter"], out["resumed_cls"] = state.iter, type(state).__name__
        if averager is not None:
            out["resumed_averager_step"] = averager.step
    return out
'''

ACCELERATE_CELL = '''
def accelerate_{i}():
    model = tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
{snippet}
    state, averager = locals().get("state"), locals().get("averager")
    diffs = []
    for x in batches({steps}):
        optimizer.zero_grad()
        accelerator.backward(loss_of(model(x), x))
        optimizer.step()
        {after_step}
        diffs.append(replica_diff(model.module)[0])
    out = {{**summary(model, model.module, state, averager), "diffs": diffs}}
    out["distributed_type"] = str(accelerator.distributed_type)
    return out
'''

LIGHTNING_CELL = '''
def lightning_{i}():
{snippet}
    # The snippet trained its stand-in model with trainer.fit under __main__, for the run's steps.
    state = locals().get("state")
    module = trainer.lightning_module
    # Post-local SGD's averager is Lightning's; DiLoCo's state steps itself (the export's callback).
    averager = trainer.strategy._model_averager or (state if hasattr(state, "outer_steps") else None)
    return summary(LAST[-1], module, state, averager)
'''

EPILOGUE = '''
if __name__ == "__main__":
    cells = {names}
    results = {{name: run_cell(fn) for name, fn in cells.items()}}
    results["library"] = LIBRARY
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f)
    gc.collect()  # DDP models gone before the group: Gloo can abort at exit otherwise
    if dist.is_initialized():
        dist.destroy_process_group()
'''


def _indent(text: str) -> str:
    return textwrap.indent(text, "    ")


def matrix_script() -> tuple[str, dict[str, tuple]]:
    """The training script and what each of its cells is: name -> (format, hook, wrapper, buckets)."""
    parts, cells = [PRELUDE, "dist.init_process_group('gloo')\n"], {}
    for hook, wrapper in CELLS:
        for buckets in BUCKETS:
            cfg = cfg_for(hook, wrapper, buckets)
            i = len(cells)
            text = export.render(cfg, "ddp", NODES).text
            save, load = _checkpoint_lines(text)
            parts.append(DDP_CELL.format(i=i, ddp_line=_indent(_uncomment(text, "ddp_model =")),
                                         snippet=_indent(text), steps=STEPS, save=save, load=load,
                                         after_step=_after_step(text)))
            cells[f"ddp_{i}"] = ("ddp", hook, wrapper, buckets)
            text = export.render(cfg, "accelerate", NODES).text
            parts.append(ACCELERATE_CELL.format(i=i, snippet=_indent(text), steps=STEPS,
                                                after_step=_after_step(text)))
            cells[f"accelerate_{i}"] = ("accelerate", hook, wrapper, buckets)
    for name, cfg in EARLIER.items():
        text = export.render(cfg, "ddp", NODES).text
        save, load = _checkpoint_lines(text)
        parts.append(DDP_CELL.format(i=f"earlier_{name}", ddp_line=_indent(_uncomment(text, "ddp_model =")),
                                     snippet=_indent(text), steps=STEPS, save=save, load=load,
                                     after_step="pass"))
        cells[f"ddp_earlier_{name}"] = ("ddp", cfg.hook, cfg.wrapper, "one")
    for hook, wrapper, buckets in LIGHTNING_CELLS:
        i = len(cells)
        text = export.render(cfg_for(hook, wrapper, buckets), "lightning", NODES).text
        parts.append(LIGHTNING_CELL.format(i=i, snippet=_indent(text), steps=STEPS))
        cells[f"lightning_{i}"] = ("lightning", hook, wrapper, buckets)
    parts.append(EPILOGUE.format(names="{" + ", ".join(f"{n!r}: {n}" for n in cells) + "}") + END)
    return "\n".join(parts), cells


def _bash_torchrun(extra: str = "") -> str:
    """A ``torchrun`` for the exported lines: commlab's, whose stores listen on loopback only."""
    return (f'torchrun() {{ {sys.executable} -m commlab.engine.torchrun --local-addr 127.0.0.1 '
            f'--max-restarts 0 {extra} "$@"; }}\n')


def _env() -> dict:
    return {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1",
            "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}


def _several_nodes_line(text: str) -> str:
    return text.split(export.HEAD_NODE_CHECK)[-1] if export.HEAD_NODE_CHECK in text else \
        text.split("every node reaches.\n")[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_agents(line: str, cwd: Path) -> list[tuple[int, str]]:
    """The exported several-nodes line run as two agents on this machine: (exit code, log) each.
    Both agents match the endpoint's host here, so each is told whether it serves the store."""
    agents = []
    for i, is_host in enumerate((1, 0)):
        log = open(cwd / f"agent{i}.log", "w")
        agents.append((subprocess.Popen(["bash", "-c", _bash_torchrun(f"--rdzv-conf is_host={is_host}")
                                         + "export OMP_NUM_THREADS=1\n" + line],
                                        stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=cwd,
                                        start_new_session=True), log))
    try:
        for proc, _ in agents:
            proc.wait(timeout=JOB_TIMEOUT_S)
    finally:
        for proc, log in agents:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
    return [(proc.returncode, (cwd / f"agent{i}.log").read_text()) for i, (proc, _) in enumerate(agents)]


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_every_snippet_runs_as_pasted_under_the_two_node_torchrun_line(tmp_path):

    script, cells = matrix_script()
    (tmp_path / "train.py").write_text(script)
    out = tmp_path / "out.json"
    launch = export.render(cfg_for("post_localsgd", "none", "several"), "torchrun",
                           dataclasses.replace(NODES, rdzv_endpoint=f"127.0.0.1:{_free_port()}",
                                               script_args=[str(out)])).text
    ended = _two_agents(_several_nodes_line(launch), tmp_path)
    assert [rc for rc, _ in ended] == [0, 0], "\n".join(log[-4000:] for _, log in ended)
    results = json.loads(out.read_text())
    assert results.pop("library") == {"lab_modules": [], "same_state": True, "same_signatures": True}
    for name, (fmt, hook, wrapper, buckets) in cells.items():
        r = results[name]
        cfg = cfg_for(hook, wrapper, buckets)
        assert "error" not in r, (name, cells[name], r)
        assert r["buckets"] == (1 if buckets == "one" else 2), (name, r)
        assert r["finite"], (name, r)
        if fmt == "accelerate":
            assert r["distributed_type"] == "DistributedType.MULTI_CPU"
            if (hook, wrapper) == ("allreduce", "none"):
                assert r["calls"] == 0  # comm_hook=NO: DDP's own allreduce, no hook registered
                continue
        # The exported hook ran for every bucket of every step (the first step has one bucket).
        assert r["calls"] == 1 + (STEPS - 1) * r["buckets"], (name, r)
        if hook == "noop":
            assert r["max_diff"] > 0  # noop averages nothing: the replicas drift apart
        else:
            assert r["max_diff"] < 1e-5, (name, r)
        last = export.choices(RunConfig(hook=hook, wrapper=wrapper), "gloo")[-1]
        attr = last.piece.attr
        if fmt == "accelerate" and hook == "allreduce" and not last.commlab:
            attr = f"{wrapper}_compress_hook"  # wrapper(allreduce_hook) said as the compress hook
        assert attr in r["hook"], (name, r["hook"])  # the outer piece is the right one
        if registry.hook_args(cfg):  # the snippet's own function, binding the run's arguments
            assert r["module"] == "__main__" and "<locals>" in r["hook"], (name, r)
        else:
            assert r["module"].startswith("commlab.hooks") == last.commlab, (name, r["module"])
        if hook in ("powersgd", "batched_powersgd"):
            assert r["iter"] == STEPS and r["after"] < r["before"], (name, r)  # it compressed
        if SPECS[hook].variant == "commlab.hooks.compressors":
            made = SPECS[hook].state
            expected = {STATE_ATTRS.get(k, k): v for k, v in made.kwargs(cfg).items() if k != "random_seed"}
            assert r["cls"] == made.attr and r["iter"] == STEPS, (name, r)
            assert {k: r["params"][k] for k in expected} == expected, (name, r["params"])
            assert r["params"]["random_seed"] == cfg.seed
        if hook == "post_localsgd":
            # PostLocalSGDState counts steps only until local SGD starts
            assert (r["cls"], r["iter"], r["start"], r["post_local"], r["subgroup_size"]) == (
                "PostLocalSGDState", min(STEPS, cfg.start_localSGD_iter), cfg.start_localSGD_iter,
                cfg.post_local_gradient_allreduce, cfg.localsgd_subgroup_size), (name, r)
            assert r["averager"] == [cfg.averager_period, cfg.averager_warmup_steps, STEPS], (name, r)
            if fmt != "lightning":  # replicas apart after a local step, the same after averaging
                averaged = [i >= cfg.averager_warmup_steps and
                            (i - cfg.averager_warmup_steps) % cfg.averager_period == 0
                            for i in range(STEPS)]
                assert [d < 1e-5 for d in r["diffs"]] == [
                    a or i < cfg.start_localSGD_iter for i, a in enumerate(averaged)], (name, r)
                assert not all(averaged), "no local step was left unaveraged"
        if hook == "diloco":  # replicas apart after a local step, the same after each outer step
            assert (r["cls"], r["sync_every"], r["outer_steps"]) == ("DiLoCoState", 2, STEPS // 2), (name, r)
            if fmt != "lightning":  # (Lightning's: the same at the end, max_diff above)
                assert [d < 1e-5 for d in r["diffs"]] == [(i + 1) % 2 == 0 for i in range(STEPS)], (name, r)
        if fmt == "ddp" and "resumed_iter" in r:  # the exported checkpoint lines saved and loaded it
            assert (r["resumed_iter"], r["resumed_cls"]) == (r["iter"], r["cls"]), (name, r)
            if hook == "post_localsgd":
                assert r["resumed_averager_step"] == STEPS
    for name, cfg in EARLIER.items():  # the settings each snippet spells out reach the state
        r = results[f"ddp_earlier_{name}"]
        assert r["finite"] and "error" not in r, r
        if cfg.hook in ("powersgd", "batched_powersgd"):
            assert (r["rank"], r["start"], r["ef"], r["warm"], r["rate"]) == (
                cfg.matrix_approximation_rank, cfg.start_powerSGD_iter, cfg.use_error_feedback,
                cfg.warm_start, cfg.min_compression_rate)
            assert r["iter"] == STEPS and r["after"] < r["before"]
    seconds = {name: results[name]["seconds"] for name in results}
    print(f"\ncells: {len(results)}, seconds in cells: {sum(seconds.values()):.1f}", seconds)


# --------------------------------------------------------------------------- FSDP2 and HSDP, 4 ranks
# Every sharded export (``--format fsdp``): the lab's hook between HSDP's replicas for each hook with
# a sharded form, native HSDP, and FSDP alone in bf16 without resharding; each pasted as it is into
# one training script launched by the exported one-node torchrun line on 4 Gloo ranks.
FSDP_CELLS = [dict(sharding="hsdp", hook="powersgd"), dict(sharding="hsdp", hook="fp16"),
              dict(sharding="hsdp", hook="bf16"), dict(sharding="hsdp", hook="allreduce"),
              dict(sharding="fsdp", reduce_dtype="bf16", reshard_after_forward=False)]
FSDP_RANKS = 4
FSDP_NODE = Target(backend="gloo", nproc_per_node=FSDP_RANKS, script="train.py")

FSDP_PRELUDE = '''
import json, sys
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
# the replica hook and PowerSGD's state as a library, none of the lab
from commlab.hooks import PowerSGDState, ReplicaAllReduce
LIBRARY = {"lab_modules": sorted(m for m in ("streamlit", "plotly", "pandas", "commlab.engine") if m in sys.modules),
           "replica_hook": ReplicaAllReduce.__module__}


def tiny():  # three units: fully_shard on each, then on the root
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))


def batches(n):
    g = torch.Generator().manual_seed(dist.get_rank())
    return [torch.randn(16, 32, generator=g) for _ in range(n)]


def shards(model):
    """This rank's shard of every parameter, and whether the replicas of each shard hold the same."""
    local = torch.cat([(p.to_local() if isinstance(p, DTensor) else p).detach().flatten() for p in model.parameters()])
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, local)
    return every


def run_cell(fn):
    try:
        return fn()
    except Exception as e:  # every rank fails alike; the test reports the cell
        return {"error": f"{type(e).__name__}: {e}"[:300]}
'''

FSDP_CELL = '''
def fsdp_{i}():
    model = tiny()
{snippet}
    state, hook = locals().get("state"), locals().get("replicas_hook")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, calls = [], 0
    for x in batches({steps}):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), x[:, :8].argmax(1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if hook is not None:
            calls += len(hook.take()[0])  # one call per unit and step
    out = {{"losses": losses, "calls": calls, "mesh": list(model.parameters())[0].device_mesh.shape,
           "shards": [t.numel() for t in shards(model)], "every": [t.tolist() for t in shards(model)]}}
    if state is not None and hasattr(state, "iter"):
        out.update(iter=state.iter, before=state.total_numel_before_compression,
                   after=state.total_numel_after_compression)
    return out
'''


FSDP_EPILOGUE = '''
if __name__ == "__main__":
    results = {{"cells": [run_cell(fn) for fn in ({names})], "library": LIBRARY}}
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
'''
TINY_NUMEL = 32 * 64 + 64 + 64 * 64 + 64 + 64 * 8 + 8  # the script's model, which the shards add up to


def fsdp_cfg(settings: dict) -> RunConfig:
    return RunConfig(world_size=FSDP_RANKS, start_powerSGD_iter=2, steps=STEPS, **settings)


def fsdp_script() -> str:
    parts = [FSDP_PRELUDE, "dist.init_process_group('gloo')\n"]
    for i, settings in enumerate(FSDP_CELLS):
        text = export.render(fsdp_cfg(settings), "fsdp", FSDP_NODE).text
        parts.append(FSDP_CELL.format(i=i, snippet=_indent(text), steps=STEPS))
    names = ", ".join(f"fsdp_{i}" for i in range(len(FSDP_CELLS)))
    parts.append(FSDP_EPILOGUE.format(names=names) + END)
    return "\n".join(parts)


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_every_fsdp_export_runs_as_pasted_under_its_torchrun_line_on_4_gloo_ranks(tmp_path):
    (tmp_path / "train.py").write_text(fsdp_script())
    out = tmp_path / "out.json"
    launch = export.render(fsdp_cfg(FSDP_CELLS[0]), "torchrun",
                           dataclasses.replace(FSDP_NODE, script_args=[str(out)])).text
    one_node = launch.split("# One node")[1].split("\n\n")[0].split("\n", 1)[1]  # the line under it
    assert "--nproc-per-node 4" in one_node and "--standalone" in one_node
    log = tmp_path / "torchrun.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(["bash", "-c", _bash_torchrun() + "export OMP_NUM_THREADS=1\n" + one_node],
                                stdout=f, stderr=subprocess.STDOUT, env=_env(), cwd=tmp_path, start_new_session=True)
        try:
            proc.wait(timeout=JOB_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, log.read_text()[-4000:]
    results = json.loads(out.read_text())
    assert results["library"] == {"lab_modules": [], "replica_hook": "commlab.hooks.replica"}
    for settings, r in zip(FSDP_CELLS, results["cells"]):
        assert "error" not in r, (settings, r)
        assert len(r["losses"]) == STEPS and all(map(math.isfinite, r["losses"])), (settings, r)
        every = r["every"]
        native = settings.get("hook", "allreduce") == "allreduce"  # FSDP's own all-reduce between replicas
        if settings["sharding"] == "hsdp":  # 2 replicas of 2 shards: the replicas of a shard agree
            # native HSDP shards on the 2-D mesh; the lab's on its 'shard' dimension, the hook on the other
            assert r["mesh"] == ([2, 2] if native else [2]) and r["shards"][:2] == r["shards"][2:], (settings, r)
            assert sum(r["shards"][:2]) == TINY_NUMEL, (settings, r)
            assert max(abs(a - b) for a, b in zip(every[0], every[2])) < 1e-6, settings
            assert max(abs(a - b) for a, b in zip(every[1], every[3])) < 1e-6, settings
        else:  # one shard group of 4
            assert r["mesh"] == [FSDP_RANKS] and sum(r["shards"]) == TINY_NUMEL, (settings, r)
        # the lab's hook between replicas ran on each of the 3 units at every step; FSDP's own none
        assert r["calls"] == (0 if native else 3 * STEPS), (settings, r)
        if settings.get("hook") == "powersgd":
            assert r["iter"] == STEPS and r["after"] < r["before"], r  # it compressed from step 2


# --------------------------------------------------------------------------- the text of every cell
@pytest.mark.parametrize("fmt", ["ddp", "lightning", "accelerate"])
@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_every_cell_uses_commlabs_piece_exactly_where_pytorchs_fails(fmt, backend):
    for hook, wrapper in CELLS:
        cfg = cfg_for(hook, wrapper, "several")
        text = export.render(cfg, fmt, Target(backend=backend)).text
        compile(text, "<snippet>", "exec")
        (line,) = [ln for ln in text.splitlines() if ln.startswith("# Hooks: ")]
        for piece in registry.pieces(hook, wrapper, backend):
            ours = piece.module is None or bool(piece.fails)  # PyTorch has none, or it fails
            assert (f"commlab's {piece.attr}" in line) == ours, (hook, wrapper, line)
            assert (f"commlab_hooks.{piece.attr}" in text) == ours, text
            if "DDPCommunicationHookType." not in text and piece.module:  # else Accelerate names PyTorch's
                assert (f"{alias(piece.module)}.{piece.attr}" in text) == (not ours), text
        assert ("AnyDeviceDDPStrategy" in text) == (fmt == "lightning" and (
            backend == "gloo" or hook == "post_localsgd"))
        assert ("cpu=True" in text) == (fmt == "accelerate" and backend == "gloo")
        assert "impl=" not in text and "impl=" not in " ".join(export.notes(cfg, Target(backend=backend)))
        assert ("comm_hook_state" in text) == (SPECS[hook].checkpoint.holds == WHOLE_STATE)
        assert ("localsgd" in text) == (hook == "post_localsgd") and "Checkpoint" in text


def test_every_hook_the_exports_name_exists():
    import importlib

    for hook, wrapper in CELLS:
        for backend in registry.BACKENDS:
            for c in export.choices(RunConfig(hook=hook, wrapper=wrapper), backend):
                assert hasattr(importlib.import_module(c.module), c.piece.attr), c


def test_accelerate_launch_lines_start_n_processes_and_name_every_multi_node_argument():
    cfg = RunConfig(hook="fp16", world_size=4)
    cpu = export.render(cfg, "accelerate", Target(backend="gloo", nnodes=2)).text
    assert "#   torchrun --standalone --nnodes 1 --nproc-per-node 4 train.py\n" in cpu
    assert '--nnodes 2 --nproc-per-node 4 --rdzv-id commlab --rdzv-backend c10d --rdzv-endpoint ' \
           '"$HEAD_NODE:29500" train.py' in cpu
    gpu = export.render(cfg, "accelerate", Target(backend="nccl", nnodes=3,
                                                  rdzv_endpoint="10.0.0.1:29400")).text
    line = _uncomment(gpu, "accelerate launch")
    assert line == ('accelerate launch --multi_gpu --num_machines 3 --num_processes 12 --machine_rank '
                    '"$NODE_RANK" --main_process_ip 10.0.0.1 --main_process_port 29400 train.py')
    assert "--machine_rank" not in export.render(cfg, "accelerate", Target(backend="nccl")).text


def test_accelerate_parses_the_exported_gpu_launch_line():
    from accelerate.commands.launch import launch_command_parser

    text = export.render(RunConfig(hook="fp16"), "accelerate", Target(backend="nccl", nnodes=2)).text
    words = _uncomment(text, "accelerate launch").replace('"$NODE_RANK"', "1") \
        .replace('"$HEAD_NODE"', "10.0.0.1").split()[2:]
    args = launch_command_parser().parse_args(words)
    assert (args.num_machines, args.machine_rank, args.main_process_ip, args.main_process_port,
            args.multi_gpu) == (2, 1, "10.0.0.1", 29500, True)


def test_launch_lines_set_threads_cpus_and_document_the_port():
    target = Target(backend="gloo", nnodes=2, nproc_per_node=4, threads_per_process=3)
    slurm = export.render(RunConfig(), "slurm", target).text
    assert "#SBATCH --cpus-per-task=12\n" in slurm and "export OMP_NUM_THREADS=3\n" in slurm
    torchrun = export.render(RunConfig(), "torchrun", target).text
    assert "export OMP_NUM_THREADS=3\n" in torchrun and export.PORT_NOTE.split(":")[0] in torchrun
    with pytest.raises(ValueError, match="threads_per_process"):
        export.render(RunConfig(), "slurm", Target(threads_per_process=0))


# --------------------------------------------------------------------------- safe and exact text
NASTY = ["a\nimport os; os.system('touch PWNED')", "x'); import os #", 'q"""\n""";x=1', "$(touch PWNED)",
         "`touch PWNED`", "a\rb", "u\u2028v\x85w", "back\\slash\\", "run\n#SBATCH --evil"]


def _python_marker_positions(text: str) -> None:
    """Every Python snippet: the only code is the export's own (no marker outside a comment or
    string), and it still compiles."""
    compile(text, "<snippet>", "exec")
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            assert "PWNED" not in tok.string and "evil" not in tok.string, tok
    # each comment line stayed one line: no statement the export did not write
    names = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}
    assert "os" not in names and "x" not in names


@pytest.mark.parametrize("nasty", NASTY)
def test_no_user_string_leaves_a_comment_or_literal_in_python(nasty):
    cfg = RunConfig(hook="powersgd", wrapper="fp16")
    for backend in registry.BACKENDS:
        target = Target(backend=backend, nnodes=2, script=nasty, script_args=[nasty, "--x", nasty],
                        rdzv_endpoint=nasty + ":1")
        for fmt in ("ddp", "lightning", "accelerate", "trainer"):
            _python_marker_positions(export.render(cfg, fmt, target, source=nasty).text)


@pytest.mark.slow
def test_no_user_string_runs_in_the_shell_and_every_one_arrives_intact(tmp_path):
    target = Target(backend="gloo", nnodes=2, script=NASTY[0], script_args=NASTY,
                    rdzv_endpoint=NASTY[3] + ":1")
    fake = 'torchrun() { printf "%s\\0" "$@"; printf "\\n"; }\nscontrol() { echo node7; }\n'
    for fmt in ("torchrun", "slurm"):
        text = export.render(RunConfig(hook="powersgd"), fmt, target, source=NASTY[1]).text
        body = fake + text.replace("srun torchrun", "torchrun")
        proc = subprocess.run(["bash", "-c", body], capture_output=True, cwd=tmp_path,
                              env={**os.environ, "LANG": "C.UTF-8", "SLURM_NNODES": "2",
                                   "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "x", "HEAD_NODE": "h"},
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert not (tmp_path / "PWNED").exists()
        # bytes: a text-mode pipe would turn the \r of an argument into \n
        runs = [r.decode().split("\0") for r in proc.stdout.split(b"\0\n") if r]
        assert len(runs) == (2 if fmt == "torchrun" else 1)
        for argv in runs:
            assert argv[-len(NASTY) - 1:] == [NASTY[0], *NASTY], (fmt, argv)
        if fmt == "torchrun":
            assert runs[1][runs[1].index("--rdzv-endpoint") + 1] == NASTY[3] + ":1"
    for fmt in ("ddp", "lightning", "accelerate", "trainer"):  # the launch comments of the Python exports
        text = export.render(RunConfig(), fmt, target).text
        assert all(ln.startswith("#") or not re.search("PWNED|evil", ln) for ln in text.splitlines())


def test_floats_are_exact_and_no_file_names_a_path_of_this_machine(tmp_path):
    cfg = RunConfig(hook="powersgd", bucket_cap_mb=0.1 + 0.2, min_compression_rate=1.0000001,
                    orthogonalization_epsilon=1e-300, runs_dir=str(tmp_path / "my runs"))
    for fmt in ("ddp", "lightning", "accelerate", "trainer"):
        text = export.render(cfg, fmt, Target()).text
        assert "bucket_cap_mb=0.30000000000000004" in text, fmt
        assert "min_compression_rate=1.0000001" in text and "1e-300" in text
    for fmt in export.FORMATS:
        text = export.render(cfg, fmt, Target()).text
        assert str(tmp_path) not in text and "runs_dir" not in text, fmt
    back = RunConfig.from_json(export.render(cfg, "json").text)
    assert back.bucket_cap_mb == cfg.bucket_cap_mb and back.runs_dir == RunConfig().runs_dir


def test_every_hook_is_a_cell():
    assert {h for h, _ in CELLS} == set(HOOKS)


def test_export_never_imports_the_workload():
    cfg = RunConfig(hook="powersgd", workload="no_such_package_here:make")
    assert not export.export_errors(cfg)
    for fmt in export.FORMATS:
        export.render(cfg, fmt, Target())
    assert "no_such_package_here" not in sys.modules
