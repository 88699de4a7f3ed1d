"""PowerSGD's two pitfalls, caught while a run goes (measured on torch 2.13, PyTorch's code and
commlab's alike).

- A compressed gradient that is all zeros, with ``orthogonalization_epsilon=0``: P = MQ = 0, and
  Gram-Schmidt divides P's columns by their zero norms, so P, Q, the output and the error memory
  of that layer turn NaN; the NaN update reaches the parameter, and the model turns NaN as soon
  as it is used.  ``orthogonalization_epsilon=1e-8`` avoids it.
- A compressed gradient of rank below ``matrix_approximation_rank`` (a rank-1 (10, 48) gradient
  at rank 2, identical rows): P's later columns are rounding noise, and normalizing them gives
  NaN (epsilon 0) or a direction that adds up to about the mean again: 1.02-1.98x the mean with
  1e-8.  A lower rank, or leaving the layer uncompressed, avoids it.

The checks are cheap: after each step, one fused ``isfinite`` over each bucket's P, Q and error
memory (rank 0's own; P and Q are the same on every rank after their allreduces), and on the
steps ``error_every`` measures, the per-layer relative errors against the exact mean that the
instrument computed anyway.  No collective: a NaN found here is already in the model.
"""
from __future__ import annotations

import math
from collections import defaultdict

import torch

from commlab.analysis.rule import decide

ZERO_GRADIENT, LOW_RANK = "zero_gradient", "rank_below_matrix_approximation_rank"
EPSILON = 1e-8  # the orthogonalization_epsilon that keeps a zero norm from dividing
# An orthogonal projection's error never exceeds the gradient's norm (relative error <= 1);
# the amplified noise of a rank-deficient gradient gives about 1 (2x the mean) or NaN.  Below it
# (1.02-1.6x the mean) the comparison cannot tell the pitfall from a coarse approximation.
SUSPECT_REL_ERROR = 0.99


def finite(tensors: list[torch.Tensor]) -> bool:
    """All of the tensors finite, from one read of each.  A sum is finite only if every element
    is (NaN and infinities carry into it), and summing is some thirty times cheaper than testing
    each element (8.4 against 0.24 ms for wide's four 4 MB error memories), which rank 0 does
    every step; only a sum that is not finite, which large finite elements can also overflow,
    is checked element by element."""
    tensors = [t for t in tensors if t is not None and t.numel()]
    if not tensors:
        return True
    if bool(torch.stack([t.sum().float() for t in tensors]).isfinite().all()):
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def bucket_params(layout: dict | None) -> list[tuple[str, tuple, int, int]]:
    """(name, shape, offset, numel) of each parameter of a bucket layout (buckets.json's), in
    the order of the bucket's flat buffer."""
    out, offset = [], 0
    for p in (layout or {}).get("params", []):
        out.append((p["name"], tuple(p["shape"]), offset, p["numel"]))
        offset += p["numel"]
    return out


def p_slices(shapes: list[tuple], rank: int,
             min_compression_rate: float) -> dict[int, tuple[int, int, int]]:
    """Where each compressed parameter's P lies in its bucket's P memory, as the layer-wise hook
    (``commlab.hooks.powersgd._powersgd``, PyTorch's ``powerSGD_hook``) lays it out: parameter
    index -> (offset, n, r).  Matrices are grouped by shape, in order of first appearance; the
    offsets are the same whether a group is stacked (batch_tensors_with_same_shape) or not."""
    by_shape: dict[tuple, list[int]] = defaultdict(list)
    for i, shape in enumerate(shapes):
        d = decide("", shape, rank, min_compression_rate)
        if d.compressed:
            by_shape[(d.n, d.m)].append(i)
    out, offset = {}, 0
    for (n, m), members in by_shape.items():
        r = min(n, m, rank)
        for i in members:
            out[i] = (offset, n, r)
            offset += n * r
    return out


def uncompressed_rate(shape: tuple, rank: int) -> float:
    """The smallest min_compression_rate that leaves a tensor of this shape uncompressed."""
    d = decide("", shape, rank, 0.0)
    return d.rhs / ((d.n + d.m) * d.r)


