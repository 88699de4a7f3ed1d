"""commlab's compressors against GRACE's code on the same inputs and the same random draws.

GRACE (sands-lab/grace, commit fd3a7f4, ``grace_dl/torch/compressor/*.py`` and ``memory/*.py``) is
the reference implementation the field compares compressors with; it needs Horovod (and cupy for
natural compression), so its formulas are re-typed here as small torch/NumPy functions, each
beside the file it comes from, communication left out (GRACE's Allgather divides the sum of the
decompressed tensors by the world size when ``average``, its Allreduce sums what was sent).

Each test holds one line of the compressor's stated definition (``HookSpec.definition``): where
the two agree, they agree bit for bit; where the definition says they differ, the test shows the
difference on an input, so a stated difference that stops being true fails here.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from commlab.hook_specs import SPECS
from commlab.hooks import compressors as c

N = 1000


def _x(n=N, seed=0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def _draws(n=N, seed=1) -> torch.Tensor:
    return torch.rand(n, generator=torch.Generator().manual_seed(seed))


def _with_draws(state: c.CompressorState, draws: torch.Tensor) -> c.CompressorState:
    """The state, drawing ``draws`` instead of its generator's: the same draws GRACE is given."""
    state.uniform = lambda like: draws
    return state


def _commlab(state: c.CompressorState, x: torch.Tensor, key: int = 0) -> torch.Tensor:
    msg, ctx = state.compress(key, x)
    return state.decode(msg, ctx, x.numel())


def _stated(hook: str, part: str) -> str:
    return getattr(SPECS[hook].definition, part)


# ============================================================================ GRACE, re-typed
def grace_topk(x: torch.Tensor, ratio: float) -> torch.Tensor:  # compressor/topk.py
    k = max(1, int(x.numel() * ratio))
    _, indices = torch.topk(x.abs(), k, sorted=False)
    values = torch.gather(x, 0, indices)
    return torch.zeros(x.numel()).scatter_(0, indices, values)


def grace_randomk(x: torch.Tensor, ratio: float, perm: torch.Tensor) -> torch.Tensor:  # randomk.py
    k = max(1, int(x.numel() * ratio))  # its indices: torch.randperm(numel)[:k]
    indices = perm[:k]
    return torch.zeros(x.numel()).scatter_(0, indices, x[indices])


def grace_threshold(x: torch.Tensor, threshold: float) -> torch.Tensor:  # threshold.py
    indices, = torch.where(x.abs() > threshold)
    return torch.zeros(x.numel()).scatter_(0, indices, x[indices])


def grace_qsgd(x: torch.Tensor, s: int, draws: torch.Tensor) -> torch.Tensor:  # qsgd.py
    norm = x.norm().flatten()
    level_float = s / norm * x.abs()
    previous_level = level_float.floor()
    is_next_level = (draws < (level_float - previous_level)).type(torch.float32)
    new_level = previous_level + is_next_level
    codes = (new_level * x.sign()).type(torch.int16).type(torch.int8 if s < 128 else torch.half)
    return norm / s * codes.type(torch.float32)


