"""PowerSGD's pitfalls (commlab.hooks.pitfalls): both built on a one-process state, with PyTorch's
own orthogonalization, and the zero-gradient one in a real 2-rank Gloo run."""
import json

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, _orthogonalize

from commlab.api import RunConfig, run
from commlab.engine import run_folder, store
from commlab.hooks import pitfalls
from commlab.ui import lowrank_view, runs


def _compress(state: PowerSGDState, index: int, grads: dict[str, torch.Tensor]) -> torch.Tensor:
    """One compressed step of the layer-wise hook on one rank, into the state's memories, as
    ``commlab.hooks.powersgd._powersgd`` does it (every tensor here is compressed, one by one)."""
    flat = torch.cat([g.reshape(-1) for g in grads.values()])
    ps, qs, outs = [], [], []
    g = torch.Generator().manual_seed(0)
    for m in grads.values():
        r = min(*m.shape, state.matrix_approximation_rank)
        q = torch.randn(m.shape[1], r, generator=g)
        _orthogonalize(q.unsqueeze(0), state.orthogonalization_epsilon)
        p = m @ q
        _orthogonalize(p.unsqueeze(0), state.orthogonalization_epsilon)
        q = m.t() @ p
        ps.append(p.reshape(-1))
        qs.append(q.reshape(-1))
        outs.append((p @ q.t()).reshape(-1))
    out = torch.cat(outs)
    state.p_memory_dict[index], state.q_memory_dict[index] = torch.cat(ps), torch.cat(qs)
    state.error_dict[index] = flat - out
    return out


def _layout(index: int, grads: dict[str, torch.Tensor]) -> dict:
    return {"index": index, "params": [{"name": n, "shape": list(t.shape), "numel": t.numel()}
                                       for n, t in grads.items()]}


def _state(rank: int, epsilon: float, error_feedback: bool = True) -> PowerSGDState:
    return PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2,
                         orthogonalization_epsilon=epsilon, use_error_feedback=error_feedback)


def test_a_zero_gradient_with_epsilon_0_is_named_with_its_fix_and_1e_8_avoids_it():
    grads = {"fine.weight": torch.randn(16, 12), "dead.weight": torch.zeros(16, 12)}
    state = _state(1, 0.0)
    _compress(state, 0, grads)
    watch = pitfalls.Watch(state, layerwise=True)
    found = watch.after_step(7, [_layout(0, grads)], [], loss_finite=True)
    assert [(f["step"], f["layer"], f["kind"]) for f in found] == [(7, "dead.weight", pitfalls.ZERO_GRADIENT)]
    assert found[0]["fix"] == "set orthogonalization_epsilon=1e-08"
    assert watch.after_step(8, [_layout(0, grads)], [], True) == []  # once per layer and kind
    assert "dead.weight at step 7: set orthogonalization_epsilon=1e-08" in watch.reason()

    safe = _state(1, pitfalls.EPSILON)
    out = _compress(safe, 0, grads)
    assert torch.isfinite(out).all()
    assert pitfalls.Watch(safe, layerwise=True).after_step(7, [_layout(0, grads)], [], True) == []


def test_nan_from_a_model_that_diverged_by_itself_is_no_pitfall():
    grads = {"w": torch.full((16, 12), float("nan"))}
    state = _state(1, 0.0)
    _compress(state, 0, grads)
    assert pitfalls.Watch(state, layerwise=True).after_step(3, [_layout(0, grads)], [], False) == []


@pytest.mark.parametrize(("epsilon", "rel"), [(0.0, float("nan")), (0.0, 1.0), (1e-8, 0.995)])
def test_a_gradient_of_rank_below_the_rank_is_caught_by_the_exact_comparison(epsilon, rel):
    """The measured symptoms (issue 10): NaN or ~2x the mean (relative error ~1) with epsilon 0,
    1.02-1.98x with 1e-8; a fair approximation (0.5) is no pitfall."""
    grads = {"low.weight": torch.outer(torch.randn(10), torch.randn(48))}  # rank 1, at rank 2
    state = _state(2, epsilon, error_feedback=False)
    layout = [_layout(0, grads)]
    assert pitfalls.Watch(state, layerwise=True).after_step(
        5, layout, [{"bucket": 0, "layer": "low.weight", "rel_error": 0.5}], True) == []
    rows = [{"bucket": 0, "layer": "low.weight", "rel_error": rel}]
    found = pitfalls.Watch(state, layerwise=True).after_step(5, layout, rows, loss_finite=True)
    assert [(f["step"], f["layer"], f["kind"]) for f in found] == [(5, "low.weight", pitfalls.LOW_RANK)]
    assert "lower matrix_approximation_rank below 2" in found[0]["fix"]
    assert "min_compression_rate >= 4.14" in found[0]["fix"]  # 10*48 / ((10+48)*2)
    assert ("orthogonalization_epsilon=1e-08" in found[0]["fix"]) == (epsilon == 0)
    # With error feedback, last step's error makes a relative error above 1 normal: NaN counts
    with_ef = pitfalls.Watch(_state(2, epsilon), layerwise=True).after_step(5, layout, rows, True)
    assert bool(with_ef) == (rel != rel)


