"""commlab.hooks on real Gloo process groups, against PyTorch's hooks and against hand arithmetic.

Starting ranks is the expensive part, so a few jobs (2 or 3 forked ranks each) perform many checks
and report what they measured; the tests below judge those measurements.  A job that hangs is
killed after JOB_TIMEOUT_S, and collectives time out sooner, so a deadlock fails, never blocks.
"""
import inspect
import json
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as stock
from torch.nn.parallel import DistributedDataParallel as DDP

from commlab import cli
from commlab.config import RunConfig
from commlab.engine.ranks import run_ranks
from commlab.hook_specs import HOOKS, POWERSGD_SETTINGS, SPECS, WRAPPERS
from commlab.hooks import compress, powersgd, registry

# Unloaded, a job takes seconds; these only bound a hang, generously, as this machine is often
# shared.  JOB_TIMEOUT_S stays below the per-test timeout (fixture setup included) so that the
# message names the hung job.
pytestmark = pytest.mark.timeout(900)
JOB_TIMEOUT_S = 840
COLLECTIVE_TIMEOUT_S = 60
STEPS = 20

# --------------------------------------------------------------------------- spawning


def _rank_job(rank, world_size, report, job):
    report((rank, job(rank, world_size)))


def _run_job(job, world_size) -> list[dict]:
    """Run ``job(rank, world_size)`` on real Gloo ranks (the engine's one rank harness); return
    each rank's results in rank order; no process is left, whatever happens.

    The harness forks the ranks from one launcher that imports torch, and torch._dynamo (DDP's
    constructor imports it), once: each fresh interpreter would cost seconds of CPU here."""
    try:
        reports = run_ranks(_rank_job, world_size, (job,), timeout_s=JOB_TIMEOUT_S,
                            collective_timeout_s=COLLECTIVE_TIMEOUT_S, preload=("torch._dynamo",))
    except TimeoutError:
        pytest.fail(f"{job.__name__} on {world_size} ranks still running after {JOB_TIMEOUT_S} s: "
                    "a hang")
    return [result for _, result in sorted(reports, key=lambda r: r[0])]


# --------------------------------------------------------------------------- what ranks run


def _mlp() -> nn.Module:
    # Two 32x32 layers give batch_tensors_with_same_shape something to stack; with rank 4 the
    # 8x32 layer stays uncompressed by the rule, and the biases always do.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 8))


def _step(ddp: DDP, rank: int, step: int) -> None:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(8, 32, generator=g), torch.randn(8, 8, generator=g)
    nn.functional.mse_loss(ddp(x), y).backward()


def _counting(hook, seen: set):
    """``hook``, noting which bucket indices it was called with."""
    def counted(state, bucket):
        seen.add(bucket.index())
        return hook(state, bucket)
    return counted


