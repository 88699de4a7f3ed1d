"""Sharded training (``sharding`` fsdp and hsdp): the settings refused before anything starts, the
rule that picks the units ``fully_shard`` goes on, and real Gloo ranks on which an fp32 FSDP2 run
ends where the DDP run does and HSDP with a plain all-reduce where FSDP does, and whose traced
steps' timeline names each unit's collectives as the ledger counts them."""
import json
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from commlab import workloads
from commlab.config import RunConfig, label_of
from commlab.config_fields import REPLICA_HOOKS
from commlab.engine.ranks import run_ranks
from commlab.hook_specs import HOOKS
from commlab.workload_names import BUILTIN_NAMES

STEPS = 20
SEED = 3
BATCH = 16
# float32 summation order: DDP sums a bucket on each rank and divides, FSDP's reduce-scatter averages
# a shard, HSDP reduce-scatters then all-reduces.  Measured over 20 AdamW steps on 4 ranks: the
# losses differ by at most 2.4e-7 (DDP/FSDP and FSDP/HSDP), the parameters by 5.2e-6 (DDP/FSDP:
# Adam divides a near-zero gradient's rounding by its own size) and 1.0e-7 (FSDP/HSDP); these
# bounds leave a factor of about 4.
LOSS_TOL = 1e-6
PARAM_TOL = 2e-5


# --------------------------------------------------------------------------- refused by name
def test_a_world_size_the_replicas_do_not_divide_is_refused_by_name():
    errors = RunConfig(sharding="hsdp", world_size=6, replicas=4).errors(gpu_count=0)
    assert "6 ranks cannot form 4 replicas" in errors["replicas"] and "1, 2, 3, 6" in errors["replicas"]
    assert RunConfig(sharding="hsdp", world_size=6, replicas=3).errors(gpu_count=0) == {}
    assert RunConfig(sharding="ddp", world_size=6, replicas=4).errors(gpu_count=0) == {}  # read by hsdp only


@pytest.mark.parametrize("hook", [h for h in HOOKS if h not in REPLICA_HOOKS])
def test_a_hook_without_a_sharded_form_is_refused_naming_those_that_have_one(hook):
    message = RunConfig(sharding="hsdp", world_size=4, hook=hook).errors(gpu_count=0)["hook"]
    assert f"{hook} has no sharded form" in message and ", ".join(REPLICA_HOOKS) in message


def test_fsdp_alone_has_no_replicas_for_a_hook_to_compress():
    message = RunConfig(sharding="fsdp", hook="fp16").errors(gpu_count=0)["hook"]
    assert "fsdp has no all-reduce between replicas" in message and "hsdp" in message


def test_what_only_ddps_hook_carries_out_is_refused_on_a_sharded_run():
    errors = RunConfig(sharding="fsdp", wrapper="fp16", error_every=5, save_grads_at=[1],
                       trace_steps=[3]).errors(gpu_count=0)
    assert set(errors) == {"wrapper", "error_every", "save_grads_at"}  # its steps are traced by unit
    assert all("fsdp run" in m for m in errors.values())
    # the lab's hook between HSDP's replicas is measured on the shards; FSDP's own all-reduce is no hook
    measured = {"sharding": "hsdp", "world_size": 4, "error_every": 5, "save_grads_at": [1]}
    assert RunConfig(**measured, hook="powersgd").errors(gpu_count=0) == {}
    native = RunConfig(**measured).errors(gpu_count=0)
    assert set(native) == {"error_every", "save_grads_at"} and "hook allreduce" in native["error_every"]


def test_a_sharded_runs_label_says_how_it_was_sharded():
    assert label_of(RunConfig(sharding="hsdp", world_size=4).to_dict()) == "hsdp×2 allreduce"
    assert label_of(RunConfig(sharding="fsdp").to_dict()) == "fsdp allreduce"
    assert label_of(RunConfig().to_dict()) == "allreduce"


BAD = {"replicas": (["--sharding", "hsdp", "--world-size", "6", "--replicas", "4"], "6 ranks cannot form 4 replicas"),
       "hook": (["--sharding", "hsdp", "--world-size", "4", "--hook", "topk"], "topk has no sharded form"),
       "workload": (["--sharding", "fsdp", "--world-size", "4", "--workload", "tests.test_sharding:bare_linear"],
                    "the model has no layer to shard")}


def _refused(field: str, runs_dir, capsys) -> None:
    """``commlab run`` with one bad sharding: exit 2, the field named with its reason, no run folder."""
    from commlab import cli

    flags, reason = BAD[field]
    assert cli.main(["run", *flags, "--runs-dir", str(runs_dir)]) == 2, field
    err = capsys.readouterr().err
    assert "nothing was started" in err and f"  {field}: " in err and reason in err, (field, err)
    assert not any(runs_dir.iterdir())


@pytest.mark.parametrize("field", ["replicas", "hook"])
def test_commlab_run_refuses_a_bad_sharding_by_name_and_starts_nothing(field, tmp_path, capsys):
    _refused(field, tmp_path, capsys)


@pytest.mark.slow  # the workload is probed in a child process before anything starts
def test_commlab_run_refuses_a_workload_with_no_layer_to_shard_and_starts_nothing(tmp_path, capsys):
    _refused("workload", tmp_path, capsys)


# --------------------------------------------------------------------------- the units
def test_the_units_are_the_direct_children_that_hold_parameters():
    assert [n for n, _ in workloads.shard_units(workloads.mlp_model())] == ["0", "2", "4"]
    # a ModuleList is never called: its blocks are the units
    assert [n for n, _ in workloads.shard_units(workloads.CharLM())] == [
        "tok", "pos", "blocks.0", "blocks.1", "ln_f", "head"]
    for name in BUILTIN_NAMES:  # the probe lets the built-ins through unchecked
        assert workloads.shard_units(workloads.MODELS[name]()), name


class _Declared(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.body(x))

    def fsdp_units(self):
        return list(self.body)


def test_a_model_that_declares_its_units_overrides_the_rule():
    assert [n for n, _ in workloads.shard_units(_Declared())] == ["body.0", "body.1"]


def bare_linear():  # a workload whose only parameters are the root's own
    g = torch.Generator().manual_seed(0)
    return nn.Linear(4, 2), lambda: iter([(torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,)))] * 9)


def test_a_workload_with_no_layer_to_shard_is_refused_by_name():
    assert workloads.shard_units(nn.Linear(4, 2)) == []
    message = workloads.check(f"{__name__}:bare_linear", sharded=True)
    assert "has no layer to shard" in message and "fsdp_units()" in message
    assert workloads.check(f"{__name__}:bare_linear", sharded=False) is None