def grace_terngrad(x: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:  # terngrad.py
    std = torch.sqrt(torch.mean((x - torch.mean(x)) ** 2))
    clip = 2.5 * std.item()
    gradient = torch.clamp(x, -clip, clip)
    abs_gradient = gradient.abs()
    scalar = abs_gradient.max()
    sign_gradient = gradient.sign() * scalar
    rnd_sample = draws * scalar.item()  # its torch.empty_like(x).uniform_(0, scalar), the same draws
    sign_gradient[rnd_sample >= abs_gradient] = 0
    return sign_gradient.sign().type(torch.int8).type(torch.float32) * scalar.flatten()


def grace_natural(x: torch.Tensor, draws: np.ndarray) -> torch.Tensor:  # natural.py (cupy -> NumPy)
    """``draws``: its cupy.random.randint(0, 0x7FFFFF) per element."""
    cast = x.numpy().view(np.int32)
    sign = cast & np.int32(-2**31)
    exp = cast & np.int32(0b01111111100000000000000000000000)
    mantissa = cast & np.int32(0b00000000011111111111111111111111)
    exp_add_one = mantissa > draws
    exponent = np.where(exp_add_one, exp + np.int32(0b00000000100000000000000000000000), exp)
    exp_shift = np.clip(exponent, 0b00001001000000000000000000000000, 0b01001000100000000000000000000000)
    exps = np.right_shift(exp_shift, 23)
    exps = np.bitwise_or(np.right_shift(sign, 24), exps - 18)
    compressed = exps.astype(np.uint8)  # 8 bits a coordinate: the sign and 7 bits of exponent
    # decompress
    negative = compressed > 127
    exps = np.bitwise_and(compressed, 0b01111111)
    floats = np.left_shift((exps + 18).astype(np.int32), 23).view(np.float32)
    out = np.where(negative, -floats, floats) * (exps >= 1).astype(np.float32)
    return torch.from_numpy(out)


def grace_signs(x: torch.Tensor) -> torch.Tensor:  # signsgd.py, signum.py, efsignsgd.py: compress
    return (x >= 0).type(torch.uint8).type(torch.float32) * 2 - 1


def grace_vote(decompressed: list[torch.Tensor]) -> torch.Tensor:  # signsgd.py, signum.py: aggregate
    return (sum(decompressed) >= 0) * 2.0 - 1.0


class GraceSignum:  # signum.py
    def __init__(self, momentum: float):
        self.momentum, self.momentums = momentum, {}

    def compress(self, x: torch.Tensor, name: str) -> torch.Tensor:
        if name in self.momentums:
            x = (1.0 - self.momentum) * x + self.momentum * self.momentums[name]
        self.momentums[name] = x
        return grace_signs(x)


class GraceEFSignSGD:  # efsignsgd.py with memory/efsignsgd.py; Allgather, average=False
    def __init__(self, lr: float):
        self.lr, self.residuals = lr, {}

    def send(self, x: torch.Tensor, name: str) -> torch.Tensor:
        if name in self.residuals:  # compensate: lr * g + e (the first step: g alone)
            x = self.residuals[name] + self.lr * x
        decompressed = x.abs().mean() * grace_signs(x)
        self.residuals[name] = x - decompressed
        return decompressed

    def aggregate(self, sent: list[torch.Tensor]) -> torch.Tensor:
        return sum(sent) / self.lr


def grace_onebit(x: torch.Tensor) -> torch.Tensor:  # onebit.py
    mask0 = x < 0
    sum0 = torch.sum(x[mask0])
    num0 = torch.sum(mask0).float()
    mean0 = sum0 / num0 if num0 > 0 else sum0
    mask1 = ~mask0
    sum1 = torch.sum(x[mask1])
    num1 = x.numel() - num0
    mean1 = sum1 / num1 if num1 > 0 else sum1
    return mask0 * mean0 + ~mask0 * mean1


class GraceResidual:  # memory/residual.py (beta = gamma = 1): error feedback around any compressor
    def __init__(self):
        self.residuals = {}

    def send(self, compress, x: torch.Tensor, name: str) -> torch.Tensor:
        if name in self.residuals:
            x = self.residuals[name] + x
        sent = compress(x)
        self.residuals[name] = x - sent
        return sent


class GraceDGC:  # compressor/dgc.py with memory/dgc.py (gradient_clipping False)
    def __init__(self, ratio: float, momentum: float):
        self.ratio, self.momentum, self.residuals, self.gradients = ratio, momentum, {}, {}

    def threshold(self, v: torch.Tensor, sample_index: torch.Tensor) -> torch.Tensor:
        numel = v.numel()
        sample = v[sample_index]
        k = max(1, int(numel * self.ratio * 0.01))
        vals, _ = torch.topk(sample.abs(), k)
        thr = vals.min()
        mask = v.abs() >= thr
        selected = mask.sum()
        for _ in range(10):
            if selected > 1.3 * numel * self.ratio:
                thr = 1.3 * thr
            elif selected < 0.7 * numel * self.ratio:
                thr = 0.7 * thr
            else:
                break
            mask = v.abs() >= thr
            selected = mask.sum()
        return mask

    def send(self, x: torch.Tensor, name: str, mask_of) -> torch.Tensor:
        # compensate
        if name in self.residuals:
            self.residuals[name] = self.momentum * self.residuals[name] + x
        else:
            self.residuals[name] = x
        if name in self.gradients:
            self.gradients[name] += self.residuals[name]
            v = self.gradients[name]
        else:
            self.gradients[name] = v = x
        mask = mask_of(v)
        indices, = torch.where(mask)
        sent = torch.zeros(v.numel()).scatter_(0, indices, v[indices])
        # update: momentum factor masking
        self.residuals[name] = self.residuals[name] * ~mask
        self.gradients[name] = self.gradients[name] * ~mask
        return sent


def _sample_index(numel: int, seed: int) -> torch.Tensor:
    """GRACE's sample: 1% of the coordinates, drawn uniformly with replacement."""
    g = torch.Generator().manual_seed(seed)
    return torch.empty(max(1, int(numel * 0.01))).uniform_(0, numel, generator=g).type(torch.long)


# ============================================================================ top-k
def test_topk_equals_grace_when_k_agrees_and_rounds_k_up_where_grace_rounds_down():
    x = _x()
    assert torch.equal(_commlab(c.TopKState(compress_ratio=0.05, use_error_feedback=False), x),
                       grace_topk(x, 0.05))  # k = 50 either way
    # 0.0125 * 1000 = 12.5: commlab sends 13, GRACE 12
    ours = _commlab(c.TopKState(compress_ratio=0.0125, use_error_feedback=False), x)
    assert (int((ours != 0).sum()), int((grace_topk(x, 0.0125) != 0).sum())) == (13, 12)
    assert "ceil" in _stated("topk", "sends") and "int(" in _stated("topk", "grace")


def test_topk_error_feedback_is_graces_residual_memory():
    ours, grace = c.TopKState(compress_ratio=0.05), GraceResidual()
    for step in range(4):
        x = _x(seed=step)
        assert torch.equal(_commlab(ours, x), grace.send(lambda v: grace_topk(v, 0.05), x, "b"))
        assert torch.equal(ours.error_dict[0], grace.residuals["b"])


# ============================================================================ random-k
def test_randomk_is_graces_values_scaled_by_n_over_k_and_rounds_k_up():
    x = _x()
    for ratio, (k_ours, k_grace) in ((0.05, (50, 50)), (0.0125, (13, 12))):
        state = c.RandomKState(compress_ratio=ratio, random_seed=3)
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(3))  # commlab's draw
        ours = _commlab(state, x)
        grace = grace_randomk(x, ratio, perm)
        assert (int((ours != 0).sum()), int((grace != 0).sum())) == (k_ours, k_grace)
        if k_ours == k_grace:  # the same coordinates: commlab's are GRACE's times n / k
            assert torch.equal(ours, grace * (N / k_ours))
    assert "n/k" in _stated("randomk", "grace") and "n/k" in _stated("randomk", "choice")


