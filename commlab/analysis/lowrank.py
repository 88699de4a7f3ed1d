"""How far a rank-r approximation of a gradient lies from the gradient: the optimum against PowerSGD.

A gradient is viewed as PowerSGD views it, an n x m matrix M (``shape[0]`` x the rest). Errors are
relative, ||M - approximation||_F / ||M||_F, as the run measures them.

- The optimum is the truncated SVD. By Eckart–Young its error needs only the singular values:
  sqrt(sum of the squared singular values past the r-th) / ||M||_F.
- PowerSGD's is one power iteration, computed as ``powerSGD_hook`` computes it: Q drawn from
  N(0, 1) with the seeds ``PowerSGDState.rng`` hands out, orthogonalized; P = MQ, orthogonalized;
  Q = MᵀP; M ≈ PQᵀ. With warm start the next step starts from the Q this step ended with.

The exact mean gradient a run saves is the matrix the hook approximated on every rank at once:
P = Σ M_i Q and Q = Σ M_iᵀ P / N are linear in the ranks' gradients, so the allreduced P and Q are
those of the mean. What the saved gradient lacks is error feedback's residual, which the run adds
before compressing; the errors measured during the run (``errors.jsonl``) include it.

Q is drawn in the gradient's dtype, as the hook draws it, then widened: the random numbers are the
hook's, and the arithmetic is float64, so rounding never hides the algorithm's own error.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

from commlab.analysis.metrics import relative_error
from commlab.analysis.rule import matrix_view

MAX_RANK = 32


def as_matrix(grad: torch.Tensor) -> torch.Tensor:
    """The float64 n x m matrix PowerSGD sees for this gradient."""
    return grad.detach().reshape(matrix_view(tuple(grad.shape))).to(torch.float64)


def singular_values(matrix: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(matrix.to(torch.float64))


def optimum_errors(sv: torch.Tensor, ranks: Iterable[int]) -> list[float]:
    """Eckart–Young: the truncated SVD's relative error at each rank, from singular values alone."""
    energy = sv.to(torch.float64) ** 2
    # Summed from the smallest up, so a tiny tail is not lost to cancellation against the total.
    tail = torch.cat([energy.flip(0).cumsum(0).flip(0), energy.new_zeros(1)])
    total = float(tail[0])
    if total == 0:
        return [0.0 for _ in ranks]
    return [float(tail[min(r, len(sv))].sqrt()) / total ** 0.5 for r in ranks]


def seeds(random_seed: int, count: int) -> list[int]:
    """The seeds ``PowerSGDState.rng`` hands out, one each time a bucket draws its Qs afresh."""
    rng = np.random.RandomState(random_seed)
    return [int(rng.randint(1_000_000_000)) for _ in range(count)]