def _recording(hook, log: list):
    """``hook``, noting each bucket's buffer before the hook and the tensor its future returns."""
    def recorded(state, bucket):
        entry = {"in": bucket.buffer().clone()}
        log.append(entry)

        def keep(fut):
            entry["out"] = fut.value().clone()
            return fut.value()
        return hook(state, bucket).then(keep)
    return recorded


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference relative to the largest magnitude of ``b``."""
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _psgd_state(**kw) -> stock.PowerSGDState:
    return stock.PowerSGDState(None, random_seed=kw.pop("random_seed", 3), **kw)


EQUIVALENCE = [
    dict(start_powerSGD_iter=s, use_error_feedback=ef, warm_start=ws, matrix_approximation_rank=r)
    for s in (2, 7) for ef in (True, False) for ws in (True, False) for r in (1, 4)
] + [
    dict(start_powerSGD_iter=2, use_error_feedback=ef, warm_start=ws, matrix_approximation_rank=4,
         batch_tensors_with_same_shape=True)
    for ef, ws in ((True, True), (False, False))
]
# fp16_compress_wrapper is PyTorch's in both models: it is what the registry picks on Gloo.
EQUIVALENCE_FP16 = [dict(start_powerSGD_iter=2, matrix_approximation_rank=4)]
# torch 2.13 compresses a vector of length k as a k x 1 matrix when (k + 1) * rate < k.
EQUIVALENCE_RATE_BELOW_ONE = dict(start_powerSGD_iter=2, matrix_approximation_rank=1,
                                  min_compression_rate=0.5)


def _compare_with_stock(rank: int, settings: dict, wrap=lambda hook: hook) -> dict:
    """Train PyTorch's and commlab's PowerSGD side by side on one bucket; compare every gradient."""
    models = [DDP(_mlp()), DDP(_mlp())]
    states = [_psgd_state(**settings), _psgd_state(**settings)]
    buckets = [set(), set()]
    for ddp, state, hook, seen in zip(models, states, (stock.powerSGD_hook, powersgd.powerSGD_hook),
                                      buckets):
        ddp.register_comm_hook(state, _counting(wrap(hook), seen))
    optims = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    worst = 0.0
    for step in range(STEPS):
        for ddp, opt in zip(models, optims):
            opt.zero_grad()
            _step(ddp, rank, step)
        for p_stock, p_ours in zip(models[0].parameters(), models[1].parameters()):
            worst = max(worst, _rel(p_ours.grad, p_stock.grad))
        for opt in optims:
            opt.step()
    return {"settings": settings, "worst_rel": worst, "buckets": [len(b) for b in buckets],
            "stats": [list(s.compression_stats()) for s in states], "iters": [s.iter for s in states]}


def _bf16_by_hand(rank: int, world_size: int) -> dict:
    """commlab's bf16 hook and wrapper against cast, divide, allreduce, cast back done by hand."""
    out = {}
    for name, hook in (("hook", compress.bf16_compress_hook),
                       ("wrapper", compress.bf16_compress_wrapper(default_hooks.allreduce_hook))):
        ddp, log = DDP(_mlp()), []
        ddp.register_comm_hook(None, _recording(hook, log))
        worst, differs_from_fp32 = 0.0, False
        for step in range(3):
            log.clear()
            ddp.zero_grad()
            _step(ddp, rank, step)
            for entry in log:
                inputs = [torch.empty_like(entry["in"]) for _ in range(world_size)]
                dist.all_gather(inputs, entry["in"])
                expected = sum(t.to(torch.bfloat16) / world_size for t in inputs).float()
                worst = max(worst, _rel(entry["out"].float(), expected))
                exact = sum(t / world_size for t in inputs)
                differs_from_fp32 |= not torch.equal(entry["out"].float(), exact)
        out[name] = {"worst_rel": worst, "differs_from_fp32": differs_from_fp32,
                     "dtype": str(log[0]["out"].dtype)}
    try:
        DDP(_mlp()).register_comm_hook(None, default_hooks.bf16_compress_hook)
        out["stock_refused"] = None
    except TypeError as e:
        out["stock_refused"] = str(e)
    return out