def test_randomk_graces_mean_is_k_over_n_of_the_gradient_commlabs_the_gradient():
    """Unbiased (commlab) against GRACE's E = (k/n) x: the mean over many index draws."""
    x, ratio, draws = _x(40), 0.25, 4000
    state = c.RandomKState(compress_ratio=ratio, random_seed=5)
    g = torch.Generator().manual_seed(5)
    global_rng = torch.get_rng_state()
    ours = sum(_commlab(state, x) for _ in range(draws)) / draws
    assert torch.equal(torch.get_rng_state(), global_rng)  # GRACE reseeds torch's; commlab leaves it
    grace = sum(grace_randomk(x, ratio, torch.randperm(40, generator=g)) for _ in range(draws)) / draws
    # each coordinate is kept with probability k/n = 1/4: standard error of the mean sqrt(3/draws)|x|
    assert ((ours - x).abs() <= 5 * (3 / draws) ** 0.5 * x.abs() + 1e-6).all()
    assert ((grace - x / 4).abs() <= 5 * (3 / draws) ** 0.5 * x.abs() / 4 + 1e-6).all()


# ============================================================================ threshold
def test_threshold_equals_grace_and_sends_the_values_not_plus_minus_the_threshold():
    x = _x()
    ours = _commlab(c.ThresholdState(threshold=1.5, use_error_feedback=False), x)
    assert torch.equal(ours, grace_threshold(x, 1.5))
    sent = ours[ours != 0].abs()
    assert len(sent) > 10 and not torch.all(sent == 1.5)  # the values themselves, not Strom's +-tau
    assert "±τ" in _stated("threshold", "paper")


# ============================================================================ QSGD
def test_qsgd_equals_grace_on_the_same_draws_but_multiplies_in_another_order():
    for s in (1, 7, 127):
        differ = 0
        for seed in range(20):
            x, draws = _x(seed=seed), _draws(seed=100 + seed)
            assert torch.equal(_commlab(_with_draws(c.QSGDState(levels=s), draws), x), grace_qsgd(x, s, draws))
            norm = x.norm()
            differ += int((x.abs() / norm * s != s / norm * x.abs()).sum())
        assert differ > 0  # |x|/||x||*s and s/||x||*|x| differ in the last bit: a draw between them rounds apart
    assert "60,000" in _stated("qsgd", "grace")  # 3 levels x 20 buckets x 1,000 entries, above


