"""DiLoCo (commlab.hooks.diloco) against a float64 reference of its update, on 2 and 3 real Gloo
ranks, in each precision of its outer collective: the replicas identical after every outer step,
the parameters and the outer momentum buffer as Nesterov SGD on the averaged pseudo-gradient says.

The ranks are this file run by torchrun (one job of 3 ranks; the 2-rank check on a group of two):

    python -m torch.distributed.run --nproc-per-node 3 --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:0 --local-addr 127.0.0.1 tests/test_diloco.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from script_end import END

from commlab.hook_specs import OUTER_PRECISIONS
from commlab.hooks.diloco import INT8_LEVELS, DiLoCoState

ROOT = Path(__file__).resolve().parents[1]

SHAPES = ((5, 3), (4,), (2, 2))  # the last never moves: a zero pseudo-gradient (int8's zero scale)
H, ROUNDS, LR, MOMENTUM = 3, 3, 0.7, 0.9
EPS = {"bf16": 2.0**-8, "fp16": 2.0**-11}  # the relative spacing of their numbers


def _delta(rank: int, step: int, i: int, shape) -> torch.Tensor:
    """Rank ``rank``'s inner update of parameter ``i`` at ``step``, as float32 (what it subtracts)."""
    if i == len(SHAPES) - 1:
        return torch.zeros(shape)
    g = torch.Generator().manual_seed(10_000 * rank + 100 * step + i)
    return (0.1 * torch.randn(shape, generator=g, dtype=torch.float64)).float()


def _wire_mean(pseudo: list[list[torch.Tensor]], precision: str, world: int) -> list[torch.Tensor]:
    """The float64 mean over ranks of each tensor, as the precision sends it: fp32/bf16/fp16 cast
    and divided by the ranks (summed exactly here), int8 by its codes and per-tensor scale."""
    out = []
    for i in range(len(SHAPES)):
        total = torch.zeros(SHAPES[i], dtype=torch.float64)
        for r in range(world):
            x = pseudo[r][i].float()
            if precision == "int8":
                scale = x.abs().max() / INT8_LEVELS
                codes = torch.round(x / scale).clamp(-INT8_LEVELS, INT8_LEVELS) if scale > 0 else x * 0
                total += codes.double() * scale.double()
            else:
                dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
                total += x.to(dtype).div(world).double()
        out.append(total / world if precision == "int8" else total)
    return out


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pair = dist.new_group([0, 1])  # every rank makes it; ranks 0 and 1 check on it
    try:
        for precision in OUTER_PRECISIONS:
            _check(rank, dist.get_world_size(), precision, None)
            if rank < 2:
                _check(rank, 2, precision, pair)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print("DILOCO REFERENCE OK")


def _check(rank: int, world: int, precision: str, group) -> None:
    torch.manual_seed(0)  # the same start on every rank
    params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    state = DiLoCoState(group, sync_every=H, outer_lr=LR, outer_momentum=MOMENTUM, nesterov=True,
                        precision=precision)
    state.remember(params)
    anchor = [p.detach().double().clone() for p in params]  # the reference, in float64
    start, buf, size = [a.clone() for a in anchor], [torch.zeros_like(a) for a in anchor], 0.0
    for k in range(ROUNDS):
        local = {r: [a.clone() for a in anchor] for r in range(world)}
        for step in range(k * H, (k + 1) * H):
            with torch.no_grad():
                for i, p in enumerate(params):
                    p.sub_(_delta(rank, step, i, p.shape))
            for r in range(world):
                for i, s in enumerate(SHAPES):
                    local[r][i] -= _delta(r, step, i, s).double()
            synced = state.average_parameters(params)
            assert synced == (step == (k + 1) * H - 1), (precision, step)
        # The reference: the mean pseudo-gradient, Nesterov's buffer and step, in float64.
        mean = _wire_mean([[a - x for a, x in zip(anchor, local[r])] for r in range(world)], precision, world)
        # Within a few roundings of the wire's precision at the pseudo-gradient's size (bf16 and
        # fp16 sum in their own precision, the reference exactly); float32's arithmetic otherwise.
        size = max(size, *(m.abs().max().item() for m in mean))
        tol = 1e-5 if precision in ("fp32", "int8") else 4 * world * EPS[precision] * size
        for i in range(len(SHAPES)):
            buf[i] = MOMENTUM * buf[i] + mean[i]
            anchor[i] = anchor[i] - LR * (mean[i] + MOMENTUM * buf[i])
        # Every replica the same, bit for bit.
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat, group=group)
        assert all(torch.equal(g, flat) for g in gathered), (precision, k)
        opt = state.outer_optimizer
        for i, p in enumerate(params):
            kept = state.anchors[p.data_ptr()]
            assert torch.equal(p.detach(), kept), (precision, k, i)  # the replica is the outer result
            assert torch.allclose(p.detach().double(), anchor[i], rtol=0, atol=tol), (precision, k, i)
            assert torch.allclose(opt.state[kept]["momentum_buffer"].double(), buf[i], rtol=0, atol=tol), (
                precision, k, i)
        assert state.outer_steps == k + 1
    moved = [not torch.equal(p.detach().double(), a) for p, a in zip(params, start)]
    assert moved == [True] * (len(SHAPES) - 1) + [False], (precision, moved)  # the last never moves