def test_the_nan_memory_of_a_rank_deficient_layer_is_told_from_a_zero_one():
    rows = torch.randn(48).expand(10, 48).clone()  # identical rows
    grads = {"same.weight": rows}
    state = _state(2, 0.0)
    _compress(state, 0, grads)
    found = pitfalls.Watch(state, layerwise=True).after_step(4, [_layout(0, grads)], [], True)
    if found:  # Gram-Schmidt's residue is exactly zero here, or rounding noise (then ~2x: no NaN)
        assert [f["kind"] for f in found] == [pitfalls.LOW_RANK]


def test_p_slices_follow_the_hooks_grouping_by_shape():
    shapes = [(16, 12), (7,), (8, 40), (16, 12)]  # the vector is left uncompressed
    assert pitfalls.p_slices(shapes, 2, 2.0) == {0: (0, 16, 2), 3: (32, 16, 2), 2: (64, 8, 2)}


def test_pitfalls_reads_records_and_skips_damaged_lines(tmp_path):
    folder = run_folder.RunFolder(tmp_path)
    assert folder.pitfalls() == []
    rec = {"step": 3, "layer": "side.weight", "kind": pitfalls.ZERO_GRADIENT, "detail": "d", "fix": "f"}
    (tmp_path / store.PITFALLS).write_text(json.dumps(rec) + "\nnot json\n" + json.dumps({"step": "x"}) + "\n")
    assert folder.pitfalls() == [rec]


class _SideInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(8, 16)
        self.side = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.head(torch.relu(self.trunk(x[:, :8]) + self.side(x[:, 8:])))


def zero_side_input(rank=0, seed=0):
    """The side input is all zeros at step 2, the first compressed step (no error memory yet),
    on every rank: side.weight's gradient is zero then."""
    torch.manual_seed(seed)
    model = _SideInput()

    def batches():
        g = torch.Generator().manual_seed(rank)
        step = 0
        while True:
            x = torch.randn(8, 24, generator=g)
            if step == 2:
                x[:, 8:] = 0
            step += 1
            yield x, torch.randn(8, 1, generator=g)
    return model, batches


@pytest.mark.slow
def test_a_real_run_names_the_zero_gradient_layer_and_the_fix(tmp_path):
    r = run(RunConfig(workload="tests.test_pitfalls:zero_side_input", steps=8, world_size=2,
                      hook="powersgd", start_powerSGD_iter=2, orthogonalization_epsilon=0.0,
                      error_every=1, eval_every=0, runs_dir=str(tmp_path)), timeout=120)
    found = run_folder.RunFolder(r.path).pitfalls()
    assert found and found[0]["layer"] == "side.weight" and found[0]["step"] == 2, found
    assert found[0]["kind"] == pitfalls.ZERO_GRADIENT
    rec = r.status_record()
    assert rec["status"] == "diverged" and rec["step"] == 3, rec
    assert "in layer side.weight at step 2: set orthogonalization_epsilon=1e-08" in rec["error"], rec
    shown = runs.LiveView(r.path).pitfalls()  # what the live and the low-rank pages warn with
    assert shown == lowrank_view.pitfalls(str(r.path)) and len(shown) == len(found)
    assert shown[0].startswith("Step 2, layer side.weight: zero gradient.")
    assert shown[0].endswith("Fix: set orthogonalization_epsilon=1e-08.")


@pytest.mark.parametrize("tensors, expected", [
    ([], True),
    ([torch.ones(3), torch.zeros(0)], True),
    # Finite elements whose sum overflows: the exact test, not the sum, decides.
    ([torch.full((4,), 3e38), torch.ones(2)], True),
    ([torch.full((4,), 6e4, dtype=torch.float16)], True),
    ([torch.ones(3), torch.tensor([1.0, float("nan")])], False),
    ([torch.tensor([float("inf"), -float("inf")])], False),
    ([torch.tensor([1.0, float("-inf")], dtype=torch.bfloat16)], False),
])
def test_finite_is_exact_whatever_the_sum_does(tensors, expected):
    assert pitfalls.finite(tensors) is expected