def _orth(a: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt on the columns."""
    a = a.clone()
    for i in range(a.shape[1]):
        a[:, i] /= a[:, i].norm()
        a[:, i + 1:] -= a[:, i:i + 1] * (a[:, i:i + 1] * a[:, i + 1:]).sum(0, keepdim=True)
    return a


def _batched_reference(steps_inputs, world_size, approx_rank, start, error_feedback, warm_start,
                       seed):
    """The documented batched PowerSGD, in float64, from every rank's bucket at every step."""
    rng = np.random.RandomState(seed)
    errors, q, outs = None, None, []
    for step, inputs in enumerate(steps_inputs):
        if step < start:
            outs.append(sum(t.double() for t in inputs) / world_size)
            continue
        length = inputs[0].numel()
        side = math.ceil(math.sqrt(length))  # square, padded with zeros
        ms = []
        for r, t in enumerate(inputs):
            m = torch.zeros(side * side, dtype=torch.float64)
            m[:length] = t
            if error_feedback and errors is not None:
                m += errors[r]
            ms.append(m.view(side, side))
        if q is None or not warm_start:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(rng.randint(1_000_000_000))
                q = torch.randn(side, approx_rank).double()
        q = _orth(q)
        p = _orth(sum(m @ q for m in ms))
        q = sum(m.t() @ p for m in ms) / world_size
        approx = p @ q.t()
        errors = [(m - approx).flatten() for m in ms]
        outs.append(approx.flatten()[:length])
    return outs


def _batched_by_hand(rank: int, world_size: int) -> list[dict]:
    results = []
    for ef, warm in ((True, True), (False, False)):
        settings = dict(start_powerSGD_iter=2, matrix_approximation_rank=2, use_error_feedback=ef,
                        warm_start=warm, random_seed=5)
        ddp, log = DDP(_mlp()), []
        ddp.register_comm_hook(_psgd_state(**settings), _recording(powersgd.batched_powerSGD_hook, log))
        steps_inputs, outputs = [], []
        for step in range(6):
            log.clear()
            ddp.zero_grad()
            _step(ddp, rank, step)
            (entry,) = log  # one bucket
            inputs = [torch.empty_like(entry["in"]) for _ in range(world_size)]
            dist.all_gather(inputs, entry["in"])
            steps_inputs.append(inputs)
            outputs.append(entry["out"])
        expected = _batched_reference(steps_inputs, world_size, 2, 2, ef, warm, 5)
        results.append({"settings": settings, "length": steps_inputs[0][0].numel(),
                        "worst_rel": max(_rel(o, e) for o, e in zip(outputs, expected))})
    return results


MULTI_BUCKET = [
    dict(hook="powersgd"),
    dict(hook="powersgd", warm_start=False, batch_tensors_with_same_shape=True),
    dict(hook="powersgd", wrapper="fp16"),
    dict(hook="powersgd", wrapper="bf16"),
    dict(hook="batched_powersgd"),
    dict(hook="batched_powersgd", wrapper="bf16"),
]


def _multi_bucket(rank: int, world_size: int) -> list[dict]:
    """The registry's choice on Gloo, several buckets: it must finish and keep replicas identical."""
    results = []
    for overrides in MULTI_BUCKET:
        cfg = RunConfig(start_powerSGD_iter=2, matrix_approximation_rank=2, bucket_cap_mb=0.001,
                        **overrides)
        choice = registry.choose(cfg, "gloo")
        ddp, seen = DDP(_mlp(), bucket_cap_mb=cfg.bucket_cap_mb), set()
        ddp.register_comm_hook(choice.state, _counting(choice.hook, seen))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(8):
            opt.zero_grad()
            _step(ddp, rank, step)
            opt.step()
        flat = torch.cat([p.detach().flatten() for p in ddp.parameters()])
        replicas = [torch.empty_like(flat) for _ in range(world_size)]
        dist.all_gather(replicas, flat)
        results.append({"config": overrides, "impl": choice.impl, "buckets": len(seen),
                        "iter": choice.state.iter, "rate": choice.state.compression_stats()[0],
                        "finite": bool(flat.isfinite().all()),
                        "replicas_equal": all(torch.equal(r, replicas[0]) for r in replicas)})
    return results


def equivalence_job(rank: int, world_size: int) -> dict:
    return {
        "equivalence": [_compare_with_stock(rank, s) for s in EQUIVALENCE],
        "equivalence_fp16": [_compare_with_stock(rank, s, default_hooks.fp16_compress_wrapper)
                             for s in EQUIVALENCE_FP16],
        "equivalence_rate_below_one": _compare_with_stock(rank, EQUIVALENCE_RATE_BELOW_ONE),
    }


def two_rank_job(rank: int, world_size: int) -> dict:
    return {
        "bf16": _bf16_by_hand(rank, world_size),
        "batched": _batched_by_hand(rank, world_size),
        "multi_bucket": _multi_bucket(rank, world_size),
    }


def three_rank_job(rank: int, world_size: int) -> dict:
    return {"multi_bucket": _multi_bucket(rank, world_size)}


@pytest.fixture(scope="module")
def equivalence():
    return _run_job(equivalence_job, 2)


@pytest.fixture(scope="module")
def two_ranks():
    return _run_job(two_rank_job, 2)


# --------------------------------------------------------------------------- equivalence


def _assert_equivalent(result):
    assert result["buckets"] == [1, 1], "the comparison is only meaningful on one bucket"
    assert result["worst_rel"] <= 1e-6, result
    assert result["stats"][0] == result["stats"][1], result
    assert result["iters"] == [STEPS, STEPS]


@pytest.mark.slow
def test_powersgd_matches_pytorch_on_one_bucket(equivalence):
    for rank_results in equivalence:
        assert len(rank_results["equivalence"]) == len(EQUIVALENCE)
        for result in rank_results["equivalence"]:
            _assert_equivalent(result)


@pytest.mark.slow
def test_fp16_wrapped_powersgd_matches_pytorch_on_one_bucket(equivalence):
    for rank_results in equivalence:
        for result in rank_results["equivalence_fp16"]:
            _assert_equivalent(result)


@pytest.mark.slow
def test_powersgd_matches_pytorch_with_min_compression_rate_below_one(equivalence):
    for rank_results in equivalence:
        _assert_equivalent(rank_results["equivalence_rate_below_one"])


# --------------------------------------------------------------------------- by hand


@pytest.mark.slow
def test_bf16_hook_and_wrapper_equal_cast_divide_allreduce_cast_back(two_ranks):
    for rank_results in two_ranks:
        bf16 = rank_results["bf16"]
        for name in ("hook", "wrapper"):
            assert bf16[name]["worst_rel"] == 0.0, bf16
            assert bf16[name]["differs_from_fp32"], "bfloat16 rounding should show"
        assert bf16["hook"]["dtype"] == "torch.float32"  # cast back into the bucket
        assert bf16["wrapper"]["dtype"] == "torch.bfloat16"  # PyTorch's wrapper hands back bf16 too


@pytest.mark.slow
def test_pytorch_bf16_hook_is_refused_on_cpu_but_commlab_is_not(two_ranks):
    # The registry's reason for commlab's bf16 hook; commlab's registered above without complaint.
    refusal = two_ranks[0]["bf16"]["stock_refused"]
    assert refusal is not None and "BF16 all reduce communication hook" in refusal
    assert compress.bf16_compress_hook.__name__ not in ("bf16_compress_hook",
                                                        "bf16_compress_wrapper_hook")


@pytest.mark.slow
def test_batched_powersgd_equals_documented_algorithm(two_ranks):
    for rank_results in two_ranks:
        for result in rank_results["batched"]:
            side = math.ceil(math.sqrt(result["length"]))
            assert side * side > result["length"], "the test should exercise zero padding"
            assert result["worst_rel"] <= 1e-5, result


def test_pytorch_batched_hook_cause_still_holds():
    # PyTorch's batched hook hands _orthogonalize a 2-D matrix; the registry relies on this failing.
    with pytest.raises(AssertionError):
        stock._orthogonalize(torch.randn(6, 2))


# --------------------------------------------------------------------------- several buckets


def _assert_multi_bucket(results):
    assert [r["config"] for r in results] == MULTI_BUCKET
    for r in results:
        assert r["impl"] == "commlab", r
        assert r["buckets"] >= 3, r
        assert r["iter"] == 8 and r["rate"] > 1, r  # counted steps once per step, and compressed
        assert r["finite"] and r["replicas_equal"], r


@pytest.mark.slow
def test_multi_bucket_two_ranks(two_ranks):
    for rank_results in two_ranks:
        _assert_multi_bucket(rank_results["multi_bucket"])


@pytest.mark.slow
def test_multi_bucket_three_ranks():
    for rank_results in _run_job(three_rank_job, 3):
        _assert_multi_bucket(rank_results["multi_bucket"])


# --------------------------------------------------------------------------- the registry


def _plan(backend, **kw):
    return registry.plan(RunConfig(**kw), backend)[0]


@pytest.mark.parametrize("kw", [dict(hook="allreduce"), dict(hook="fp16"), dict(hook="noop"),
                                dict(hook="allreduce", wrapper="fp16")])
def test_plan_auto_keeps_pytorch_hooks_that_work_everywhere(kw):
    assert _plan("gloo", **kw) == _plan("nccl", **kw) == "stock"


@pytest.mark.parametrize("kw, gloo, nccl", [
    (dict(hook="powersgd"), "commlab", "stock"),
    (dict(hook="powersgd", wrapper="fp16"), "commlab", "stock"),
    (dict(hook="powersgd", wrapper="bf16"), "commlab", "stock"),
    (dict(hook="bf16"), "commlab", "stock"),
    (dict(hook="allreduce", wrapper="bf16"), "commlab", "stock"),
    (dict(hook="batched_powersgd"), "commlab", "commlab"),
    (dict(hook="batched_powersgd", wrapper="fp16"), "commlab", "commlab"),
])
def test_plan_auto_swaps_in_commlab_where_pytorch_fails(kw, gloo, nccl):
    assert _plan("gloo", **kw) == gloo
    assert _plan("nccl", **kw) == nccl


def test_plan_forced_impls():
    assert _plan("gloo", hook="powersgd", impl="stock") == "stock"
    assert _plan("gloo", hook="batched_powersgd", impl="stock") == "stock"
    assert _plan("nccl", hook="powersgd", impl="commlab") == "commlab"
    impl, reason = registry.plan(RunConfig(hook="allreduce", impl="commlab"), "gloo")
    assert impl == "stock" and "no variant" in reason  # nothing to make safe
    assert _plan("gloo", hook="allreduce", wrapper="bf16", impl="commlab") == "commlab"


def test_plan_rejects_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        registry.plan(RunConfig(), "mpi")


def _inner(wrapped):
    return inspect.getclosurevars(wrapped).nonlocals["hook"]


def test_choose_builds_state_and_hook():
    cfg = RunConfig(hook="powersgd", wrapper="fp16", matrix_approximation_rank=3,
                    start_powerSGD_iter=5, min_compression_rate=1.5, use_error_feedback=False,
                    warm_start=True, orthogonalization_epsilon=1e-8, random_seed=7,
                    batch_tensors_with_same_shape=True)
    choice = registry.choose(cfg, "gloo")
    assert (choice.impl, choice.name) == ("commlab", "fp16_compress_wrapper(powerSGD_hook)")
    assert choice.reason == registry.plan(cfg, "gloo")[1]
    # PyTorch's fp16 wrapper is already safe: it wraps commlab's PowerSGD.
    assert choice.hook.__name__ == "fp16_compress_wrapper_hook"
    assert _inner(choice.hook) is powersgd.powerSGD_hook
    state = choice.state
    assert isinstance(state, stock.PowerSGDState) and state.process_group is None
    for name in POWERSGD_SETTINGS:
        if name != "random_seed":
            assert getattr(state, name) == getattr(cfg, name), name
    assert state.rng.randint(1 << 30) == np.random.RandomState(7).randint(1 << 30)

    on_nccl = registry.choose(cfg, "nccl")
    assert on_nccl.impl == "stock" and _inner(on_nccl.hook) is stock.powerSGD_hook


@pytest.mark.parametrize("kw, backend, hook", [
    (dict(hook="allreduce"), "gloo", default_hooks.allreduce_hook),
    (dict(hook="allreduce", impl="commlab"), "gloo", default_hooks.allreduce_hook),
    (dict(hook="bf16"), "gloo", compress.bf16_compress_hook),
    (dict(hook="bf16"), "nccl", default_hooks.bf16_compress_hook),
    (dict(hook="powersgd", impl="stock"), "gloo", stock.powerSGD_hook),
    (dict(hook="batched_powersgd"), "nccl", powersgd.batched_powerSGD_hook),
])
def test_choose_picks_the_function(kw, backend, hook):
    choice = registry.choose(RunConfig(**kw), backend, process_group="pg")
    assert choice.hook is hook
    if kw["hook"] in ("powersgd", "batched_powersgd"):
        assert choice.state.process_group == "pg"
    else:
        assert choice.state == "pg"


def test_choose_wraps_with_commlab_bf16_wrapper_on_gloo():
    choice = registry.choose(RunConfig(hook="batched_powersgd", wrapper="bf16"), "gloo")
    assert choice.hook.__name__ not in ("bf16_compress_wrapper_hook",)  # DDP would refuse it
    assert _inner(choice.hook) is powersgd.batched_powerSGD_hook


def test_support_table():
    for backend in registry.BACKENDS:
        rows = registry.support_table(backend)
        # none wrap noop, nor the hooks that pick their own wire format
        unwrapped = [h for h, s in SPECS.items() if not s.wrappable]
        assert len(rows) == len(HOOKS) * len(WRAPPERS) - (len(WRAPPERS) - 1) * len(unwrapped)
        assert all(r["why"] and r["auto_impl"] in ("stock", "commlab") for r in rows)
    gloo = {(r["hook"], r["wrapper"]): r for r in registry.support_table("gloo")}
    nccl = {(r["hook"], r["wrapper"]): r for r in registry.support_table("nccl")}
    assert gloo["powersgd", "none"]["stock_works"] == registry.ONE_BUCKET_ONLY
    assert gloo["powersgd", "fp16"]["stock_works"] == registry.ONE_BUCKET_ONLY
    assert gloo["powersgd", "bf16"]["stock_works"] is False
    assert gloo["bf16", "none"]["stock_works"] is False
    assert gloo["allreduce", "fp16"]["stock_works"] is True
    assert nccl["powersgd", "bf16"] == {**nccl["powersgd", "bf16"], "stock_works": True,
                                        "auto_impl": "stock"}
    assert gloo["batched_powersgd", "none"]["stock_works"] is nccl["batched_powersgd", "none"][
        "stock_works"] is False
    assert all(r["auto_impl"] == "commlab" for r in gloo.values() if r["stock_works"] is not True)


def test_stock_warning():
    stock_psgd = RunConfig(hook="powersgd", impl="stock")
    warning = registry.stock_warning(stock_psgd, "gloo")
    assert "deadlock" in warning and "bucket_cap_mb" in warning and "impl=auto" in warning
    assert registry.stock_warning(stock_psgd, "nccl") is None
    assert registry.stock_warning(RunConfig(hook="powersgd"), "gloo") is None
    assert "refuses" in registry.stock_warning(RunConfig(hook="bf16", impl="stock"), "gloo")
    batched = registry.stock_warning(RunConfig(hook="batched_powersgd", impl="stock",
                                               start_powerSGD_iter=9), "nccl")
    assert "AssertionError" in batched and "step 9" in batched
    assert registry.stock_warning(RunConfig(hook="allreduce", impl="stock"), "gloo") is None


# --------------------------------------------------------------------------- the command


def test_hooks_command_json(capsys):
    assert cli.main(["hooks", "--backend", "gloo", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert payload["backend"] == "gloo"
    assert payload["hooks"] == registry.support_table("gloo")


def test_hooks_command_text(capsys):
    assert cli.main(["hooks", "--backend", "nccl"]) == 0
    text = capsys.readouterr().out
    assert "batched_powerSGD_hook" in text and "nccl" in text and "commlab" in text