@pytest.mark.slow
def test_diloco_matches_the_float64_reference_of_its_update_on_2_and_3_ranks():
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
                           "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--local-addr",
                           "127.0.0.1", str(Path(__file__))], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "DILOCO REFERENCE OK" in done.stdout, done.stdout[-3000:] + done.stderr[-6000:]


@pytest.mark.slow
def test_a_live_diloco_run_counts_its_outer_collectives_over_the_emulated_link(tmp_path):
    """A real 2-rank run through the lab: nothing sent between syncs; at every H-th step the int8
    codes and scales of every parameter, allgathered, held by the emulated link, in the timeline."""
    from commlab.analysis import metrics, ring
    from commlab.api import run
    from commlab.config import RunConfig
    from commlab.engine.checkpoint import resume_errors
    from commlab.hook_specs import SPECS
    from commlab.tune import whatif
    from commlab.workloads import load

    params = list(load("mlp", 0, 2, 16, 0).model.parameters())
    numel = sum(p.numel() for p in params)
    bw = 0.05
    done = run(RunConfig(hook="diloco", workload="mlp", steps=8, world_size=2, sync_every=4,
                         outer_precision="int8", eval_every=4, trace_steps=[3], emulate_bandwidth_gbps=bw,
                         runs_dir=str(tmp_path), stall_timeout_s=600), timeout=600)
    assert done.status() == "finished", done.status_record()
    rows = {r["step"]: r for r in done.metrics_records()}
    # An allgather of s bytes on 2 ranks is counted as the allreduce of s bytes (payload_of).
    sync = numel * 1 + 4 * len(params)
    for step, r in rows.items():
        syncs = (step + 1) % 4 == 0
        assert r["payload_bytes"] == (sync if syncs else 0), (step, r)
        assert r["collectives"] == (2 if syncs else 0), (step, r)
        expected_link = ring.allreduce_s(numel, 2, bw) + ring.allreduce_s(4 * len(params), 2, bw) if syncs else 0
        assert r["link_s"] == pytest.approx(expected_link, rel=1e-9), (step, r)
    assert [e["step"] for e in done.evals()] == [3, 7]  # held-out quality, every 4 steps and the last
    events = done.timeline()["steps"]["3"]["0"]
    (averaging,) = [e for e in events if e["kind"] == "averaging"]
    outer = [e for e in events if e["kind"] == "collective" and e["category"] == "hook"]
    assert sorted(e["bytes"] for e in outer) == [4 * len(params), numel]
    assert all(averaging["start"] <= e["start"] and e["end"] <= averaging["end"] + 1e-3 for e in outer)
    (codes,) = [e for e in outer if e["bytes"] == numel]
    assert codes["link_s"] > 0  # the emulated link held the codes (the scales' 24 bytes take less than loopback)
    # The what-if prices the run's own count as the link charged it: one allgather of the int8
    # codes and scales every 4 steps, (N - 1) of them received by each rank at any N.
    records, cfg = done.metrics_records(), done.config_dict()
    profile = whatif.profile_from_records(records, cfg, skip=1)
    assert (profile.period, profile.averaging_collective, profile.averaged_bytes) == (4, ring.ALLGATHER, sync)
    charged = metrics.per_step(whatif.steady_rows(records, cfg, skip=1), cfg, "link_s")
    assert profile.comm_s(2, bw, 0.0) == pytest.approx(charged, rel=1e-9)
    assert profile.wire_bytes(8) == pytest.approx(7 * sync / 4)
    # Its checkpoint story, as its row declares it: a resume is refused, saying why.
    refused = resume_errors(RunConfig.from_dict({**cfg, "steps": 16}), done.path)
    assert refused == {"hook": f"diloco cannot be resumed yet: {SPECS['diloco'].checkpoint.not_resumable}"}
    # Steps 3 to 7 are steady, two of them sync: their mean would count two averagings in five
    # steps; the one whole period (steps 4 to 7) says one in four, as the what-if does.
    assert metrics.headline(records, cfg)["bytes_per_step"] == pytest.approx(sync / 4)
    assert metrics.headline(records, cfg)["bytes_per_step"] == profile.payload_bytes


