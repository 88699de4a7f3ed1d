"""PowerSGD's compression-rate rule and byte accounting, as pure functions over shapes.

The rule is PyTorch's (``powerSGD_hook``): a gradient is viewed as an n x m matrix
(``shape[0]`` x the product of the rest), r = min(n, m, rank), and it is compressed only when
``(n + m) * r * min_compression_rate < n * m``.  A vector of length k is a k x 1 matrix: the
documentation says vectors are never compressed, and with min_compression_rate >= 1 they never
are, but below 1 torch 2.13 compresses them ((k + 1) * rate < k), and so does commlab.
Compressed, a tensor costs (n + m) * r elements on the wire (P and Q); uncompressed, n * m.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

# The ring's 2(N-1)/N lives in commlab.analysis.ring; tests/test_rule.py still imports it from here.


@dataclass(frozen=True)
class LayerDecision:
    name: str
    shape: tuple[int, ...]
    n: int
    m: int
    r: int
    lhs: float  # (n + m) * r * min_compression_rate
    rhs: int  # n * m
    compressed: bool
    numel_before: int
    numel_after: int
    # How the tensor holds its matrix, where that is not the usual out × in (``layouts``); ""
    layout: str = ""

    def as_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d


def matrix_view(shape: Sequence[int]) -> tuple[int, int]:
    """The n x m matrix PowerSGD sees for a tensor of this shape."""
    if len(shape) == 0:
        return 1, 1
    n = int(shape[0])
    m = math.prod(int(s) for s in shape[1:]) if len(shape) > 1 else 1
    return n, m


def decide(name: str, shape: Sequence[int], matrix_approximation_rank: int,
           min_compression_rate: float, layout: str = "") -> LayerDecision:
    shape = tuple(int(s) for s in shape)
    numel = math.prod(shape) if shape else 1
    n, m = matrix_view(shape)
    r = min(n, m, matrix_approximation_rank)
    lhs = (n + m) * r * min_compression_rate
    rhs = n * m
    # Scalars are left out: torch's hook would index shape[0] of a 0-d tensor.
    compressed = len(shape) > 0 and lhs < rhs
    after = (n + m) * r if compressed else numel
    return LayerDecision(name, shape, n, m, r, lhs, rhs, compressed, numel, after, layout)


@dataclass(frozen=True)
class RuleSummary:
    layers: list[LayerDecision]
    numel_before: int
    numel_after: int

    @property
    def predicted_ratio(self) -> float:
        """The rule's predicted compression ratio: elements before over elements after, from the
        shapes alone (``metrics.steady_compression_ratio`` is what a run measured)."""
        return self.numel_before / self.numel_after if self.numel_after else math.inf

    @property
    def compressed_count(self) -> int:
        return sum(d.compressed for d in self.layers)

    def as_dict(self) -> dict:
        return {
            "predicted_ratio": self.predicted_ratio,
            "numel_before": self.numel_before,
            "numel_after": self.numel_after,
            "layers": [d.as_dict() for d in self.layers],
        }


def apply_rule(named_shapes: Iterable[tuple[str, Sequence[int]]], matrix_approximation_rank: int,
               min_compression_rate: float, layouts: dict[str, str] | None = None) -> RuleSummary:
    layouts = layouts or {}
    layers = [decide(name, shape, matrix_approximation_rank, min_compression_rate, layouts.get(name, ""))
              for name, shape in named_shapes]
    return RuleSummary(layers, sum(d.numel_before for d in layers), sum(d.numel_after for d in layers))


def shard_name(name: str, shard: int, shards: int) -> str:
    """How a run names one rank's dim-0 shard of a parameter: ``0.weight [shard 0 of 2]``."""
    return f"{name} [shard {shard} of {shards}]"


def dim0_shard(shape: Sequence[int], shard: int, shards: int) -> tuple[int, ...]:
    """The shape of shard ``shard`` of ``shards`` of a tensor cut on dim 0 as FSDP2 cuts it
    (``torch.chunk``: ceil(rows / shards) rows each, the last ones short, or empty where the rows
    run out).  PowerSGD sees a shard as the matrix it is: its rows x the rest."""
    shape = tuple(int(s) for s in shape)
    if not shape:  # a scalar is held whole by the first shard
        return shape if shard == 0 else (0,)
    per = math.ceil(shape[0] / shards)
    return (max(0, min(per, shape[0] - shard * per)), *shape[1:])


def on_shards(named: Iterable[tuple[str, Sequence[int]]], shards: int,
              layouts: dict[str, str] | None = None) -> tuple[list[tuple[str, tuple[int, ...]]], dict[str, str]]:
    """(named shapes, layouts) of every dim-0 shard of each parameter, shard by shard within a
    parameter: what the lab's hook between HSDP's replicas applies the rule to (each rank its own
    shards)."""
    layouts = layouts or {}
    out, out_layouts = [], {}
    for name, shape in named:
        for k in range(shards):
            out.append((shard_name(name, k, shards), dim0_shard(shape, k, shards)))
            if name in layouts:
                out_layouts[out[-1][0]] = layouts[name]
    return out, out_layouts


def named_shapes(model) -> list[tuple[str, tuple[int, ...]]]:
    """Shapes of a model's trainable parameters, in registration order (works on meta tensors)."""
    return [(name, tuple(p.shape)) for name, p in model.named_parameters() if p.requires_grad]


# Hugging Face's Conv1D (GPT-2's attention and MLP layers) is a linear layer that keeps its weight
# as in × out (``nx`` × ``nf``), the transpose of nn.Linear's out × in.  PowerSGD reads shape[0]
# as n all the same, so for it n is the layer's input features and m its output features; the
# decision and the bytes are unchanged ((n + m)·r and n·m are symmetric), only P (n × r) and
# Q (m × r) trade places.
IN_BY_OUT = "in × out (Conv1D: n = in features, m = out features)"
IN_BY_OUT_NOTE = ("Conv1D (Hugging Face's GPT-2 layers) keeps its weight as in × out, the transpose "
                  "of nn.Linear's out × in: PowerSGD's n × m is in features × out features for it. "
                  "The decision and the bytes are the same either way ((n + m)·r and n·m are "
                  "symmetric); only P (n × r) and Q (m × r) trade places.")


def layouts(model) -> dict[str, str]:
    """The parameters whose matrix is stored in × out (Conv1D's weights), by name: ``IN_BY_OUT``.
    Found by the module's own attributes, not by importing the library that defines it."""
    found = {}
    for prefix, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if (type(module).__name__ == "Conv1D" and weight is not None and weight.dim() == 2
                and tuple(weight.shape) == (getattr(module, "nx", None), getattr(module, "nf", None))):
            found[f"{prefix}.weight" if prefix else "weight"] = IN_BY_OUT
    return found
