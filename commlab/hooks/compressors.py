"""The classic gradient compressors as DDP communication hooks, safe on Gloo.

One hook runs them all (``compressor_hook``, under each method's name): it takes the bucket,
lets the state prepare it (error feedback, momentum), encode it into ONE message tensor and
issues ONE collective for it from the hook body -- an allreduce where messages add up (random-k
with indices drawn from a seed every rank shares), an allgather where they do not (values and
indices, packed signs, packed quantization codes) -- and returns the future ``.then`` a callback
that decodes and averages, communicating nothing.  DDP calls hooks in bucket order on every rank,
so every rank issues the same collectives in the same order, as Gloo needs (docs/hooks.md).  The
one method whose message length varies per rank (threshold) first allgathers the lengths and
waits for them in the body.  Collectives go through ``dist.all_reduce`` / ``dist.all_gather``,
where ``commlab.hooks.instrument`` counts their bytes like every other hook's.

Each state is in PyTorch's style: hyperparameters validated in the constructor (``ValueError``
naming the argument), switches, internal state (``error_dict``, ``momentum_dict``, keyed by bucket
index and reset when DDP's bucket rebuild changes a bucket's size, as PowerSGD does) and ``iter``.
The encode/decode methods are pure tensor functions, so tests hold them against the formulas in
one process.  Each bucket is compressed as one vector (QSGD's and TernGrad's scale is the
bucket's, as in QSGD's bucketed variant).  Sources: top-k and random-k (Stich et al. 2018; GRACE),
threshold (Strom 2015), DGC (Lin et al. 2018), QSGD (Alistarh et al. 2017), TernGrad (Wen et al.
2017), natural compression (Horvath et al. 2019), signSGD with majority vote and signum (Bernstein
et al. 2018/2019), EF-signSGD (Karimireddy et al. 2019), 1-bit SGD (Seide et al. 2014).  What each
sends, and where it differs from its paper and from GRACE's code: its row's ``definition`` in
``commlab.hook_specs`` (tests/test_grace.py holds those differences to GRACE's formulas).
"""
# No `from __future__ import annotations`: DDP compares a hook's annotations with real types.

import math

import torch
import torch.distributed as dist

from commlab.hook_specs import ALLGATHER, ALLREDUCE, SPECS
from commlab.hooks import futures
from commlab.hooks.groups import group_of
from commlab.seeds import stream_seed


# --------------------------------------------------------------------------- wire formats
def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes below 2**bits (bits 1, 2, 4 or 8) packed 8 // bits to a byte."""
    per = 8 // bits
    padded = torch.zeros(math.ceil(codes.numel() / per) * per, dtype=torch.int32, device=codes.device)
    padded[:codes.numel()] = codes.to(torch.int32)
    shifts = torch.arange(per, dtype=torch.int32, device=codes.device) * bits
    return (padded.view(-1, per) << shifts).sum(1).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.int32, device=packed.device) * bits
    return ((packed.to(torch.int32).unsqueeze(1) >> shifts) & ((1 << bits) - 1)).reshape(-1)[:n]


def code_bits(levels: int) -> int:
    """The fewest of 1, 2, 4, 8 bits that hold ``levels`` codes."""
    return next(b for b in (1, 2, 4, 8) if levels <= 1 << b)


def floats_to_bytes(*values: torch.Tensor) -> torch.Tensor:
    return torch.stack([v.reshape(()).float() for v in values]).view(torch.uint8)


def bytes_to_floats(data: torch.Tensor, count: int) -> torch.Tensor:
    return data[:4 * count].clone().view(torch.float32)