def random_q(m: int, r: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Q as the hook draws it for the first matrix of a bucket: ``torch.manual_seed(seed)`` then
    N(0, 1) of shape (1, m, r) on the CPU. (A bucket's later matrices continue the same stream.)"""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, m, r, generator=g, dtype=dtype).to(torch.float64)


def _orthogonalized(batch: torch.Tensor, epsilon: float) -> torch.Tensor:
    # PyTorch's own helper, so the method (Gram–Schmidt up to rank 2, QR above) is the hook's.
    out = batch.clone()
    _orthogonalize(out, epsilon)
    return out


def power_step(matrix: torch.Tensor, q: torch.Tensor,
               epsilon: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """One PowerSGD step on M (n x m) from Q (1 x m x r): the approximation PQᵀ, and the Q the
    hook keeps for warm start (MᵀP, orthogonalized only when the next step begins)."""
    m3 = matrix.to(torch.float64).unsqueeze(0)
    p = _orthogonalized(torch.bmm(m3, _orthogonalized(q, epsilon)), epsilon)
    q_next = torch.bmm(m3.transpose(1, 2), p)
    return torch.bmm(p, q_next.transpose(1, 2))[0], q_next


def power_errors(matrix: torch.Tensor, ranks: Iterable[int], seed: int, epsilon: float = 0.0,
                 dtype: torch.dtype = torch.float32) -> list[float]:
    """PowerSGD's relative error at each rank, every rank from a fresh Q drawn with ``seed``."""
    n, m = matrix.shape
    return [relative_error(power_step(matrix, random_q(m, min(n, m, r), seed, dtype),
                                      epsilon)[0], matrix)
            for r in ranks]


@dataclass(frozen=True)
class LayerError:
    """One layer at one step: relative errors at ranks 1..len(ranks), and its spectrum."""

    name: str
    shape: tuple[int, ...]
    n: int
    m: int
    ranks: list[int]
    optimum: list[float]
    power: list[float]
    singular_values: list[float]

    def at(self, rank: int) -> tuple[float, float]:
        """(optimum, power iteration) at a rank; ranks past min(n, m) are capped, as the rule caps them."""
        i = min(rank, self.ranks[-1]) - 1
        return self.optimum[i], self.power[i]


def layer_error(name: str, grad: torch.Tensor, random_seed: int = 0, max_rank: int = MAX_RANK,
                epsilon: float = 0.0) -> LayerError:
    """Errors against rank 1..min(max_rank, n, m): beyond min(n, m) PowerSGD's r stops growing."""
    matrix = as_matrix(grad)
    n, m = matrix.shape
    ranks = list(range(1, min(n, m, max_rank) + 1))
    sv = singular_values(matrix)
    return LayerError(name, tuple(grad.shape), n, m, ranks, optimum_errors(sv, ranks),
                      power_errors(matrix, ranks, seeds(random_seed, 1)[0], epsilon, grad.dtype),
                      sv.tolist())


def step_errors(grads: dict[str, torch.Tensor], names: Sequence[str], random_seed: int = 0,
                max_rank: int = MAX_RANK, epsilon: float = 0.0) -> list[LayerError]:
    """``layer_error`` for each named layer of one saved step (the names a run compressed)."""
    return [layer_error(name, grads[name], random_seed, max_rank, epsilon)
            for name in names if name in grads and grads[name].dim() > 1]


@dataclass(frozen=True)
class WarmStart:
    """One layer over consecutive steps at one rank: optimum, a fresh Q each step, warm start."""

    name: str
    rank: int
    steps: list[int]
    optimum: list[float]
    cold: list[float]
    warm: list[float]


def _warm_chain(matrices: Sequence[torch.Tensor], r: int, seed: int, epsilon: float,
                dtype: torch.dtype) -> list[float]:
    """Errors over consecutive steps when Q is drawn once, then carried (Q = MᵀP)."""
    q = random_q(matrices[0].shape[1], r, seed, dtype)
    errors = []
    for matrix in matrices:
        approx, q = power_step(matrix, q, epsilon)
        errors.append(relative_error(approx, matrix))
    return errors


def warm_start(name: str, grads_by_step: dict[int, torch.Tensor], rank: int, random_seed: int = 0,
               epsilon: float = 0.0) -> WarmStart:
    """What the hook does to one layer's gradients over consecutive steps, alone in its bucket and
    as if compression began at the first of them.

    Without warm start it draws a new seed every step; with it, it draws once and then carries
    Q = MᵀP from step to step, so the iteration keeps refining one subspace while the gradient
    drifts.
    """
    steps = sorted(grads_by_step)
    matrices = [as_matrix(grads_by_step[s]) for s in steps]
    dtype = grads_by_step[steps[0]].dtype
    n, m = matrices[0].shape
    r = min(n, m, rank)
    step_seeds = seeds(random_seed, len(steps))
    optimum = [optimum_errors(singular_values(matrix), [r])[0] for matrix in matrices]
    cold = [relative_error(power_step(matrix, random_q(m, r, seed, dtype), epsilon)[0], matrix)
            for matrix, seed in zip(matrices, step_seeds)]
    warm = _warm_chain(matrices, r, step_seeds[0], epsilon, dtype)
    return WarmStart(name, r, steps, optimum, cold, warm)


def warm_errors_by_rank(grads_by_step: dict[int, torch.Tensor], random_seed: int = 0,
                        max_rank: int = MAX_RANK, epsilon: float = 0.0) -> list[float]:
    """Warm start's error at the last of consecutive steps, at ranks 1..min(max_rank, n, m): the
    curve to set beside ``LayerError.power`` of that step."""
    steps = sorted(grads_by_step)
    matrices = [as_matrix(grads_by_step[s]) for s in steps]
    n, m = matrices[0].shape
    seed, dtype = seeds(random_seed, 1)[0], grads_by_step[steps[0]].dtype
    return [_warm_chain(matrices, r, seed, epsilon, dtype)[-1] for r in range(1, min(n, m, max_rank) + 1)]


def consecutive_chain(steps: Iterable[int], step: int) -> list[int]:
    """The longest run of consecutive saved steps that holds ``step``: warm start carries Q only
    from one step to the very next."""
    saved = set(steps)
    lo = hi = step
    while lo - 1 in saved:
        lo -= 1
    while hi + 1 in saved:
        hi += 1
    return list(range(lo, hi + 1))


def warm_start_steps(steps: Iterable[int], step: int) -> tuple[list[int], list[int]]:
    """(chain, upto): the consecutive saved steps around ``step``, and those of them up to it.
    Warm start at ``step`` means Q was carried from the steps just before it, so the by-rank
    curve of that step uses ``upto``; the over-steps comparison uses the whole chain."""
    chain = consecutive_chain(steps, step)
    return chain, [s for s in chain if s <= step]


def layer_over_steps(grads_at: Callable[[int], dict[str, torch.Tensor]], steps: Iterable[int],
                     name: str) -> dict[int, torch.Tensor]:
    """One layer's saved gradient at each of ``steps`` (``grads_at`` is e.g. ``Run.grads``): what
    ``warm_start`` and ``warm_errors_by_rank`` take."""
    return {s: grads_at(s)[name] for s in steps}


def compressed_names(layers: list[dict]) -> list[str]:
    """The layers a run's rule compressed (``layers.json``), in registration order."""
    return [d["name"] for d in layers if d.get("compressed")]


def layers_to_analyse(layers: list[dict]) -> tuple[list[str], bool]:
    """(names, all_matrices): the compressed layers, or, where the rule compressed none at the
    run's settings, every matrix (so that the page still has something to compare)."""
    names = compressed_names(layers)
    if names:
        return names, False
    return [d["name"] for d in layers if len(d["shape"]) > 1], True


def measured_rows(error_records: list[dict]) -> list[dict]:
    """``errors.jsonl`` in long form: one row per step and layer or bucket."""
    rows = []
    for rec in error_records:
        for d in rec.get("layers", []):
            rows.append({"step": rec["step"], "scope": "layer", "name": d["layer"],
                         "bucket": d["bucket"], "rel_error": d["rel_error"]})
        for d in rec.get("buckets", []):
            rows.append({"step": rec["step"], "scope": "bucket", "name": f"bucket {d['bucket']}",
                         "bucket": d["bucket"], "rel_error": d["rel_error"]})
    return rows


def ef_residual_norms(error_records: list[dict]) -> list[tuple[int, float]]:
    """(step, norm of error feedback's memory) wherever the run recorded one."""
    return [(rec["step"], rec["ef_residual_norm"]) for rec in error_records
            if rec.get("ef_residual_norm") is not None]