# --------------------------------------------------------------------------- on real ranks
def _train(rank: int, world: int, cfg: RunConfig) -> dict:
    """``STEPS`` steps of the mlp workload as the worker trains it (sharded by
    ``commlab.engine.sharding``, or wrapped in DDP): the mean loss of each step, the full
    parameters at the end, and the bytes this rank held."""
    from commlab.engine import sharding
    from commlab.engine.worker import make_optimizer

    torch.manual_seed(cfg.seed)
    work = workloads.load(cfg.workload, rank, world, cfg.batch_size, cfg.seed)
    model = work.model
    trained = model if cfg.sharding != "ddp" else DDP(model)
    if cfg.sharding != "ddp":
        sharding.shard(model, cfg, world, torch.device("cpu"), "gloo")
    optimizer = make_optimizer(cfg, trained.parameters())
    batches, losses = work.batches(), []
    for _ in range(cfg.steps):
        loss = work.loss_of(trained, next(batches))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    # as numpy arrays: a tensor sent through the harness's pipe would be shared memory
    full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().numpy().copy()
            for n, p in model.named_parameters()}
    return {"losses": losses, "params": full, "memory": sharding.memory_held(model, optimizer)}


def _three_ways(rank: int, world: int, report) -> None:
    base = {"workload": "mlp", "world_size": world, "steps": STEPS, "seed": SEED, "batch_size": BATCH}
    for name, extra in {"ddp": {}, "fsdp": {"sharding": "fsdp"},
                        "hsdp": {"sharding": "hsdp", "replicas": 2}}.items():
        report((name, rank, _train(rank, world, RunConfig(**base, **extra))))


@pytest.fixture(scope="module")
def three_ways():
    by = {}
    for name, rank, result in run_ranks(_three_ways, 4, timeout_s=600, collective_timeout_s=120):
        by.setdefault(name, {})[rank] = result
    return by


def _max_diff(a: dict, b: dict) -> float:
    return max(float(abs(a[n] - b[n]).max()) for n in a)


@pytest.mark.slow
def test_fp32_fsdp2_ends_at_the_ddp_runs_loss(three_ways):
    ddp, fsdp = three_ways["ddp"][0], three_ways["fsdp"][0]
    gaps = [abs(a - b) for a, b in zip(ddp["losses"], fsdp["losses"])]
    assert len(gaps) == STEPS and max(gaps) < LOSS_TOL, gaps
    assert _max_diff(ddp["params"], fsdp["params"]) < PARAM_TOL
    assert ddp["losses"][-1] < ddp["losses"][0]  # it trained


@pytest.mark.slow
def test_hsdp_with_a_plain_all_reduce_equals_fsdp(three_ways):
    fsdp, hsdp = three_ways["fsdp"][0], three_ways["hsdp"][0]
    assert max(abs(a - b) for a, b in zip(fsdp["losses"], hsdp["losses"])) < LOSS_TOL
    assert _max_diff(fsdp["params"], hsdp["params"]) < PARAM_TOL


@pytest.mark.slow
def test_sharding_divides_what_each_rank_holds(three_ways):
    total = {k: sum(r["memory"][k] for r in three_ways["ddp"].values()) for k in ("parameters", "gradients")}
    ddp = three_ways["ddp"][0]["memory"]
    n_bytes = sum(p.numel() * 4 for p in workloads.mlp_model().parameters())
    assert ddp["parameters"] == ddp["gradients"] == n_bytes and total["parameters"] == 4 * n_bytes
    # AdamW keeps two moments and a step count per parameter
    assert ddp["optimizer_state"] == 2 * n_bytes + 4 * len(list(workloads.mlp_model().parameters()))
    # FSDP's 4 shards and HSDP's 2 hold the whole model between them once (padding aside: the last
    # rank's shard of a 10-row layer is short), HSDP twice
    for name, copies in (("fsdp", 1), ("hsdp", 2)):
        held = [r["memory"]["parameters"] for r in three_ways[name].values()]
        assert sum(held) == copies * n_bytes and max(held) <= copies * n_bytes / 4 + 3 * 257 * 4, held


# The one launched HSDP + PowerSGD run the tests below read (about 15 s): it also measures the
# approximation error on the shards every 2 steps, saves their exact mean gradient at 3 and 4, and
# traces step 1 (a plain all-reduce between replicas) and 4 (PowerSGD's, its error measured).
LAUNCHED = {"steps": 6, "start_powerSGD_iter": 2, "error_every": 2, "save_grads_at": [3, 4],
            "matrix_approximation_rank": 1, "min_compression_rate": 2.0, "trace_steps": [1, 4]}


@pytest.fixture(scope="module")
def hsdp_powersgd_run(tmp_path_factory):
    from commlab import cli

    runs_dir = tmp_path_factory.mktemp("hsdp_powersgd")
    code = cli.main(["run", "--workload", "mlp", "--sharding", "hsdp", "--world-size", "4", "--steps", "6",
                     "--hook", "powersgd", "--start-powersgd-iter", "2", "--emulate-bandwidth-gbps", "1",
                     "--eval-every", "3", "--error-every", "2", "--save-grads-at", "3,4",
                     "--trace-steps", "1,4", "--runs-dir", str(runs_dir)])
    assert code == 0
    (run,) = runs_dir.iterdir()
    return run


