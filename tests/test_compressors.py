"""The classic compressors (commlab.hooks.compressors) held against their formulas in one process,
the unbiased ones against their mean over many draws, the error-feedback ones against the
invariant input + old error = sent + new error; their settings refused by name.  Real runs on
Gloo are in tests/test_pytorch_hooks_more.py."""
import math

import pytest
import torch

from commlab.config import RunConfig
from commlab.hook_specs import SPECS
from commlab.hooks import compressors as c
from commlab.hooks import registry


def _x(n=200, seed=0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_codes_pack_and_unpack(bits):
    codes = torch.randint(0, 1 << bits, (37,), generator=torch.Generator().manual_seed(bits))
    packed = c.pack_codes(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(37 * bits / 8)
    assert torch.equal(c.unpack_codes(packed, bits, 37), codes.to(torch.int32))


def test_topk_keeps_the_k_largest_magnitudes_and_sends_values_and_indices():
    x = _x()
    s = c.TopKState(compress_ratio=0.05, use_error_feedback=False)
    msg, ctx = s.compress(0, x)
    k = 10
    assert msg.numel() == 2 * k and msg.dtype == torch.int32  # k float32 values + k int32 indices
    keep = x.abs().sort(descending=True).indices[:k]
    expected = torch.zeros_like(x)
    expected[keep] = x[keep]
    assert torch.equal(s.decode(msg, ctx, x.numel()), expected)
    # two ranks: the mean of what each sent
    y = _x(seed=1)
    msg_y, _ = s.compress(0, y)
    ref_y = torch.zeros_like(y)
    top_y = y.abs().sort(descending=True).indices[:k]
    ref_y[top_y] = y[top_y]
    assert torch.allclose(s.aggregate([msg, msg_y], None, 200, 2), (expected + ref_y) / 2)


def test_threshold_sends_exactly_the_elements_above_it():
    x = _x()
    s = c.ThresholdState(threshold=1.5, use_error_feedback=False)
    msg, ctx = s.compress(0, x)
    assert torch.equal(s.decode(msg, ctx, 200), torch.where(x.abs() > 1.5, x, torch.zeros_like(x)))
    assert msg.numel() == 2 * int((x.abs() > 1.5).sum())


@pytest.mark.parametrize("state", [c.TopKState(compress_ratio=0.05), c.ThresholdState(threshold=1.0),
                                   c.EFSignSGDState(), c.OneBitState()], ids=lambda s: type(s).__name__)
def test_error_feedback_invariant(state):
    """input + old error = sent + new error, step after step."""
    for step in range(4):
        g = _x(seed=step)
        old = state.error_dict.get(0, torch.zeros(200)).clone()
        msg, ctx = state.compress(0, g)
        sent = state.decode(msg, ctx, 200)
        assert torch.allclose(g + old, sent + state.error_dict[0], atol=1e-6)
        if step:
            assert old.abs().sum() > 0  # the memory is carried


def test_dgc_is_momentum_correction_with_factor_masking():
    s = c.DGCState(compress_ratio=0.05, momentum=0.5)
    u, v = torch.zeros(200), torch.zeros(200)
    for step in range(3):
        g = _x(seed=step)
        msg, ctx = s.compress(0, g)
        u = 0.5 * u + g
        v = v + u
        keep = v.abs().sort(descending=True).indices[:10]
        expected = torch.zeros(200)
        expected[keep] = v[keep]
        assert torch.allclose(s.decode(msg, ctx, 200), expected)
        u[keep], v[keep] = 0, 0
        assert torch.allclose(s.momentum_dict[0], u) and torch.allclose(s.error_dict[0], v)


def test_dgc_clips_locally_to_the_norm_over_root_n():
    s = c.DGCState(compress_ratio=1.0, momentum=0.0, clip_norm=0.5)
    msg, ctx = s.compress(0, _x())
    assert math.isclose(float(s.decode(msg, ctx, 200).norm()), 0.5, rel_tol=1e-5)  # one rank


def _clipped(x: torch.Tensor, sigmas: float = 2.5) -> torch.Tensor:
    """TernGrad's clipping as the paper writes it: to +-c * sigma of the elements."""
    limit = sigmas * float(x.double().std(unbiased=False))
    return x.clamp(-limit, limit)


@pytest.mark.parametrize("state, target, bound", [
    (c.RandomKState(compress_ratio=0.1), None, lambda x: 9 * x**2),  # (n/k - 1) x^2
    (c.QSGDState(levels=3), None, lambda x: torch.full_like(x, float(x.norm()) ** 2 / 36)),  # (|x|/s)^2/4
    (c.TernGradState(clip_sigmas=0), None, lambda x: x.abs().max() * x.abs()),
    (c.TernGradState(), _clipped, lambda x: _clipped(x).abs().max() * _clipped(x).abs()),
    (c.NaturalState(), None, lambda x: x**2 / 8),
], ids=["randomk", "qsgd", "terngrad_unclipped", "terngrad", "natural"])
def test_unbiased_compressors_average_to_the_input(state, target, bound):
    """The mean of T independent compressions is within 5 standard errors of the input (of the
    clipped input for TernGrad with its clipping on)."""
    x, draws = _x(50), 600
    x[7] = 6.0  # an outlier beyond 2.5 sigma: TernGrad's clipping has something to clip
    want = x if target is None else target(x)
    total = torch.zeros(50)
    for _ in range(draws):
        msg, ctx = state.compress(0, x)
        total += state.decode(msg, ctx, 50)
    mean = total / draws
    tolerance = 5 * (bound(x) / draws).sqrt() + 1e-6
    assert ((mean - want).abs() <= tolerance).all(), (mean - want).abs().max()
    assert not torch.equal(state.decode(*state.compress(0, x), 50), x)  # it does compress


def test_terngrad_clips_to_its_sigmas_when_on_and_not_when_off():
    x = _x()
    x[3] = 40.0  # an outlier: 2.5 sigma is far below it
    sigma = float(x.double().std(unbiased=False))
    on, off = c.TernGradState(), c.TernGradState(clip_sigmas=0)
    assert on.clip_sigmas == 2.5  # on by default, as in the paper
    scale_on = c.bytes_to_floats(on.compress(0, x)[0], 1)[0]
    scale_off = c.bytes_to_floats(off.compress(0, x)[0], 1)[0]
    assert float(scale_off) == 40.0  # max|x|
    assert float(scale_on) == pytest.approx(2.5 * sigma, rel=1e-6) and float(scale_on) < 40.0
    assert torch.equal(on.clip(x), x.clamp(-float(scale_on), float(scale_on)))
    assert torch.equal(off.clip(x), x)
    # every decoded value is 0 or +-the scale: ternary around the clipped bucket
    out = on.decode(*on.compress(0, x), 200)
    assert set(torch.unique(out.abs()).tolist()) <= {0.0, float(scale_on)}
    assert torch.equal(c.TernGradState(clip_sigmas=1.0).clip(x).abs().max(), torch.tensor(sigma).float())
    # sigma = 0 (a constant bucket, a bucket of one element): left as it is, not clipped to nothing
    assert torch.equal(on.clip(torch.full((5,), 3.0)), torch.full((5,), 3.0))
    assert torch.equal(on.clip(torch.tensor([-2.0])), torch.tensor([-2.0]))


def test_terngrad_clipping_is_a_setting_read_through_its_spec():
    assert RunConfig().terngrad_clip_sigmas == 2.5
    for value in (2.5, 0.0, 4.0):
        state = registry.choose(RunConfig(hook="terngrad", terngrad_clip_sigmas=value), "gloo").state
        assert state.clip_sigmas == value
    for bad in (0.2, -1.0, 1000.0):
        assert "terngrad_clip_sigmas" in RunConfig(hook="terngrad", terngrad_clip_sigmas=bad).errors(gpu_count=0)
    assert "terngrad_clip_sigmas" in SPECS["terngrad"].reads()


def test_qsgd_levels_and_wire_size():
    x = _x()
    s = c.QSGDState(levels=7)
    msg, ctx = s.compress(0, x)
    assert s.bits == 4 and msg.numel() == 4 + 100  # the norm, then 4-bit codes
    out = s.decode(msg, ctx, 200)
    steps = out / (x.norm() / 7)
    assert torch.allclose(steps, steps.round(), atol=1e-4) and steps.abs().max() <= 7


def test_terngrad_and_natural_values():
    x = _x()
    for t in (c.TernGradState(), c.TernGradState(clip_sigmas=0)):
        out = t.decode(*t.compress(0, x), 200)
        assert set(torch.unique(out / t.clip(x).abs().max()).tolist()) <= {-1.0, 0.0, 1.0}
    n = c.NaturalState()
    out = n.decode(*n.compress(0, x), 200)
    assert torch.equal(torch.exp2(torch.log2(out.abs()).round()), out.abs())  # powers of two
    assert ((out.abs() >= x.abs() / 2) & (out.abs() <= 2 * x.abs())).all()


def test_sign_methods_vote_and_scale():
    xs = [_x(seed=s) for s in range(3)]
    s = c.SignSGDState()
    msgs = [s.compress(0, x)[0] for x in xs]
    assert msgs[0].numel() == 25  # 200 signs in 25 bytes
    votes = sum(torch.where(x >= 0, 1.0, -1.0) for x in xs)
    assert torch.equal(s.aggregate(msgs, None, 200, 3), torch.sign(votes))
    m = c.SignumState(momentum=0.5)
    m.compress(0, xs[0])
    msg, _ = m.compress(0, xs[1])
    momentum = 0.5 * (0.5 * xs[0]) + 0.5 * xs[1]
    assert torch.equal(m.decode(msg, None, 200), torch.where(momentum >= 0, 1.0, -1.0))
    e = c.EFSignSGDState()
    out = e.decode(*e.compress(0, xs[0]), 200)
    assert torch.allclose(out, xs[0].abs().mean() * torch.where(xs[0] >= 0, 1.0, -1.0))
    o = c.OneBitState()
    out = o.decode(*o.compress(0, xs[0]), 200)
    pos, neg = xs[0][xs[0] >= 0].mean(), xs[0][xs[0] < 0].mean()
    assert torch.allclose(out, torch.where(xs[0] >= 0, pos, neg))


def test_memories_reset_when_a_bucket_changes_size():
    s = c.TopKState(compress_ratio=0.1)
    s.compress(0, _x(200))
    s.compress(0, _x(120))  # DDP rebuilt its buckets: the old memory no longer fits
    assert s.error_dict[0].numel() == 120


@pytest.mark.parametrize("cls, kwargs, name", [
    (c.TopKState, dict(compress_ratio=0.0), "compress_ratio"),
    (c.RandomKState, dict(compress_ratio=1.5), "compress_ratio"),
    (c.ThresholdState, dict(threshold=-1.0), "threshold"),
    (c.QSGDState, dict(levels=128), "levels"),
    (c.QSGDState, dict(levels=2.5), "levels"),
    (c.DGCState, dict(momentum=1.0), "momentum"),
    (c.SignumState, dict(momentum=-0.1), "momentum"),
    (c.DGCState, dict(clip_norm=-1.0), "clip_norm"),
    (c.TernGradState, dict(clip_sigmas=-0.5), "clip_sigmas"),
    (c.TernGradState, dict(clip_sigmas=math.inf), "clip_sigmas"),
])
def test_states_validate_their_hyperparameters(cls, kwargs, name):
    with pytest.raises(ValueError, match=name):
        cls(None, **kwargs)


@pytest.mark.parametrize("field, value", [("compress_ratio", 0.0), ("compress_ratio", 2.0),
                                          ("qsgd_levels", 0), ("qsgd_levels", 200),
                                          ("sparsify_threshold", 0.0), ("compressor_momentum", 1.0),
                                          ("dgc_clip_norm", -1.0), ("terngrad_clip_sigmas", 0.1)])
def test_the_settings_table_refuses_by_name(field, value):
    assert field in RunConfig(hook="topk", **{field: value}).errors(gpu_count=0)


def test_config_rules_for_the_new_hooks():
    assert "wrapper" in RunConfig(hook="qsgd", wrapper="fp16").errors(gpu_count=0)
    assert "impl" in RunConfig(hook="topk", impl="stock").errors(gpu_count=0)
    assert "localsgd_subgroup_size" in RunConfig(hook="post_localsgd", world_size=3,
                                                 localsgd_subgroup_size=2).errors(gpu_count=0)
    assert not RunConfig(hook="post_localsgd", wrapper="fp16").errors(gpu_count=0)


@pytest.mark.parametrize("hook", [h for h, s in SPECS.items() if s.variant == c.__name__])
def test_registry_runs_commlabs_compressor_with_its_state(hook):
    cfg = RunConfig(hook=hook, compress_ratio=0.2, qsgd_levels=3, compressor_momentum=0.5)
    assert registry.plan(cfg, "gloo")[0] == "commlab"
    choice = registry.choose(cfg, "gloo")
    assert choice.hook.__name__ == f"{hook}_hook" and isinstance(choice.state, getattr(c, SPECS[hook].state.attr))
    for attr, value in (("compress_ratio", 0.2), ("levels", 3), ("momentum", 0.5)):
        if hasattr(choice.state, attr) and hook not in ("threshold",):
            assert getattr(choice.state, attr) == value
    row = next(r for r in registry.support_table("gloo") if r["hook"] == hook)
    assert row["stock_works"] == registry.NONE_IN_PYTORCH and "PyTorch has no" in row["why"]


def test_hooks_command_names_why_pytorchs_quantization_hooks_are_replaced(capsys):
    from commlab import cli

    assert cli.main(["hooks", "--backend", "gloo"]) == 0
    out = capsys.readouterr().out
    assert "quantization_pertensor_hook" in out and "IndexError" in out
    assert "post_localSGD_hook" in out and "new_subgroups" in out