def test_state_refuses_bad_settings_by_name():
    for kwargs, word in (({"sync_every": 0}, "sync_every"), ({"outer_lr": 0}, "outer_lr"),
                         ({"outer_momentum": 1.0}, "outer_momentum"), ({"precision": "int4"}, "int4"),
                         ({"outer_momentum": 0.0}, "nesterov")):
        with pytest.raises(ValueError, match=word):
            DiLoCoState(None, **kwargs)


if __name__ == "__main__":
    main()


def test_the_what_if_prices_diloco_as_one_parameter_allreduce_every_h_steps_in_its_precision():
    from commlab.analysis import ring
    from commlab.config import RunConfig
    from commlab.tune import whatif

    params_bytes, h = 40_000, 8
    for precision, per_element in (("fp32", 4), ("bf16", 2), ("fp16", 2)):
        cfg = RunConfig(hook="diloco", sync_every=h, outer_precision=precision, world_size=2).to_dict()
        rows = [{"step": i, "loss": 1.0, "step_s": 0.02, "hook_s": 0.001, "collective_s": 0.0,
                 "link_s": 0.0, "plain_bytes": params_bytes, "collectives": int((i + 1) % h == 0),
                 "payload_bytes": params_bytes // 4 * per_element if (i + 1) % h == 0 else 0, "t": i}
                for i in range(4 * h)]
        p = whatif.profile_from_records(rows, cfg)
        sent = params_bytes // 4 * per_element
        assert (p.period, p.averaging_collective, p.averaged_bytes) == (h, ring.ALLREDUCE, sent)
        for n in (2, 64):
            assert p.wire_bytes(n) == pytest.approx(ring.wire_bytes(sent, n) / h)
            assert p.comm_s(n, 10.0, 5.0) == pytest.approx(ring.allreduce_s(sent, n, 10.0, 5.0) / h)
    # int8: the scales' allgather and the codes' every H steps, each (N - 1) hops of latency; on a
    # link of no bandwidth cost that is all a step pays.
    scales, codes = 4 * 3, params_bytes // 4
    cfg = RunConfig(hook="diloco", sync_every=h, outer_precision="int8", world_size=2).to_dict()
    counted = (scales + codes) * (2 - 1) / ring.factor(2)  # as the instrument counts an allgather
    rows = [{"step": i, "loss": 1.0, "step_s": 0.02, "hook_s": 0.001, "collective_s": 0.0, "link_s": 0.0,
             "plain_bytes": params_bytes, "collectives": 2 * int((i + 1) % h == 0),
             "payload_bytes": counted if (i + 1) % h == 0 else 0, "t": i} for i in range(4 * h)]
    p = whatif.profile_from_records(rows, cfg)
    assert (p.averaging_collective, p.averaged_bytes) == (ring.ALLGATHER, pytest.approx(scales + codes))
    assert p.comm_s(64, 1e12, 5.0) == pytest.approx(2 * 63 * 5e-6 / h, rel=1e-6)


# --------------------------------------------------------------------------- the exports, as pasted
LOOP_PRELUDE = '''
import json, os, sys
import torch
import torch.distributed as dist
from torch import nn
from commlab.hooks import DiLoCoState

dist.init_process_group("gloo")
STEPS = 6


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def batches():
    g = torch.Generator().manual_seed(dist.get_rank())
    return [(torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(STEPS)]


def flat(module):
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def same_on_every_rank(t):
    every = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(every, t)
    return all(torch.equal(e, t) for e in every)


def lab(precision, sync_every):
    """commlab's DiLoCoState on the same model and batches, no DDP: each step's parameters."""
    model = tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = DiLoCoState(None, sync_every=sync_every, precision=precision)
    state.remember(model.parameters())
    out = []
    for x, y in batches():
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        state.average_parameters(model.parameters())
        out.append(flat(model))
    return out
'''
LOOP_CELL = '''

def pasted_{precision}():
    import torch  # the snippet imports it again: a name of this function's, bound before use
    model = tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
{snippet}
    out = []
    for step, (x, y) in enumerate(batches()):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        {loop_line}
        out.append(flat(model))
    return out
'''


@pytest.mark.slow
def test_the_plain_loop_export_runs_as_pasted_and_is_the_labs_diloco_bit_for_bit(tmp_path):
    """Each precision's plain-PyTorch export, pasted into a training script run by torchrun on 2
    Gloo ranks, gives commlab's DiLoCoState's parameters at every step, bit for bit: apart between
    syncs, identical on every rank after each."""
    import textwrap

    from commlab.config import RunConfig
    from commlab.tune import export

    h = 2
    parts, names = [LOOP_PRELUDE], []
    for precision in OUTER_PRECISIONS:
        text = export.render(RunConfig(hook="diloco", sync_every=h, outer_precision=precision), "loop",
                             export.Target(backend="gloo")).text
        (line,) = [ln[4:] for ln in text.splitlines() if ln.startswith("#   diloco_step(")]
        # The snippet's functions close over `model` and friends: pasted into a function, they
        # are made nonlocal by running the snippet in the function's namespace as it is.
        parts.append(LOOP_CELL.format(precision=precision, loop_line=line,
                                      snippet=textwrap.indent(text, "    ")))
        names.append(precision)
    parts.append(f'''
results = {{}}
for precision in {names!r}:
    pasted, ours = globals()["pasted_" + precision](), lab(precision, {h})
    results[precision] = {{"equal": [torch.equal(a, b) for a, b in zip(pasted, ours)],
                          "same_on_ranks": [same_on_every_rank(a) for a in pasted]}}
if dist.get_rank() == 0:
    json.dump(results, open(sys.argv[1], "w"))
dist.destroy_process_group()
''')
    (tmp_path / "train.py").write_text("\n".join(parts) + END)
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--local-addr",
                           "127.0.0.1", str(tmp_path / "train.py"), str(out)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    results = json.loads(out.read_text())
    synced = [(s + 1) % h == 0 for s in range(6)]
    for precision in OUTER_PRECISIONS:
        assert results[precision]["equal"] == [True] * 6, (precision, results[precision])
        assert results[precision]["same_on_ranks"] == synced, (precision, results[precision])


TORCHFT_PRELUDE = '''
import os
import torch
from torch import nn


def tiny():
    torch.manual_seed(0)  # the same start in every replica group (the export's init_sync=False)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def flat(module):
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


model = tiny()
start = flat(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
loss_fn = nn.functional.cross_entropy
g = torch.Generator().manual_seed(int(os.environ["REPLICA_GROUP_ID"]))
batches = [(torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(4)]
'''
TORCHFT_EPILOGUE = '''
outer_steps = manager.current_step()
manager.shutdown()
# The lab's DiLoCo on the same model and batches, the replica groups joined by a Gloo group of
# their own (through the test's store): the reference.
import torch.distributed as dist
from commlab.hooks import DiLoCoState

replica = int(os.environ["REPLICA_GROUP_ID"])
store = dist.TCPStore("127.0.0.1", int(os.environ["REFERENCE_STORE_PORT"]), 2, False)
dist.init_process_group("gloo", store=store, rank=replica, world_size=2)
lab_model = tiny()
lab_optimizer = torch.optim.AdamW(lab_model.parameters(), lr=1e-2)
state = DiLoCoState(None, sync_every=SYNC_EVERY)
state.remember(lab_model.parameters())
for step, (x, y) in enumerate(batches):
    lab_optimizer.zero_grad(); loss_fn(lab_model(x), y).backward(); lab_optimizer.step()
    if INIT_SYNC and step == SYNC_EVERY - 1:  # torchft's first quorum heals group 1 from group 0
        for t in [*lab_model.parameters(), *(v for s in lab_optimizer.state.values() for v in s.values())]:
            dist.broadcast(t.data, src=0)
    state.average_parameters(lab_model.parameters())
dist.destroy_process_group()
torch.save({"params": flat(model), "lab": flat(lab_model), "moved": not torch.equal(flat(model), start),
            "outer_steps": outer_steps, "lab_outer_steps": state.outer_steps}, f"replica{replica}.pt")
'''


@pytest.mark.slow
@pytest.mark.parametrize("init_sync", [False, True], ids=["as_exported", "torchft_default_init_sync"])
def test_the_torchft_export_runs_as_pasted_and_is_the_labs_diloco_where_torchft_is_installed(tmp_path, init_sync):
    """torchft's DiLoCo as exported, pasted into a script that two replica groups (a torchrun job
    each) run against a lighthouse: after 2 outer steps (H=2, AdamW inside) both groups hold the
    parameters commlab's DiLoCoState reaches on the same model and batches, bit for bit.  With
    torchft's default init_sync=True instead (the export's line removed) they are those of the
    lab's DiLoCo in which group 1, at the first sync, first takes group 0's parameters and AdamW
    state: torchft's first quorum heals it then (the export's note says so)."""
    pytest.importorskip("torchft", reason="torchft is not installed (pip install torchft)")
    from torchft._torchft import LighthouseServer

    from commlab.config import RunConfig
    from commlab.tune import export

    h = 2
    text = export.render(RunConfig(hook="diloco", sync_every=h), "torchft", export.Target(backend="gloo")).text
    if init_sync:
        (line,) = [ln for ln in text.splitlines() if ln.startswith("    init_sync=False,")]
        text = text.replace(line + "\n", "")
    loop = "\n".join(ln[4:] for ln in text.split("# Train inside it")[1].splitlines() if ln.startswith("#   "))
    (tmp_path / "train.py").write_text(TORCHFT_PRELUDE + text + loop + f"\nSYNC_EVERY, INIT_SYNC = {h}, {init_sync}\n"
                                         + TORCHFT_EPILOGUE + END)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=10_000, quorum_tick_ms=100)
    env = {**os.environ, "TORCHFT_LIGHTHOUSE": lighthouse.address(), "GLOO_SOCKET_IFNAME": "lo",
           "REFERENCE_STORE_PORT": str(store.port),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    jobs: list[subprocess.Popen] = []
    try:
        jobs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  "--nproc-per-node", "1", "train.py"], cwd=tmp_path,
                                 env={**env, "REPLICA_GROUP_ID": str(i)},
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for i in range(2)]
        logs = [job.communicate(timeout=240)[0] for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()
        lighthouse.shutdown()
        del store
    assert [job.returncode for job in jobs] == [0, 0], "\n".join(log[-4000:] for log in logs)
    ends = [torch.load(tmp_path / f"replica{i}.pt") for i in range(2)]
    assert all(e["outer_steps"] == e["lab_outer_steps"] == 2 and e["moved"] for e in ends), ends
    assert torch.equal(ends[0]["params"], ends[1]["params"])
    for e in ends:
        assert torch.equal(e["params"], e["lab"]), (e["params"] - e["lab"]).abs().max()


@pytest.mark.timeout(900)
def test_the_export_page_offers_diloco_its_loop_and_torchft_and_downloads_them(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from commlab.tune import export

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600).run()
    at.switch_page("pages/export.py").run()
    assert len(at.code) == len(export.FORMATS)  # PowerSGD: no DiLoCo tabs
    next(s for s in at.selectbox if s.label == "Hook").set_value("diloco").run()
    assert not at.exception and not at.error
    codes = [c.value for c in at.code]
    assert len(codes) == len(export.FORMATS) + 2
    assert "def diloco_step(step):" in codes[-2] and "from torchft.local_sgd import DiLoCo" in codes[-1]
    assert "commlab_hooks.DiLoCoState(" in codes[list(export.FORMATS).index("ddp")]
    next(s for s in at.selectbox if s.key == "export_outer_precision").set_value("int8").run()
    assert "dist.all_gather(all_codes, codes)" in at.code[-2].value
    buttons = [b for b in at.get("download_button")]
    assert {b.proto.label for b in buttons} >= {"Download diloco_loop.py", "Download diloco_torchft.py"}


def test_the_cli_exports_diloco_s_loop_and_refuses_it_for_a_comm_hook(tmp_path, capsys):
    from commlab import cli

    assert cli.main(["export", "--hook", "diloco", "--sync-every", "16", "--format", "loop"]) == 0
    assert "SYNC_EVERY = 16" in capsys.readouterr().out
    assert cli.main(["export", "--hook", "powersgd", "--format", "torchft"]) == 2
    assert "the torchft export is DiLoCo's" in capsys.readouterr().err


def test_diloco_sweeps_over_h_outer_lr_and_precision_and_labels_its_runs_by_them():
    from commlab.config import RunConfig
    from commlab.tune.sweep import SweepSpec, grid, hook_axes

    assert [s.name for s in hook_axes("diloco")] == ["sync_every", "outer_lr", "outer_precision"]
    spec = SweepSpec(base=RunConfig(hook="diloco", workload="mlp", steps=20), sync_every=[4, 32],
                     outer_lr=[0.7], outer_precision=["fp32", "int8"], repeats=1)
    labels = [c.label() for c in grid(spec) if c.hook == "diloco"]
    assert labels == [f"diloco H={h} outer_lr=0.7 outer={p}" for h in (4, 32) for p in ("fp32", "int8")]