@pytest.mark.slow
def test_a_launched_hsdp_powersgd_run_records_its_loss_evaluations_memory_and_bytes(hsdp_powersgd_run):
    run = hsdp_powersgd_run
    meta = json.loads((run / "meta.json").read_text())
    assert meta["sharding"] == "hsdp" and meta["sharded"] == {
        "mesh": {"replicate": 2, "shard": 2}, "units": ["0", "2", "4"], "between_replicas": "lab"}
    assert len(meta["memory_per_rank"]) == 4 and meta["checkpoint"].startswith("saved")
    assert meta["hook_name"] == "powerSGD_hook" and meta["instrumented"] is False
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(6)) and [e["step"] for e in evals] == [2, 5]
    assert all(m["step_s"] > 0 for m in metrics) and 0 <= evals[-1]["accuracy"] <= 1
    # half the model's fp32 gradients per rank between 2 replicas (counted as the all-reduce of
    # 4 ranks that sends as much: 2(2-1)/2 over 2(4-1)/4), plain before PowerSGD starts
    model = sum(p.numel() for p in workloads.mlp_model().parameters()) * 4
    plain = metrics[0]["replica_plain_bytes"]
    assert abs(plain - model / 2 / 1.5) <= 3 and [m["replica_plain_bytes"] for m in metrics] == [plain] * 6
    assert [m["replica_bytes"] == plain for m in metrics] == [True, True, False, False, False, False]
    assert all(0 < m["replica_bytes"] < plain / 10 for m in metrics[2:]) and all(m["link_s"] > 0 for m in metrics)
    # FSDP's all-gathers (twice: resharded after forward) and reduce-scatters of 3 units on the
    # shard group (the step after an evaluation gathers once more: measured, one unit), in all
    # what the run put on the wire, against DDP's plain allreduce of the whole model
    assert [m["sharding_collectives"] for m in metrics if m["step"] != 3] == [9] * 5
    assert metrics[3]["sharding_collectives"] in (9, 10) and all(m["sharding_bytes"] > 0 for m in metrics)
    assert all(m["payload_bytes"] == m["replica_bytes"] + m["sharding_bytes"] for m in metrics)
    assert all(m["plain_bytes"] == model for m in metrics)
    assert [m["powersgd_iter"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
    assert (run / "ledger.json").exists()


def _shard_rows(shards: int) -> list[tuple[str, tuple]]:
    """The mlp's parameters cut on dim 0 as FSDP2 cuts them, named as a run names a shard; built
    here, not with ``commlab.analysis.rule.on_shards``: torch.chunk's sizes, padded with empty shards."""
    rows = []
    for name, p in workloads.mlp_model().named_parameters():
        chunks = list(torch.chunk(torch.empty(p.shape), shards, dim=0))
        chunks += [torch.empty(0, *p.shape[1:])] * (shards - len(chunks))
        rows += [(f"{name} [shard {k} of {shards}]", tuple(c.shape)) for k, c in enumerate(chunks)]
    return rows


def test_the_rule_on_shards_cuts_each_parameter_as_fsdp2_does():
    from commlab.analysis.rule import on_shards

    named = [(n, tuple(p.shape)) for n, p in workloads.mlp_model().named_parameters()]
    for shards in (2, 3, 4, 7):  # 7: the 10-row layer leaves the last shard empty
        assert on_shards(named, shards)[0] == _shard_rows(shards), shards
    assert on_shards([("w", (4, 3))], 2, {"w": "in × out"})[1] == {
        "w [shard 0 of 2]": "in × out", "w [shard 1 of 2]": "in × out"}


@pytest.mark.slow
def test_a_sharded_powersgd_run_records_powersgds_rule_on_its_shards(hsdp_powersgd_run):
    """layers.json: a row per rank's shard of each parameter, decided by PowerSGD's rule on the
    shard's shape, n·m against (n+m)·r·min_compression_rate, as the hook between replicas decides."""
    layers = json.loads((hsdp_powersgd_run / "layers.json").read_text())
    assert [(d["name"], tuple(d["shape"])) for d in layers] == _shard_rows(2)
    rank, rate = LAUNCHED["matrix_approximation_rank"], LAUNCHED["min_compression_rate"]
    for d in layers:
        n, m = d["shape"][0], math.prod(d["shape"][1:])
        r = min(n, m, rank)
        assert (d["n"], d["m"], d["r"], d["rhs"]) == (n, m, r, n * m), d
        assert d["lhs"] == (n + m) * r * rate and d["compressed"] == ((n + m) * r * rate < n * m), d
        assert d["applies"] is True
    # the weights' shards (128 x 64, 128 x 256, 5 x 256) are compressed, the biases' never
    assert [d["name"] for d in layers if d["compressed"]] == [
        f"{w}.weight [shard {k} of 2]" for w in (0, 2, 4) for k in (0, 1)]


@pytest.mark.slow
def test_a_sharded_powersgd_run_measures_the_error_and_saves_the_gradient_of_each_shard(hsdp_powersgd_run):
    from commlab.engine.run_folder import RunFolder

    run = RunFolder(hsdp_powersgd_run)
    compressed = [f"{w}.weight [shard {k} of 2]" for w in (0, 2, 4) for k in (0, 1)]
    records = run.error_records()
    assert [r["step"] for r in records] == [0, 2, 4] and all(r["measure_bytes"] > 0 for r in records)
    for r in records:
        assert sorted(x["layer"] for x in r["layers"]) == sorted(compressed)
        assert [b["bucket"] for b in r["buckets"]] == [0, 1, 2]  # the units
        errors = [x["rel_error"] for x in r["layers"] + r["buckets"]]
        # a plain average before start_powerSGD_iter; rank 1 of a noisy gradient after it
        assert all(e == 0 for e in errors) if r["step"] < 2 else all(0 < e < 2 for e in errors), r
    assert records[0]["ef_residual_norm"] is None and records[-1]["ef_residual_norm"] > 0
    assert run.grad_steps() == [3, 4]
    for step in (3, 4):
        grads = run.grads(step)
        assert sorted(grads) == sorted(name for name, _ in _shard_rows(2))
        # each parameter's shards, put back together on dim 0, are its whole mean gradient
        for name, p in workloads.mlp_model().named_parameters():
            whole = torch.cat([grads[f"{name} [shard {k} of 2]"] for k in (0, 1)])
            assert whole.shape == p.shape and whole.abs().sum() > 0


# --------------------------------------------------------------------------- between replicas
PSGD = {"matrix_approximation_rank": 2, "start_powerSGD_iter": 2, "random_seed": 7}
PSGD_STEPS = 8
# float32 PowerSGD against float64 on the same inputs: measured 1.2e-7 at most (4 ranks, 2 x 2,
# 8 steps, 3 units of 2 shards of a weight and a bias each, shards of 5 x 256 to 128 x 256; the
# gradients reach 0.1); a bound with a factor of about 4.
PSGD_TOL = 5e-7


def _recording(hook, log: list):
    """``hook``, its every call logged: the unit, whether last, the shards' shapes, in and out."""
    def recorded(state, bucket):
        before = bucket.buffer().detach().clone()
        out = hook(state, bucket).wait()
        log.append({"index": bucket.index(), "last": bucket.is_last(), "in": before.numpy(),
                    "shapes": [tuple(g.shape) for g in bucket.gradients()], "out": out.detach().clone().numpy()})
        done = torch.futures.Future()
        done.set_result(out)
        return done
    return recorded


def _hsdp_powersgd(rank: int, world: int, report) -> None:
    from commlab.engine import sharding
    from commlab.engine.worker import make_optimizer

    cfg = RunConfig(workload="mlp", world_size=world, sharding="hsdp", replicas=2, hook="powersgd",
                    steps=PSGD_STEPS, seed=SEED, batch_size=BATCH, **PSGD)
    torch.manual_seed(cfg.seed)
    work = workloads.load(cfg.workload, rank, world, cfg.batch_size, cfg.seed)
    sharded = sharding.shard(work.model, cfg, world, torch.device("cpu"), "gloo")
    log: list = []
    choice = sharded.choice
    sharded.replica.hook = _recording(choice.hook, log)
    optimizer = make_optimizer(cfg, work.model.parameters())
    batches = work.batches()
    for _ in range(cfg.steps):
        loss = work.loss_of(work.model, next(batches))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    replicas = sorted(dist.get_process_group_ranks(sharded.mesh["replicate"].get_group()))
    report((rank, replicas, log, choice.name, choice.state.iter))


def _orth(a: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt on the columns (PyTorch's PowerSGD for a rank of 2 or less)."""
    a = a.clone()
    for i in range(a.shape[1]):
        a[:, i] /= a[:, i].norm()
        a[:, i + 1:] -= a[:, i:i + 1] * (a[:, i:i + 1] * a[:, i + 1:]).sum(0, keepdim=True)
    return a


def _powersgd_reference(logs: list[list[dict]], rank: int, start: int, seed: int) -> list[torch.Tensor]:
    """PowerSGD as documented, in float64, replayed call by call on one replica group's shards
    (``logs``: each member's calls): error feedback and warm start per unit, the compression
    rule per shard, plain averaging before ``start``; what every member gets back, per call."""
    rng = np.random.RandomState(seed)
    step, errors, qs, outs = 0, {}, {}, []
    for calls in zip(*logs):
        index, shapes = calls[0]["index"], calls[0]["shapes"]
        inputs = [torch.from_numpy(c["in"]).double() for c in calls]
        if step < start:
            outs.append(sum(inputs) / len(inputs))
        else:
            ms = [x + errors.get(index, [0] * len(inputs))[k] for k, x in enumerate(inputs)]
            out = sum(ms) / len(ms)  # the uncompressed shards' average; compressed ones overwritten
            offsets = np.cumsum([0] + [math.prod(s) for s in shapes])
            matrices = []  # (offset, n, m) of each compressed shard, grouped by shape as the hook draws
            for o, shape in zip(offsets, shapes):
                n, m = shape[0], math.prod(shape[1:])
                r = min(n, m, rank)
                if (n + m) * r * 2.0 < n * m:
                    matrices.append((int(o), n, m))
            first_of_shape = {}
            for _, n, m in matrices:
                first_of_shape.setdefault((n, m), len(first_of_shape))
            matrices.sort(key=lambda t: first_of_shape[t[1:]])
            if index not in qs:
                g = torch.Generator().manual_seed(int(rng.randint(1_000_000_000)))
                qs[index] = [torch.randn(m, min(n, m, rank), generator=g).double() for _, n, m in matrices]
            new_qs = []
            for (o, n, m), q in zip(matrices, qs[index]):
                views = [x[o:o + n * m].view(n, m) for x in ms]
                p = _orth(sum(v @ _orth(q) for v in views))
                q = sum(v.t() @ p for v in views) / len(views)
                out[o:o + n * m] = (p @ q.t()).flatten()
                new_qs.append(q)
            qs[index] = new_qs
            errors[index] = [x - out for x in ms]
            outs.append(out)
        step += calls[0]["last"]
    return outs


@pytest.mark.slow
def test_hsdp_powersgd_between_replicas_equals_a_float64_reference_on_the_shards():
    reports = {rank: rest for rank, *rest in run_ranks(_hsdp_powersgd, 4, timeout_s=600, collective_timeout_s=120)}
    groups = {tuple(replicas) for replicas, *_ in reports.values()}
    assert groups == {(0, 2), (1, 3)}  # the replicas of a shard: a 2 x 2 mesh, replicate first
    worst, compressed_calls = 0.0, 0
    for group in groups:
        logs = [reports[r][1] for r in group]
        assert len(logs[0]) == 3 * PSGD_STEPS and all(reports[r][3] == PSGD_STEPS for r in group)
        assert [c["index"] for c in logs[0][:3]] == [2, 1, 0]  # backward's order: the last layer first
        reference = _powersgd_reference(logs, PSGD["matrix_approximation_rank"], PSGD["start_powerSGD_iter"],
                                        PSGD["random_seed"])
        for k, expected in enumerate(reference):
            for log in logs:
                got = torch.from_numpy(log[k]["out"]).double()
                worst = max(worst, (got - expected).abs().max().item())
            compressed_calls += k >= 3 * PSGD["start_powerSGD_iter"]
    assert compressed_calls == 2 * 3 * (PSGD_STEPS - PSGD["start_powerSGD_iter"])
    # the shards the hook got are those the run's rule is recorded on (``rule.on_shards``)
    rows = dict(_shard_rows(2))
    for rank, (_, log, *_) in reports.items():
        for call in log[:3]:
            layer = ("0", "2", "4")[call["index"]]
            assert call["shapes"] == [rows[f"{layer}.{p} [shard {rank % 2} of 2]"] for p in ("weight", "bias")]
    assert worst < PSGD_TOL, worst
    # not a plain average: PowerSGD changed what the replicas got
    last = reports[0][1][-1]
    assert np.abs(last["out"] - (last["in"] + reports[2][1][-1]["in"]) / 2).max() > 1e-4


# --------------------------------------------------------------------------- the ledger
# One traced step of each, in one process group: FSDP resharded after forward (FSDP2's default) and
# not, and native HSDP 2 x 2 (FSDP's own all-reduce between the replicas)
ONE_STEP = {"resharded": {"reshard_after_forward": True}, "kept": {"reshard_after_forward": False},
            "hsdp": {"sharding": "hsdp", "replicas": 2}}


def _one_step_ledger(rank: int, world: int, report) -> None:
    """One traced step of each of ``ONE_STEP`` measured as the worker measures it
    (``ShardedMeasurement``): its counts, its ledger and its timeline, every rank's."""
    from commlab.engine import sharding
    from commlab.engine.measurement import ShardedMeasurement
    from commlab.engine.worker import make_optimizer

    for name, settings in ONE_STEP.items():
        cfg = RunConfig(**{"workload": "mlp", "world_size": world, "sharding": "fsdp", "batch_size": BATCH,
                           "trace_steps": [0], **settings})
        torch.manual_seed(cfg.seed)
        work = workloads.load(cfg.workload, rank, world, cfg.batch_size, cfg.seed)
        cpu = torch.device("cpu")
        sharded = sharding.shard(work.model, cfg, world, cpu, "gloo")
        measure = ShardedMeasurement(cfg, world, sharded, 0, rank, set(), cpu)
        try:
            optimizer = make_optimizer(cfg, work.model.parameters())
            measure.begin(0)
            with measure.phase("forward"):
                loss = work.loss_of(work.model, next(work.batches()))
            with measure.phase("backward"):
                loss.backward()
            optimizer.step()
            timeline = measure.timeline()
            report((rank, name, measure.counter.take()[:2], measure.ledger(), timeline))
        finally:
            measure.close()


@pytest.fixture(scope="module")
def one_step():
    """Rank 0's report of one traced step of each of ``ONE_STEP``, the mlp on 4 ranks, by name."""
    reports = run_ranks(_one_step_ledger, 4, timeout_s=600)
    return {name: (taken, rows, timeline) for rank, name, taken, rows, timeline in reports if rank == 0}


# each unit's flat parameters padded to 4 shards: 3 x 257 (unit 4, 10 rows), 256 x 65 (unit 0), 256 x 257 floats (unit 2)
LAYER_BYTES = [3 * 4 * 257 * 4, 256 * 65 * 4, 256 * 257 * 4]


@pytest.mark.slow
def test_the_ledger_holds_fsdps_all_gathers_and_reduce_scatters_per_layer(one_step):
    layer_bytes = LAYER_BYTES
    for name, gathers in (("resharded", 2), ("kept", 1)):  # resharded after forward: gathered again in backward
        (nbytes, calls), rows, _ = one_step[name]
        got = sorted((r["traffic"], r["collective"], r["ranks"], r["size_bytes"], r["count"]) for r in rows)
        assert got == sorted([("sharding", "all_gather", 4, b, gathers) for b in layer_bytes]
                             + [("sharding", "reduce_scatter", 4, b, 1) for b in layer_bytes])
        assert calls["sharding"] == 3 * (gathers + 1) and nbytes["hook"] == 0
        # by the allreduce ruler: a gather and a scatter of S each put S/2 of a 4-rank allreduce's
        # wire bytes, so a step without resharding counts as the allreduce of the whole model
        assert nbytes["sharding"] == sum(b // 2 * (gathers + 1) for b in layer_bytes)


# --------------------------------------------------------------------------- the timeline
def _within(events: list[dict], phase: str) -> list[dict]:
    (span,) = [e for e in events if e["kind"] == phase]
    return [e for e in events if e["kind"] == "collective" and span["start"] <= e["start"] <= span["end"]]


def _units(events: list[dict], collective: str, category: str = "sharding") -> list[str]:
    """The units of ``events``' collectives of a kind, in the order they were issued."""
    return [e["unit"] for e in sorted(events, key=lambda e: e["start"])
            if e["collective"] == collective and e["category"] == category]


def _ordered(events: list[dict], categories=("sharding", "hook", "measure")) -> None:
    """Every collective of a unit issued before it completed, both within forward and backward."""
    forward, backward = ([e for e in events if e["kind"] == k][0] for k in ("forward", "backward"))
    for e in events:
        if e["kind"] == "collective" and e["category"] in categories:
            assert forward["start"] <= e["start"] <= e["end"] <= backward["end"], e


@pytest.mark.slow
def _as_the_ledger(rows: list[dict], events: list[dict]) -> None:
    """A step's collectives (one step: the whole ledger) filed as the ledger files them: by traffic,
    kind, ranks and size, with their calls and counted bytes."""
    def key(e):
        return e["category"], e["collective"], e["ranks"], e["size_bytes"]
    mine = [e for e in events if e["kind"] == "collective"]
    filed = {k: [e for e in mine if key(e) == k] for k in map(key, mine)}
    assert sorted((r["traffic"], r["collective"], r["ranks"], r["size_bytes"], r["count"], r["counted_bytes"])
                  for r in rows) == sorted((*k, len(same), sum(e["bytes"] for e in same)) for k, same in filed.items())


@pytest.mark.slow
def test_a_traced_fsdp_step_holds_each_units_gathers_and_scatters_with_the_ledgers_bytes(one_step):
    for name in ("resharded", "kept"):
        (nbytes, _), rows, timeline = one_step[name]
        assert len(timeline) == 4  # every rank's events, gathered to rank 0
        for events in timeline:
            _ordered(events)
            # one all-gather per unit in forward; in backward again (last unit first) when resharded
            # after forward; one reduce-scatter per unit, as its gradients are ready
            assert _units(_within(events, "forward"), "all_gather") == ["0", "2", "4"]
            backward = _within(events, "backward")
            assert _units(backward, "all_gather") == (["4", "2", "0"] if name == "resharded" else [])
            assert _units(backward, "reduce_scatter") == ["4", "2", "0"]
            sizes = dict(zip(["4", "0", "2"], LAYER_BYTES))
            assert all(e["size_bytes"] == sizes[e["unit"]] and e["ranks"] == 4 for e in events
                       if e["kind"] == "collective")
        _as_the_ledger(rows, timeline[0])  # rank 0's
        assert sum(e["bytes"] for e in timeline[0] if e["kind"] == "collective") == nbytes["sharding"]


@pytest.mark.slow
def test_a_traced_native_hsdp_step_all_reduces_each_units_shard_between_replicas(one_step):
    (nbytes, _), rows, timeline = one_step["hsdp"]
    for events in timeline:
        _ordered(events)
        backward = _within(events, "backward")
        # FSDP's own all-reduce on the 2 replicas, right after each unit's reduce-scatter on its 2 shards
        assert _units(backward, "all_reduce", "hook") == _units(backward, "reduce_scatter") == ["4", "2", "0"]
        for e in backward:
            if e["collective"] == "all_reduce":
                scatter = next(s for s in backward if s["collective"] == "reduce_scatter" and s["unit"] == e["unit"])
                assert scatter["end"] <= e["start"] and e["ranks"] == scatter["ranks"] == 2
                assert e["size_bytes"] == scatter["size_bytes"] // 2  # this rank's shard of the unit
        assert not [e for e in events if e["kind"] == "hook"]  # no hook of the lab's
    _as_the_ledger(rows, timeline[0])
    mine = [e for e in timeline[0] if e["kind"] == "collective"]
    assert sum(e["bytes"] for e in mine if e["category"] == "hook") == nbytes["hook"] > 0


@pytest.mark.slow
def test_a_traced_hsdp_step_holds_the_all_reduce_between_replicas_after_each_units_scatter(hsdp_powersgd_run):
    from commlab.engine.run_folder import RunFolder

    run = RunFolder(hsdp_powersgd_run)
    traced, metrics = run.timeline(), run.metrics_records()
    # the hook holds backward until its collectives are done: nothing hidden (a completion's callback
    # may run a moment after the hook's wait returned)
    assert list(traced["steps"]) == ["1", "4"] and traced["overlap_share"] < 0.05
    for step, ranks in traced["steps"].items():
        assert sorted(ranks) == ["0", "1", "2", "3"]
        for events in ranks.values():
            _ordered(events)
            assert _units(_within(events, "forward"), "all_gather") == ["0", "2", "4"]
            backward = _within(events, "backward")
            assert _units(backward, "all_gather") == ["4", "2", "0"]  # resharded after forward
            assert _units(backward, "reduce_scatter") == ["4", "2", "0"]
            # the lab's hook, once per unit after its reduce-scatter; its all-reduces (PowerSGD's
            # three a unit from step 2; at step 4 the exact mean first) on the 2 replicas, inside it
            hooks = sorted((e for e in events if e["kind"] == "hook"), key=lambda e: e["start"])
            assert [h["unit"] for h in hooks] == ["4", "2", "0"]
            for hook in hooks:
                scatter = next(e for e in backward if e["collective"] == "reduce_scatter" and e["unit"] == hook["unit"])
                assert scatter["end"] <= hook["start"]
                inside = [e for e in events if e["kind"] == "collective" and e.get("unit") == hook["unit"]
                          and e["category"] in ("hook", "measure")]
                assert [(e["category"], e["ranks"]) for e in sorted(inside, key=lambda e: e["start"])] == (
                    [("hook", 2)] if step == "1" else [("measure", 2)] + [("hook", 2)] * 3)
                assert all(hook["start"] <= e["start"] <= hook["end"] for e in inside)
        # rank 0's bytes by traffic: the step's metrics row, which the ledger's counter took
        row, mine = metrics[int(step)], [e for e in ranks["0"] if e["kind"] == "collective"]
        for traffic, field in (("sharding", "sharding_bytes"), ("hook", "replica_bytes"), ("measure", "measure_bytes")):
            assert sum(e["bytes"] for e in mine if e["category"] == traffic) == row[field], (step, traffic)


def test_a_sharded_timeline_names_units_in_the_trace_and_the_figure():
    from commlab.analysis import timeline
    from commlab.figures.timeline import caption, step_figure

    def collective(kind, unit, category, start):
        return {"kind": "collective", "collective": kind, "unit": unit, "bucket": None, "category": category,
                "bytes": 8, "size_bytes": 16, "ranks": 2, "thread": "MainThread", "start": start,
                "end": start + 0.1, "link_s": 0.0}
    events = [{"kind": "forward", "start": 0.0, "end": 1.0}, collective("all_gather", "0", "sharding", 0.1),
              {"kind": "backward", "start": 1.0, "end": 2.0}, collective("reduce_scatter", "0", "sharding", 1.1),
              {"kind": "hook", "unit": "0", "start": 1.3, "end": 1.5}, collective("all_reduce", "0", "hook", 1.35),
              collective("all_gather", "", "sharding", 1.6)]
    recorded = {"steps": {"1": {"0": events}}, "overlap_share": timeline.run_overlap_share({"1": {"0": events}})}
    names = {e["name"] for e in timeline.chrome_trace(recorded["steps"])["traceEvents"] if e["ph"] == "X"}
    assert names == {"forward", "backward", "hook unit 0", "all_gather (sharding) unit 0",
                     "reduce_scatter (sharding) unit 0", "all_reduce (hook) unit 0", "all_gather (sharding) unit root"}
    legend = {t.name for t in step_figure(recorded, "1").data}
    assert legend == {"forward", "backward", "lab's hook between replicas (a unit's gradients reduce-scattered)",
                      "FSDP's all-gather (a unit's parameters)", "FSDP's reduce-scatter (a unit's gradients)",
                      "all-reduce between replicas (a unit's shard)"}
    assert "units, not buckets" in caption(recorded) and "Overlap share" in caption(recorded)
    assert recorded["overlap_share"] == 0.0  # the all-reduce waited for inside the hook: nothing hidden


# --------------------------------------------------------------------------- checkpoint and resume
@pytest.mark.slow
def test_a_resumed_sharded_run_equals_an_uninterrupted_one_bit_for_bit(tmp_path):
    """HSDP with PowerSGD between replicas: the model and optimizer through DCP, PowerSGD's
    error feedback and warm start per shard in the rank files."""
    from commlab import api
    from commlab.engine import checkpoint

    base = {"workload": "mlp", "sharding": "hsdp", "world_size": 4, "hook": "powersgd", "start_powerSGD_iter": 2,
            "eval_every": 0, "batch_size": BATCH, "seed": SEED, "runs_dir": str(tmp_path)}
    whole, half = (api.launch(RunConfig(**base, steps=steps)) for steps in (8, 4))
    for run in (whole, half):
        assert run.wait(600) == "finished", run.status_record()
    assert checkpoint.sharded_dir(half.path).is_dir() and half.checkpoint_step() == 3
    # the sharding is the checkpoint's: it cannot change on resume
    with pytest.raises(Exception, match="must stay"):
        checkpoint.resume_config(half.path, steps=8, sharding="fsdp")
    rest = api.resume(half.path, steps=8)
    assert rest.wait(600) == "finished", rest.status_record()
    losses = [r["loss"] for run in (half, rest) for r in run.metrics_records()]
    assert [r["step"] for r in rest.metrics_records()] == [4, 5, 6, 7]
    assert losses == [r["loss"] for r in whole.metrics_records()]
    assert rest.metrics_records()[0]["powersgd_iter"] == 5  # PowerSGD went on from its state


# --------------------------------------------------------------------------- the what-if
# One FSDP step of the mlp on 4 ranks as measured above: 3 units of 342,064 padded bytes in all,
# gathered twice and scattered once, counted by the 4-rank allreduce ruler as 513,096 bytes.
PADDED = 12336 + 66560 + 263168


def _records(**row) -> list[dict]:
    base = {"step_s": 0.05, "hook_s": None, "collective_s": 0, "link_s": 0.0, "replica_bytes": 0,
            "replica_collectives": 0, "sharding_bytes": 513096, "sharding_collectives": 9}
    merged = {**base, **row}
    merged.setdefault("payload_bytes", merged["replica_bytes"] + merged["sharding_bytes"])
    merged.setdefault("collectives", merged["replica_collectives"] + merged["sharding_collectives"])
    return [{"step": s, "loss": 1.0, **merged} for s in range(20)]


def test_a_sharded_profile_reads_the_model_and_its_units_back_from_the_count():
    from commlab.analysis import ring
    from commlab.tune.whatif import profile_from_records

    cfg = RunConfig(workload="mlp", world_size=4, sharding="fsdp", emulate_bandwidth_gbps=1.0).to_dict()
    p = profile_from_records(_records(), cfg)
    moved = p.sharded
    assert (moved.model_bytes, moved.units, moved.gathers, moved.shard_size) == (PADDED, 3, 2, 0)
    assert p.payload_bytes == 513096 and p.collectives == 9
    # on the run's own ranks, the model puts on the wire what the count says, and prices it as the
    # emulated link charged it (the same formula)
    assert p.wire_bytes(4) == pytest.approx(513096 * ring.factor(4))
    assert p.comm_s(4, 1.0, 0.0) == pytest.approx(513096 * ring.factor(4) * 8 / 1e9)
    # FSDP shards over every rank: what each sends tends to 3 L, its latencies grow with N
    assert p.wire_bytes(1024) == pytest.approx(3 * PADDED * 1023 / 1024)
    assert p.comm_s(8, 0.0, 10.0) == pytest.approx(9 * 7 * 10e-6)
    unsharded = profile_from_records(_records(sharding_bytes=342064, sharding_collectives=6),
                                     {**cfg, "reshard_after_forward": False}).sharded
    assert (unsharded.model_bytes, unsharded.gathers) == (PADDED, 1)


def test_hsdp_keeps_its_shard_group_and_adds_replicas_at_scale():
    from commlab.analysis import ring
    from commlab.tune.whatif import profile_from_records

    cfg = RunConfig(workload="mlp", world_size=4, sharding="hsdp", replicas=2).to_dict()
    # 2 shards of a replica: a gather or a scatter of L puts L/2 on a rank's wire; the replicas
    # all-reduce half the model, 3 calls a step
    p = profile_from_records(_records(sharding_bytes=round(3 * PADDED / 2 / 1.5),
                                      replica_bytes=round(PADDED / 2 / 1.5), replica_collectives=3), cfg).sharded
    assert p.shard_size == 2 and p.model_bytes == pytest.approx(PADDED, abs=2)
    assert p.replica_bytes == pytest.approx(PADDED / 2, abs=2)
    # at 64 ranks: 32 replicas of 2 shards; the shards' traffic stays, the replicas' ring grows
    sharded_part = p.sharding_only().wire_bytes(64)
    assert sharded_part == pytest.approx(p.sharding_only().wire_bytes(4))
    assert p.wire_bytes(64) - sharded_part == pytest.approx(ring.wire_bytes(PADDED / 2, 32), rel=1e-5)
    # a sharded allreduce run calibrates no loopback (its all-reduce is no DDP hook's): a DDP run does
    from commlab.config import is_plain_allreduce
    assert not is_plain_allreduce(cfg) and is_plain_allreduce({"hook": "allreduce"})


# --------------------------------------------------------------------------- the export
def _exported(rank: int, world: int, report, cases: list) -> None:
    """Each fsdp export pasted as it is after the model is built, trained as the lab trains, beside
    the lab's own sharding of the same model: the same losses, bit for bit (``cases``: (config,
    text) pairs, in one process group: one start of 4 ranks for them all)."""
    for cfg, text in cases:
        _exported_one(rank, world, report, cfg, text)


def _exported_one(rank: int, world: int, report, cfg: RunConfig, text: str) -> None:
    from commlab.engine import sharding
    from commlab.engine.worker import make_optimizer

    losses = {}
    for how in ("exported", "lab"):
        torch.manual_seed(cfg.seed)
        work = workloads.load(cfg.workload, rank, world, cfg.batch_size, cfg.seed)
        model = work.model
        if how == "exported":
            pasted = {"model": model}
            exec(compile(text, "fsdp_sharding.py", "exec"), pasted)
        else:
            sharding.shard(model, cfg, world, torch.device("cpu"), "gloo")
        optimizer = make_optimizer(cfg, model.parameters())
        batches, losses[how] = work.batches(), []
        for _ in range(cfg.steps):
            loss = work.loss_of(model, next(batches))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses[how].append(loss.item())
    report((rank, cfg.hook, losses, getattr(pasted.get("state"), "iter", None)))


@pytest.mark.slow
def test_the_fsdp_export_runs_as_pasted_on_4_gloo_ranks_as_the_lab_ran():
    from commlab.tune import export

    cases = []
    for settings in ({"sharding": "hsdp", "hook": "powersgd", "start_powerSGD_iter": 2},
                     {"sharding": "fsdp", "reduce_dtype": "bf16", "reshard_after_forward": False}):
        cfg = RunConfig(workload="mlp", world_size=4, steps=5, batch_size=BATCH, seed=SEED, **settings)
        cases.append((cfg, export.render(cfg, "fsdp", export.Target(backend="gloo")).text))
    reports = run_ranks(_exported, 4, (cases,), timeout_s=600)
    assert len(reports) == 4 * len(cases)
    for rank, hook, losses, iters in reports:
        assert losses["exported"] == losses["lab"], (rank, hook)
        assert iters == (5 if hook == "powersgd" else None)


def test_a_sharded_run_exports_as_fsdp_code_not_as_ddp_code():
    from commlab.tune import export

    cfg = RunConfig(sharding="hsdp", world_size=4, hook="powersgd")
    assert export.formats_for(cfg) == ("json", "toml", "fsdp", "torchrun", "slurm")
    text = export.render(cfg, "fsdp", export.Target(backend="gloo")).text
    assert "mesh_dim_names=('replicate', 'shard')" in text and "fully_shard(model, **options)" in text
    assert "commlab_hooks.ReplicaAllReduce(commlab_powersgd.blocking_powerSGD_hook, state" in text
    assert 'process_group=mesh["replicate"].get_group()' in text
    with pytest.raises(export.ExportRefused, match="exports as json, toml, fsdp"):
        export.render(cfg, "ddp")
    with pytest.raises(export.ExportRefused, match="a ddp run exports as"):
        export.render(RunConfig(), "fsdp")
    with pytest.raises(export.ExportRefused, match="replicas=2 does not divide the target's 3 ranks"):
        export.render(cfg, "torchrun", export.Target(nproc_per_node=3))
    native = export.render(RunConfig(sharding="hsdp", world_size=4), "fsdp").text  # FSDP's own all-reduce
    assert "ReplicaAllReduce" not in native and "options = dict(mesh=mesh," in native


# --------------------------------------------------------------------------- the pages, on shards
def _page(monkeypatch, runs_dir, page: str, run_path):
    import os

    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(runs_dir))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    at = AppTest.from_file(os.path.join(root, "app.py"), default_timeout=300).run()
    at.switch_page(page).run()
    if page.endswith("compression_rule.py"):
        next(w for w in at.radio if w.label == "Shapes from").set_value("A run").run()
    assert next(w for w in at.selectbox if w.label == "Run").value == str(run_path)
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.slow
def test_the_rule_and_low_rank_pages_show_a_sharded_run_on_its_shards(monkeypatch, hsdp_powersgd_run):
    """The Compression rule page's "A run" source and the Low-rank error page on the HSDP +
    PowerSGD run: every number as the run folder says it (the low-rank comparisons recomputed
    from its saved shards by commlab.analysis.lowrank)."""
    from commlab.analysis import lowrank
    from commlab.analysis.rule import apply_rule
    from commlab.engine.run_folder import RunFolder
    from commlab.figures import lowrank as lowrank_figs
    from commlab.figures import rule as rule_figs

    run = RunFolder(hsdp_powersgd_run)
    layers = run.layers()
    at = _page(monkeypatch, hsdp_powersgd_run.parent, "pages/compression_rule.py", hsdp_powersgd_run)
    # the sliders start at the run's settings, where the table is the rule the run recorded
    rank = next(w for w in at.slider if w.label == "matrix_approximation_rank").value
    rate = next(w for w in at.slider if w.label == "min_compression_rate").value
    assert (rank, rate) == (LAUNCHED["matrix_approximation_rank"], LAUNCHED["min_compression_rate"])
    table = at.dataframe[0].value
    assert list(table["layer"]) == [d["name"] for d in layers]
    assert list(table["decision"]) == [rule_figs.DECISIONS[d["compressed"]] for d in layers]
    assert list(table["n·m"]) == [d["rhs"] for d in layers] and list(table["r"]) == [d["r"] for d in layers]
    summary = apply_rule([(d["name"], d["shape"]) for d in layers], rank, rate)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Layers compressed"] == "6 / 12"
    assert metrics["Predicted compression ratio"] == f"{summary.predicted_ratio:.2f}×"
    assert any("each rank's dim-0 shard" in c.value for c in at.caption) and not at.warning

    at = _page(monkeypatch, hsdp_powersgd_run.parent, "pages/low_rank_error.py", hsdp_powersgd_run)
    cfg, names = run.config_dict(), lowrank.compressed_names(layers)
    assert next(w for w in at.selectbox if w.label == "Saved step").value == 4
    want = lowrank_figs.error_table(lowrank.step_errors(run.grads(4), names, cfg["random_seed"], lowrank.MAX_RANK,
                                                        cfg["orthogonalization_epsilon"]), 1)
    got = at.dataframe[0].value
    assert list(got["layer"]) == names == list(want["layer"])
    for col in ("optimum (SVD)", "PowerSGD (1 power iteration)"):
        assert list(got[col]) == pytest.approx(list(want[col]), rel=1e-9)
    measured = at.dataframe[2].value
    rows = lowrank.measured_rows(run.error_records())
    assert list(measured["name"]) == [r["name"] for r in rows]
    assert list(measured["rel_error"]) == [r["rel_error"] for r in rows]
    assert any("the layers here are those shards" in c.value for c in at.caption)


@pytest.mark.slow
def test_the_buckets_page_shows_a_sharded_runs_timeline_by_unit(monkeypatch, hsdp_powersgd_run):
    at = _page(monkeypatch, hsdp_powersgd_run.parent, "pages/buckets.py", hsdp_powersgd_run)
    assert any("has no DDP buckets" in m.value and "0, 2, 4" in m.value for m in at.markdown)
    traced = next(w for w in at.selectbox if w.label == "traced step")
    assert traced.options == ["1", "4"]
    traced.set_value("4").run()
    assert not at.exception, [e.value for e in at.exception]
    (figure,) = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert {t.get("name") for t in figure["data"]} >= {
        "forward", "backward", "FSDP's all-gather (a unit's parameters)", "FSDP's reduce-scatter (a unit's gradients)",
        "all-reduce between replicas (a unit's shard)", "lab's hook between replicas (a unit's gradients reduce-scattered)"}
    assert any("units, not buckets" in c.value for c in at.caption)


# --------------------------------------------------------------------------- the sweep's job axis
SWEEP = ["sweep", "--workload", "mlp", "--world-size", "4", "--hook", "powersgd", "--sharding", "hsdp,fsdp",
         "--matrix-approximation-rank", "1", "--start-powersgd-iter", "2", "--steps", "4", "--eval-every", "0",
         "--repeats", "1", "--max-repeats", "1", "--json"]
SWEPT = ["hsdp×2 allreduce", "hsdp×2 powersgd r=1 start=2", "fsdp allreduce"]


def test_a_sweep_over_sharding_plans_the_baselines_at_each_and_the_hook_where_it_runs(capsys):
    from commlab import cli

    assert cli.main([*SWEEP, "--dry-run"]) == 0
    # plain HSDP (the first listed: the baseline), PowerSGD between its replicas, FSDP (no replicas
    # for a hook: its plain run only)
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["runs"] == SWEPT
    assert cli.main([*SWEEP[:8], "fsdp", *SWEEP[9:], "--dry-run"]) == 2
    refused = json.loads(capsys.readouterr().out.splitlines()[-1])["errors"]
    assert list(refused) == ["sharding"] and refused["sharding"].startswith("powersgd runs at none of fsdp")


@pytest.mark.slow
def test_a_sweep_of_powersgd_between_replicas_against_plain_hsdp_and_fsdp_runs_and_names_each(tmp_path, capsys):
    from commlab import cli

    assert cli.main([*SWEEP, "--runs-dir", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    settings = {s["label"]: s for s in report["settings"]}
    assert list(settings) == SWEPT and all(s["finished"] == 1 for s in settings.values())
    assert [s["sharding"] for s in settings.values()] == ["hsdp", "hsdp", "fsdp"]
    assert [s["baseline"] for s in settings.values()] == [True, False, False]  # the first sharding's
    hsdp, psgd, fsdp = (settings[label]["bytes_per_step"] for label in SWEPT)
    # FSDP gathers twice and scatters once over 4 ranks; HSDP over 2 and all-reduces half the model;
    # PowerSGD (from step 2 of 4) sends less between the replicas
    assert fsdp == 513096 and hsdp == 453348 and psgd < hsdp
    assert settings[SWEPT[2]]["bytes_ratio"] == pytest.approx(hsdp / fsdp)
    assert {v["setting"] for v in report["recommendation"]["verdicts"]} == set(SWEPT[1:])