class Watch:
    """Rank 0's watch over a PowerSGD state (PyTorch's ``PowerSGDState`` or commlab's, which is
    the same): ``after_step`` returns the new pitfall records, one per layer and kind."""

    def __init__(self, state, layerwise: bool):
        self.state = state
        self.layerwise = layerwise  # the layer-wise hook (P per layer), not the batched one
        self.found: list[dict] = []
        self._seen: set[tuple[str, str]] = set()

    def after_step(self, step: int, layouts: list[dict] | None, layer_errors: list[dict],
                   loss_finite: bool) -> list[dict]:
        """Call once the step's backward returned: every hook future, and so every memory
        write, is done by then."""
        by_index = {b["index"]: b for b in layouts or []}
        new = []
        if loss_finite and self.state.orthogonalization_epsilon == 0:
            # NaN from a model that diverged by itself is not a PowerSGD pitfall.
            for index in sorted(self.state.error_dict):
                new += self._memories(step, index, by_index.get(index))
        for row in layer_errors if loss_finite else []:
            rel = row.get("rel_error")
            # Error feedback adds last step's error, so beside the exact mean of this step's
            # gradients a sound compression can be off by more than 1: then only NaN counts.
            suspect = math.isnan(rel) or (rel >= SUSPECT_REL_ERROR and (
                rel == math.inf or not self.state.use_error_feedback))
            if not suspect:
                continue
            shape = next((s for name, s, _, _ in bucket_params(by_index.get(row["bucket"]))
                          if name == row["layer"]), None)
            if rel == math.inf:  # the exact mean was zero, the compressed one was not
                new += self._add(step, row["layer"], ZERO_GRADIENT, shape,
                                 "the exact mean gradient was all zeros and the compressed one "
                                 f"was not (bucket {row['bucket']})")
                continue
            new += self._add(step, row["layer"], LOW_RANK, shape,
                             f"relative error {rel:.3g} against the exact mean gradient "
                             f"(bucket {row['bucket']}): the compressed gradient is off by about "
                             "its own size, as when its rank is below matrix_approximation_rank")
        return new

    def _memories(self, step: int, index: int, layout: dict | None) -> list[dict]:
        s = self.state
        p, q, err = s.p_memory_dict.get(index), s.q_memory_dict.get(index), s.error_dict.get(index)
        if finite([p, q, err]):
            return []
        params = bucket_params(layout)
        if not params:
            return self._add(step, f"bucket {index}", ZERO_GRADIENT, None,
                             f"P/Q/error memory of bucket {index} became NaN with "
                             "orthogonalization_epsilon=0")
        slices = (p_slices([sh for _, sh, _, _ in params], s.matrix_approximation_rank,
                           s.min_compression_rate)
                  if self.layerwise and p is not None else {})
        new = []
        for i, (name, shape, offset, numel) in enumerate(params):
            if err is not None and finite([err[offset:offset + numel]]):
                continue
            kind, how = ZERO_GRADIENT, "its gradient was all zeros or of rank below the rank"
            if i in slices:
                p_off, n, r = slices[i]
                own = p[p_off:p_off + n * r].view(n, r)
                if finite([own]):
                    continue  # this layer's P is fine: its NaN came from elsewhere
                if finite([own[:, 0]]):
                    kind, how = LOW_RANK, (f"P's first column is finite and a later one is not: "
                                           f"the gradient's rank is below {r}")
                else:
                    how = "P = MQ was all zeros: the gradient was all zeros"
            new += self._add(step, name, kind, shape,
                             f"P/Q/error memory became NaN with orthogonalization_epsilon=0 "
                             f"(Gram-Schmidt divided by a zero norm; {how})")
        return new

    def _add(self, step: int, layer: str, kind: str, shape: tuple | None, detail: str) -> list[dict]:
        if (layer, kind) in self._seen:
            return []
        self._seen.add((layer, kind))
        rec = {"step": step, "layer": layer, "kind": kind, "detail": detail,
               "fix": self.fix(kind, layer, shape)}
        self.found.append(rec)
        return [rec]

    def fix(self, kind: str, layer: str, shape: tuple | None) -> str:
        s = self.state
        eps = f"set orthogonalization_epsilon={EPSILON:g}"
        if kind == ZERO_GRADIENT:
            return eps
        keep = (f", or keep {layer} uncompressed (min_compression_rate >= "
                f"{uncompressed_rate(shape, s.matrix_approximation_rank):.3g})" if shape else "")
        lower = f"lower matrix_approximation_rank below {s.matrix_approximation_rank}{keep}"
        return f"{eps} and {lower}" if s.orthogonalization_epsilon == 0 else lower

    def reason(self) -> str | None:
        """The first pitfall, as the words that end a diverged run's error."""
        if not self.found:
            return None
        first = self.found[0]
        return (f"PowerSGD's {first['kind'].replace('_', ' ')} in layer {first['layer']} at step "
                f"{first['step']}: {first['fix']}")
