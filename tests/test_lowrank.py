"""Invariants of commlab.analysis.lowrank, in float64, and its reproduction of PowerSGD's hooks on one matrix."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as stock
from torch.nn.parallel import DistributedDataParallel as DDP

from commlab.analysis import lowrank
from commlab.analysis.metrics import relative_error
from commlab.hooks import powersgd as ours


def decaying(n: int, m: int, seed: int = 0, decay: float = 0.8) -> torch.Tensor:
    """A float64 matrix with distinct singular values decaying geometrically, like a gradient's."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))
    k = min(n, m)
    return u[:, :k] @ torch.diag(decay ** torch.arange(k, dtype=torch.float64)) @ v[:, :k].T


@pytest.mark.parametrize("n, m", [(40, 30), (30, 40), (12, 12)])
def test_optimum_is_the_truncated_svd(n, m):
    matrix = decaying(n, m)
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    ranks = list(range(1, min(n, m) + 1))
    truncated = [relative_error(u[:, :r] @ torch.diag(s[:r]) @ vh[:r], matrix) for r in ranks]
    assert lowrank.optimum_errors(lowrank.singular_values(matrix), ranks) == pytest.approx(truncated, abs=1e-12)


def test_errors_fall_with_rank_and_vanish_at_full_rank():
    le = lowrank.layer_error("w", decaying(40, 30).float(), random_seed=3)
    assert le.ranks == list(range(1, 31))
    assert all(a > b for a, b in zip(le.optimum, le.optimum[1:]))
    # Each rank draws its own Q, so PowerSGD's curve need not fall at every step; its trend must.
    assert le.power[-1] < le.power[len(le.power) // 2] < le.power[0]
    assert le.optimum[-1] == pytest.approx(0, abs=1e-12)
    assert le.power[-1] == pytest.approx(0, abs=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_optimum_never_exceeds_power_iteration(seed):
    matrix = decaying(24, 50, seed, decay=0.9)
    ranks = range(1, 25)
    optimum = lowrank.optimum_errors(lowrank.singular_values(matrix), ranks)
    power = lowrank.power_errors(matrix, ranks, lowrank.seeds(seed, 1)[0])
    assert all(o <= p + 1e-12 for o, p in zip(optimum, power))


def test_warm_start_refines_a_fixed_matrix_towards_the_optimum():
    matrix = decaying(60, 40, decay=0.5).float()
    ws = lowrank.warm_start("w", {s: matrix for s in range(12)}, rank=2)
    assert ws.optimum == pytest.approx([ws.optimum[0]] * 12)
    assert all(a >= b - 1e-12 for a, b in zip(ws.warm, ws.warm[1:]))  # subspace iteration
    assert ws.warm[-1] == pytest.approx(ws.optimum[-1], rel=1e-6)
    assert ws.warm[0] == ws.cold[0]  # the same first seed


def test_warm_errors_by_rank_end_the_warm_chains():
    matrices = {s: decaying(30, 20, seed=s, decay=0.6).float() for s in (4, 5, 6)}
    by_rank = lowrank.warm_errors_by_rank(matrices, random_seed=2, max_rank=32)
    assert len(by_rank) == 20
    for r in (1, 3, 20):
        assert by_rank[r - 1] == pytest.approx(lowrank.warm_start("w", matrices, r, 2).warm[-1], rel=1e-12)
    # One step: warm start has carried nothing, it is the fresh-Q curve.
    single = lowrank.warm_errors_by_rank({4: matrices[4]}, random_seed=2)
    assert single == pytest.approx(lowrank.layer_error("w", matrices[4], random_seed=2).power, rel=1e-12)


def test_shapes_seeds_and_helpers():
    assert lowrank.as_matrix(torch.ones(16, 1, 3, 3)).shape == (16, 9)
    assert lowrank.as_matrix(torch.ones(3, 4)).dtype == torch.float64
    state = stock.PowerSGDState(None, random_seed=11)
    assert lowrank.seeds(11, 3) == [state.rng.randint(1_000_000_000) for _ in range(3)]
    assert lowrank.optimum_errors(torch.zeros(4), [1, 2]) == [0.0, 0.0]
    le = lowrank.layer_error("w", decaying(10, 64).float(), max_rank=32)
    assert le.ranks == list(range(1, 11)) and le.at(32) == le.at(10)
    assert lowrank.consecutive_chain([8, 9, 10, 14, 15], 9) == [8, 9, 10]
    assert lowrank.consecutive_chain([8, 9, 10, 14, 15], 15) == [14, 15]
    assert lowrank.consecutive_chain([3], 3) == [3]
    records = [{"step": 4, "layers": [{"bucket": 1, "layer": "0.weight", "rel_error": 0.5}],
                "buckets": [{"bucket": 1, "rel_error": 0.4}], "ef_residual_norm": 2.0},
               {"step": 8, "layers": [], "buckets": [], "ef_residual_norm": None}]
    assert lowrank.measured_rows(records) == [
        {"step": 4, "scope": "layer", "name": "0.weight", "bucket": 1, "rel_error": 0.5},
        {"step": 4, "scope": "bucket", "name": "bucket 1", "bucket": 1, "rel_error": 0.4}]
    assert lowrank.ef_residual_norms(records) == [(4, 2.0)]
    assert lowrank.compressed_names([{"name": "a", "compressed": True},
                                     {"name": "b", "compressed": False}]) == ["a"]
    layers = [{"name": "w", "shape": [4, 3], "compressed": False},
              {"name": "b", "shape": [4], "compressed": False}]
    assert lowrank.layers_to_analyse(layers) == (["w"], True)  # nothing compressed: every matrix
    layers[0]["compressed"] = True
    assert lowrank.layers_to_analyse(layers) == (["w"], False)


# ------------------------------------------------------------------ against the hooks themselves
@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def hook_outputs(hook, rank: int, warm: bool, inputs: list[torch.Tensor], random_seed: int = 5):
    """What DDP hands back as the weight's gradient at each step, and the exact gradient.

    One process: the hook's allreduces change nothing, so PowerSGD acts on the local gradient.
    Error feedback is off; warm start needs start_powerSGD_iter >= 2, so with it the first two
    steps are plain allreduce and the comparison starts at the third.
    """
    torch.manual_seed(0)
    model = torch.nn.Linear(40, 30)
    reference = torch.nn.Linear(40, 30)
    reference.load_state_dict(model.state_dict())
    ddp = DDP(model)
    start = 2 if warm else 0
    ddp.register_comm_hook(stock.PowerSGDState(
        None, matrix_approximation_rank=rank, start_powerSGD_iter=start, use_error_feedback=False,
        warm_start=warm, random_seed=random_seed), hook)
    outs, exact = [], []
    for step, x in enumerate(inputs):
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        ddp(x).pow(2).sum().backward()
        reference(x).pow(2).sum().backward()
        if step >= start:
            outs.append(model.weight.grad.double().clone())
            exact.append(reference.weight.grad.clone())
    return outs, exact


@pytest.mark.parametrize("hook", [stock.powerSGD_hook, ours.powerSGD_hook], ids=["stock", "commlab"])
@pytest.mark.parametrize("rank", [1, 3])  # Gram–Schmidt up to rank 2, QR above
def test_one_power_iteration_is_what_the_hook_sends(one_process_group, hook, rank):
    inputs = [torch.randn(8, 40, generator=torch.Generator().manual_seed(s)) for s in range(5)]
    for warm in (False, True):
        outs, exact = hook_outputs(hook, rank, warm, inputs)
        grads = dict(enumerate(exact))
        seeds = lowrank.seeds(5, len(exact))
        q = lowrank.random_q(40, rank, seeds[0])
        for i, (out, grad) in enumerate(zip(outs, exact)):
            if not warm:
                q = lowrank.random_q(40, rank, seeds[i])
            approx, q = lowrank.power_step(lowrank.as_matrix(grad), q)
            # The hook works in float32, the reproduction in float64.
            torch.testing.assert_close(out, approx, rtol=1e-4, atol=1e-5)
        ws = lowrank.warm_start("weight", grads, rank, random_seed=5)
        measured = [relative_error(o, lowrank.as_matrix(g)) for o, g in zip(outs, exact)]
        assert (ws.warm if warm else ws.cold) == pytest.approx(measured, rel=1e-4, abs=1e-6)
        if not warm:
            first = lowrank.layer_error("weight", exact[0], random_seed=5, max_rank=rank)
            assert first.at(rank)[1] == pytest.approx(measured[0], rel=1e-4)