def sparse_message(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """k float32 values and their k indices as one int32 tensor of 2k (indices fit: a bucket
    holds fewer than 2**31 elements)."""
    return torch.cat([values.float().view(torch.int32), indices.to(torch.int32)])


def sparse_parts(msg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k = msg.numel() // 2
    return msg[:k].clone().view(torch.float32), msg[k:].long()


def _scatter(values: torch.Tensor, indices: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, device=values.device).index_add_(0, indices, values)


def _check(name: str, value, lo, hi, lo_open: bool = False, hi_open: bool = False) -> None:
    low_ok = value > lo if lo_open else value >= lo
    high_ok = value < hi if hi_open else value <= hi
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low_ok and high_ok):
        raise ValueError(f"{name} must lie in {'(' if lo_open else '['}{lo}, {hi}"
                         f"{')' if hi_open else ']'}, got {value!r}")


# --------------------------------------------------------------------------- states
class CompressorState:
    """What every compressor holds: the group, the switches, per-bucket memories and the step.

    Subclasses set ``collective`` and implement ``encode(key, x) -> (message, context)`` and
    ``decode(message, context, n)`` (what one rank's message stands for); ``aggregate`` turns the
    gathered messages (or, for an allreduce, the one summed message) into the mean.  With
    ``error_feedback`` the hook keeps ``error_dict[key] = x - decode(own message)`` and adds it to
    the next gradient: input + old error = sent + new error.
    """

    collective = ALLGATHER
    variable_length = False
    error_feedback = False

    def __init__(self, process_group=None, random_seed: int = 0):
        _check("random_seed", random_seed, 0, 2**63 - 1)
        self.process_group = process_group
        self.random_seed = random_seed
        self.error_dict: dict[int, torch.Tensor] = {}
        self.momentum_dict: dict[int, torch.Tensor] = {}
        self.iter = 0
        self._generator: torch.Generator | None = None

    @property
    def generator(self) -> torch.Generator:
        """This rank's randomness (stochastic rounding is independent across ranks)."""
        if self._generator is None:
            rank = dist.get_rank() if dist.is_initialized() else 0
            self._generator = torch.Generator().manual_seed(stream_seed(self.random_seed, rank))
        return self._generator

    def memory(self, store: dict, key: int, like: torch.Tensor) -> torch.Tensor:
        """The bucket's memory, zero at first and after a rebuild changed the bucket's size."""
        if key not in store or store[key].numel() != like.numel():
            store[key] = torch.zeros(like.numel(), device=like.device)
        return store[key]

    def uniform(self, like: torch.Tensor) -> torch.Tensor:
        """Uniform [0, 1) draws shaped like ``like``, from this rank's generator."""
        return torch.rand(like.shape, generator=self.generator).to(like.device)

    def prepare(self, key: int, grad: torch.Tensor) -> torch.Tensor:
        x = grad.detach().float().clone()
        if self.error_feedback:
            x += self.memory(self.error_dict, key, x)
        return x

    def encode(self, key: int, x: torch.Tensor):
        raise NotImplementedError

    def decode(self, msg: torch.Tensor, ctx, n: int) -> torch.Tensor:
        raise NotImplementedError

    def aggregate(self, msgs: list, ctx, n: int, world_size: int) -> torch.Tensor:
        return sum(self.decode(m, ctx, n) for m in msgs) / world_size

    def compress(self, key: int, grad: torch.Tensor):
        """This rank's (message, context) for a bucket's gradient, its memories updated."""
        x = self.prepare(key, grad)
        msg, ctx = self.encode(key, x)
        if self.error_feedback:
            self.error_dict[key] = x - self.decode(msg, ctx, x.numel())
        return msg, ctx

    def maybe_increase_iter(self, bucket) -> None:
        if bucket.is_last():
            self.iter += 1


class TopKState(CompressorState):
    """Top-k: the k = ceil(compress_ratio * n) largest magnitudes, by allgather of values+indices."""

    def __init__(self, process_group=None, compress_ratio: float = 0.01,
                 use_error_feedback: bool = True, random_seed: int = 0):
        super().__init__(process_group, random_seed)
        _check("compress_ratio", compress_ratio, 0, 1, lo_open=True)
        self.compress_ratio, self.error_feedback = compress_ratio, use_error_feedback

    def k(self, n: int) -> int:
        return max(1, math.ceil(self.compress_ratio * n))

    def encode(self, key, x):
        idx = x.abs().topk(self.k(x.numel()), sorted=False).indices
        return sparse_message(x[idx], idx), None

    def decode(self, msg, ctx, n):
        return _scatter(*sparse_parts(msg), n)


class RandomKState(TopKState):
    """Random-k, unbiased: k indices drawn from a generator every rank seeds alike, values scaled
    by n / k; the messages add up, so one allreduce of k values."""

    collective = ALLREDUCE

    def __init__(self, process_group=None, compress_ratio: float = 0.01, random_seed: int = 0):
        super().__init__(process_group, compress_ratio, use_error_feedback=False, random_seed=random_seed)
        self.shared_generator = torch.Generator().manual_seed(random_seed)

    def encode(self, key, x):
        n = x.numel()
        k = self.k(n)
        idx = torch.randperm(n, generator=self.shared_generator)[:k].to(x.device)
        return x[idx] * (n / k), idx

    def decode(self, msg, ctx, n):
        return _scatter(msg, ctx, n)


class ThresholdState(TopKState):
    """Threshold: every element whose magnitude exceeds ``threshold``; a count that varies per rank."""

    variable_length = True

    def __init__(self, process_group=None, threshold: float = 1e-3, use_error_feedback: bool = True,
                 random_seed: int = 0):
        super().__init__(process_group, 1.0, use_error_feedback, random_seed)
        _check("threshold", threshold, 0, math.inf, lo_open=True, hi_open=True)
        self.threshold = threshold

    def encode(self, key, x):
        idx = (x.abs() > self.threshold).nonzero().reshape(-1)
        return sparse_message(x[idx], idx), None


class DGCState(TopKState):
    """Deep gradient compression: local clipping, momentum correction (u = m*u + g, v += u), top-k
    of v, and momentum factor masking (the sent entries of u and v are zeroed).  v is the memory:
    it keeps what was not sent."""

    def __init__(self, process_group=None, compress_ratio: float = 0.01, momentum: float = 0.9,
                 clip_norm: float = 0.0, random_seed: int = 0):
        super().__init__(process_group, compress_ratio, use_error_feedback=False, random_seed=random_seed)
        _check("momentum", momentum, 0, 1, hi_open=True)
        _check("clip_norm", clip_norm, 0, math.inf, hi_open=True)
        self.momentum, self.clip_norm = momentum, clip_norm

    def encode(self, key, x):
        n = x.numel()
        if self.clip_norm > 0:
            world = dist.get_world_size(self.process_group) if dist.is_initialized() else 1
            limit = self.clip_norm / math.sqrt(world)
            norm = float(x.norm())
            if norm > limit:
                x = x * (limit / norm)
        u = self.memory(self.momentum_dict, key, x)
        v = self.memory(self.error_dict, key, x)
        u.mul_(self.momentum).add_(x)
        v.add_(u)
        idx = v.abs().topk(self.k(n), sorted=False).indices
        msg = sparse_message(v[idx], idx)
        v[idx] = 0
        u[idx] = 0
        return msg, None


class QSGDState(CompressorState):
    """QSGD with s levels, unbiased: x_i -> ||x|| * sign(x_i) * xi_i / s, xi_i the stochastic
    rounding of s|x_i|/||x||; codes of ceil(log2(2s+1)) bits (rounded up to 2, 4 or 8) + the norm."""

    def __init__(self, process_group=None, levels: int = 7, random_seed: int = 0):
        super().__init__(process_group, random_seed)
        if isinstance(levels, bool) or not isinstance(levels, int):
            raise ValueError(f"levels must be a whole number, got {levels!r}")
        _check("levels", levels, 1, 127)
        self.levels = levels
        self.bits = code_bits(2 * levels + 1)

    def encode(self, key, x):
        norm = x.norm()
        scaled = x.abs() / norm * self.levels if norm > 0 else torch.zeros_like(x)
        low = scaled.floor()
        level = low + (self.uniform(x) < scaled - low).float()
        codes = (torch.sign(x) * level + self.levels).to(torch.int32)
        return torch.cat([floats_to_bytes(norm), pack_codes(codes, self.bits)]), None

    def decode(self, msg, ctx, n):
        norm = bytes_to_floats(msg, 1)[0]
        return norm / self.levels * (unpack_codes(msg[4:], self.bits, n).float() - self.levels)


class TernGradState(CompressorState):
    """TernGrad, as in the paper: the bucket clipped to +-clip_sigmas * sigma (sigma the standard
    deviation of its elements, about their mean; 0 = no clipping), then x_i -> max|x| * sign(x_i)
    * b_i, b_i ~ Bernoulli(|x_i| / max|x|) of the clipped x: unbiased for the clipped bucket; 2 bits.
    A bucket with sigma = 0 (constant, or of one element) is left unclipped: clipping would zero it."""

    def __init__(self, process_group=None, clip_sigmas: float = 2.5, random_seed: int = 0):
        super().__init__(process_group, random_seed)
        _check("clip_sigmas", clip_sigmas, 0, math.inf, hi_open=True)
        self.clip_sigmas = clip_sigmas

    def clip(self, x: torch.Tensor) -> torch.Tensor:
        """x clipped to +-clip_sigmas * sigma, written as GRACE writes it (so that the two agree
        bit for bit: tests/test_grace.py)."""
        if self.clip_sigmas == 0:
            return x
        sigma = float(torch.sqrt(torch.mean((x - torch.mean(x)) ** 2)))
        if sigma == 0:
            return x
        limit = self.clip_sigmas * sigma
        return torch.clamp(x, -limit, limit)

    def encode(self, key, x):
        x = self.clip(x)
        scale = x.abs().max()
        p = x.abs() / scale if scale > 0 else torch.zeros_like(x)
        b = (self.uniform(x) < p).float()
        codes = (torch.sign(x) * b + 1).to(torch.int32)
        return torch.cat([floats_to_bytes(scale), pack_codes(codes, 2)]), None

    def decode(self, msg, ctx, n):
        scale = bytes_to_floats(msg, 1)[0]
        return scale * (unpack_codes(msg[4:], 2, n).float() - 1)


class NaturalState(CompressorState):
    """Natural compression, unbiased: |x_i| in [2^e, 2^(e+1)) goes to 2^(e+1) with probability
    |x_i| / 2^e - 1, else to 2^e.  A power of two is exact in bfloat16, so 16 bits go on the wire
    (the paper's 9 -- sign and exponent -- would need a custom bit packing)."""

    def encode(self, key, x):
        mag = x.abs()
        low = torch.where(mag > 0, torch.exp2(torch.floor(torch.log2(mag))), torch.zeros_like(mag))
        p = torch.where(low > 0, mag / low - 1, torch.zeros_like(mag))
        up = self.uniform(x) < p
        rounded = torch.sign(x) * torch.where(up, 2 * low, low)
        # as bytes: Gloo's allgather garbled int16 here (NaN after decoding, measured)
        return rounded.to(torch.bfloat16).view(torch.uint8), None

    def decode(self, msg, ctx, n):
        return msg.view(torch.bfloat16).float()


class SignSGDState(CompressorState):
    """signSGD with majority vote: each rank sends sign(x) (1 bit, + for zero); the result is the
    sign of the votes' sum (0 on a tie), the same on every rank."""

    def encode(self, key, x):
        return pack_codes((x >= 0).to(torch.int32), 1), None

    def decode(self, msg, ctx, n):
        return unpack_codes(msg, 1, n).float() * 2 - 1

    def aggregate(self, msgs, ctx, n, world_size):
        return torch.sign(sum(self.decode(m, ctx, n) for m in msgs))


class SignumState(SignSGDState):
    """Signum: signSGD with majority vote on the momentum m = beta*m + (1-beta)*g of each rank."""

    def __init__(self, process_group=None, momentum: float = 0.9, random_seed: int = 0):
        super().__init__(process_group, random_seed)
        _check("momentum", momentum, 0, 1, hi_open=True)
        self.momentum = momentum

    def prepare(self, key, grad):
        m = self.memory(self.momentum_dict, key, grad)
        m.mul_(self.momentum).add_(grad.detach().float(), alpha=1 - self.momentum)
        return m.clone()


class EFSignSGDState(CompressorState):
    """EF-signSGD: p = g + e; send (||p||_1 / n) * sign(p) as the scale and 1-bit signs; e = p - sent."""

    error_feedback = True

    def encode(self, key, x):
        scale = x.abs().mean()
        return torch.cat([floats_to_bytes(scale), pack_codes((x >= 0).to(torch.int32), 1)]), None

    def decode(self, msg, ctx, n):
        scale = bytes_to_floats(msg, 1)[0]
        return scale * (unpack_codes(msg[4:], 1, n).float() * 2 - 1)


class OneBitState(CompressorState):
    """1-bit SGD with error feedback: p = g + e; 1 bit per element, decoded as the mean of p's
    non-negative entries or of its negative ones (two floats); e = p - decoded."""

    error_feedback = True

    def encode(self, key, x):
        positive = x >= 0
        pos = x[positive].mean() if positive.any() else x.new_zeros(())
        neg = x[~positive].mean() if (~positive).any() else x.new_zeros(())
        return torch.cat([floats_to_bytes(pos, neg), pack_codes(positive.to(torch.int32), 1)]), None

    def decode(self, msg, ctx, n):
        pos, neg = bytes_to_floats(msg, 2)
        return torch.where(unpack_codes(msg[8:], 1, n).bool(), pos, neg)


# --------------------------------------------------------------------------- the hook
def compressor_hook(state: CompressorState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Compress the bucket as ``state`` says; one collective (two for threshold), from the body."""
    buf = bucket.buffer()
    key, n = bucket.index(), buf.numel()
    group = group_of(state.process_group)
    world_size = group.size()
    msg, ctx = state.compress(key, buf)
    state.maybe_increase_iter(bucket)
    if state.collective == ALLREDUCE:
        fut = dist.all_reduce(msg, group=group, async_op=True).get_future()

        def finish_sum(f):
            return buf.copy_(state.aggregate([f.value()[0]], ctx, n, world_size))

        return futures.then(fut, finish_sum)
    lengths = None
    if state.variable_length:
        mine = torch.tensor([msg.numel()])
        lengths = [torch.zeros_like(mine) for _ in range(world_size)]
        dist.all_gather(lengths, mine, group=group)  # waited for here, in bucket order
        lengths = [int(t) for t in lengths]
        msg = torch.cat([msg, msg.new_zeros(max(lengths) - msg.numel())])
    gathered = [torch.empty_like(msg) for _ in range(world_size)]
    fut = dist.all_gather(gathered, msg, group=group, async_op=True).get_future()

    def finish(f):
        msgs = gathered if lengths is None else [m[:size] for m, size in zip(gathered, lengths)]
        return buf.copy_(state.aggregate(msgs, ctx, n, world_size))

    return futures.then(fut, finish)


# --------------------------------------------------------------------------- one hook per method
def _hook_named(name: str):
    def hook(state: CompressorState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return compressor_hook(state, bucket)

    hook.__name__ = hook.__qualname__ = name
    hook.__doc__ = f"``compressor_hook`` under the name DDP logs: {name}."
    return hook


# Each compressor's hook, under the name its row of the hook table gives (topk_hook, ...): a new
# compressor is its state class here and its row there.
HOOK_NAMES = tuple(s.attr for s in SPECS.values() if s.variant == __name__)
globals().update({name: _hook_named(name) for name in HOOK_NAMES})

__all__ = ["CompressorState", "TopKState", "RandomKState", "ThresholdState", "DGCState",
           "QSGDState", "TernGradState", "NaturalState", "SignSGDState", "SignumState",
           "EFSignSGDState", "OneBitState", "compressor_hook", *HOOK_NAMES]