def test_qsgd_wire_is_packed_codes_where_grace_sends_a_byte_each():
    x = _x()
    for s, bits in ((1, 2), (7, 4), (127, 8)):
        msg, _ = c.QSGDState(levels=s).compress(0, x)
        assert msg.numel() == 4 + N * bits // 8  # GRACE: N int8 codes and the norm, whatever s
    assert "8 bits" in _stated("qsgd", "grace")


# ============================================================================ TernGrad
def test_terngrad_equals_grace_with_its_clipping_on_and_differs_with_it_off():
    for seed in range(10):
        x, draws = _x(seed=seed), _draws(seed=50 + seed)
        x[seed] = 8.0  # an outlier beyond 2.5 sigma
        assert torch.equal(_commlab(_with_draws(c.TernGradState(), draws), x), grace_terngrad(x, draws))
        unclipped = _commlab(_with_draws(c.TernGradState(clip_sigmas=0), draws), x)
        assert unclipped.abs().max() == 8.0 > grace_terngrad(x, draws).abs().max()


def test_terngrad_leaves_a_bucket_of_sigma_zero_where_grace_zeroes_it():
    x = torch.full((16,), 0.5)
    assert torch.equal(_commlab(_with_draws(c.TernGradState(), _draws(16)), x), x)  # p = 1 everywhere
    assert torch.equal(grace_terngrad(x, _draws(16)), torch.zeros(16))
    assert "σ = 0" in _stated("terngrad", "choice")


# ============================================================================ natural compression
def _natural_draws(n: int, seed: int) -> np.ndarray:
    """GRACE's randint(0, 0x7FFFFF) draws; commlab's uniform draws are the same numbers / 2**23."""
    return np.random.default_rng(seed).integers(0, 0x7FFFFF, n).astype(np.int32)


def test_natural_rounds_as_grace_does_within_graces_exponent_range():
    for seed in range(5):
        x = _x(seed=seed) * 10.0 ** (seed - 2)
        r = _natural_draws(N, seed)
        ours = _commlab(_with_draws(c.NaturalState(), torch.from_numpy(r).float() / 2**23), x)
        assert torch.equal(ours, grace_natural(x, r))


def test_natural_keeps_the_whole_float_range_where_grace_clips_it():
    x = torch.tensor([2.0**20, -2.0**30, 2.0**-112, 3.0, 0.0])
    r = np.zeros(5, dtype=np.int32)
    ours = _commlab(_with_draws(c.NaturalState(), torch.zeros(5)), x)
    assert ours.tolist() == [2.0**20, -2.0**30, 2.0**-112, 4.0, 0.0]
    assert grace_natural(x, r).tolist() == [2.0**18, -2.0**18, 0.0, 4.0, 0.0]
    assert "2^18" in _stated("natural", "grace")


# ============================================================================ signSGD and signum
def test_signsgd_sends_what_grace_sends_and_votes_zero_on_a_tie_where_grace_votes_plus_one():
    xs = [_x(seed=s) for s in range(4)]
    xs[0][:5] = 0.0  # a zero coordinate: both send +1 (one bit has no zero)
    state = c.SignSGDState()
    msgs = [state.compress(0, x)[0] for x in xs]
    for msg, x in zip(msgs, xs):
        assert torch.equal(state.decode(msg, None, N), grace_signs(x))
    assert torch.equal(state.decode(msgs[0], None, N)[:5], torch.ones(5))
    ours, grace = state.aggregate(msgs, None, N, 4), grace_vote([grace_signs(x) for x in xs])
    tie = sum(grace_signs(x) for x in xs) == 0
    assert tie.sum() > 100  # four voters tie often
    assert torch.equal(ours[~tie], grace[~tie])
    assert (ours[tie] == 0).all() and (grace[tie] == 1).all()
    assert "tie" in _stated("signsgd", "grace")


def test_signum_starts_its_momentum_at_zero_where_grace_starts_it_at_the_first_gradient():
    ours, grace = c.SignumState(momentum=0.9), GraceSignum(0.9)
    first, second = _x(seed=0), _x(seed=1)
    assert torch.equal(_commlab(ours, first), grace.compress(first, "b"))  # the same signs at first
    agree = _commlab(ours, second) == grace.compress(second, "b")
    # commlab's m = 0.9 * 0.1 g1 + 0.1 g2, GRACE's 0.9 g1 + 0.1 g2: their signs part where they differ
    m_ours, m_grace = 0.9 * 0.1 * first + 0.1 * second, 0.9 * first + 0.1 * second
    assert torch.equal(~agree, (m_ours >= 0) != (m_grace >= 0)) and (~agree).sum() > 0
    assert "first gradient" in _stated("signum", "grace")


# ============================================================================ EF-signSGD
def test_ef_signsgd_at_lr_one_is_graces_sum_over_ranks_where_commlab_takes_the_mean():
    world = 2
    ours = [c.EFSignSGDState() for _ in range(world)]
    grace = [GraceEFSignSGD(lr=1.0) for _ in range(world)]
    for step in range(3):
        xs = [_x(seed=10 * step + r) for r in range(world)]
        msgs = [s.compress(0, x)[0] for s, x in zip(ours, xs)]
        mean = ours[0].aggregate(msgs, None, N, world)
        total = grace[0].aggregate([g.send(x, "b") for g, x in zip(grace, xs)])
        assert torch.equal(mean * world, total)
        assert all(torch.equal(s.error_dict[0], g.residuals["b"]) for s, g in zip(ours, grace))


def test_ef_signsgd_keeps_the_learning_rate_out_of_its_memory():
    """GRACE's memory holds lr * g + e (its first step g alone); commlab's g + e, the optimizer
    applies lr after: the memories part at the second step."""
    ours, grace = c.EFSignSGDState(), GraceEFSignSGD(lr=0.1)
    first, second = _x(seed=0), _x(seed=1)
    _commlab(ours, first), grace.send(first, "b")
    assert torch.equal(ours.error_dict[0], grace.residuals["b"])  # GRACE's first step skips lr
    _commlab(ours, second), grace.send(second, "b")
    assert not torch.allclose(ours.error_dict[0], grace.residuals["b"])
    assert "lr" in _stated("ef_signsgd", "grace")


# ============================================================================ 1-bit SGD
def test_onebit_with_error_feedback_equals_grace_with_its_residual_memory():
    ours, grace = c.OneBitState(), GraceResidual()
    for step in range(4):
        x = _x(seed=step)
        assert torch.equal(_commlab(ours, x), grace.send(grace_onebit, x, "b"))
        assert torch.equal(ours.error_dict[0], grace.residuals["b"])


# ============================================================================ DGC
def test_dgc_with_an_exact_threshold_equals_grace_and_graces_sampled_one_sends_another_count():
    ratio, momentum = 0.01, 0.9
    ours, grace, sampled = c.DGCState(compress_ratio=ratio, momentum=momentum), GraceDGC(ratio, momentum), \
        GraceDGC(ratio, momentum)
    k = math.ceil(ratio * N)

    def exact(v):  # GRACE's mask at the k-th largest magnitude: what commlab's top-k selects
        return v.abs() >= v.abs().topk(k).values.min()

    counts = []
    for step in range(20):
        x = _x(seed=step)
        sent = _commlab(ours, x)
        assert int((sent != 0).sum()) == k
        assert torch.equal(sent, grace.send(x, "b", exact))
        assert torch.equal(ours.momentum_dict[0], grace.residuals["b"])
        assert torch.equal(ours.error_dict[0], grace.gradients["b"])
        estimated = sampled.send(x, "b", lambda v, step=step: sampled.threshold(v, _sample_index(N, step)))
        counts.append(int((estimated != 0).sum()))
    # GRACE's estimate from a 1% sample: a count that varies, not always within 0.7k to 1.3k
    assert min(counts) < 0.7 * k and max(counts) > 1.3 * k, counts
    assert f"{min(counts)} to {max(counts)} entries for k = {k}" in _stated("dgc", "grace"), counts


# ============================================================================ every difference stated
def test_every_compressor_states_its_definition_against_its_paper_and_grace():
    compressors = [h for h, s in SPECS.items() if s.variant == c.__name__]
    assert len(compressors) == 11
    for hook in compressors:
        d = SPECS[hook].definition
        assert d is not None, hook
        assert all(getattr(d, part).strip() for part in ("sends", "paper", "grace", "choice")), hook
