"""Parameter shapes for the compression rule, without training anything.

Built-in workloads and large reference models are built on the meta device (no memory);
checkpoints are memory-mapped, so a multi-GB state_dict is read for its shapes only.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch.overrides import TorchFunctionMode

from commlab import workloads
from commlab.analysis.rule import named_shapes

Shapes = list[tuple[str, tuple[int, ...]]]

# GPT-2 XL's dimensions: 48 layers of width 1600, about 1.5 billion parameters.
REFERENCE_MODELS = {
    "gpt2-xl (1.5B, meta device)": dict(vocab=50257, block_size=1024, n_layer=48, n_head=25, n_embd=1600),
    "gpt2 (124M, meta device)": dict(vocab=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
}


class _SkipInit(TorchFunctionMode):
    """Turns ``torch.nn.init`` calls into no-ops: on the meta device the values never exist, and
    the reference implementations of the random fills import torch._dynamo (seconds)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs.get("tensor")
        return func(*args, **(kwargs or {}))


def on_meta(build) -> Shapes:
    with torch.device("meta"), _SkipInit():
        return named_shapes(build())


def from_workload(spec: str) -> Shapes:
    """A built-in workload's shapes, on the meta device.  A person's ``module:function`` is never
    run here: ``commlab.engine.workload_probe.shapes`` builds it in a child process."""
    if spec not in workloads.MODELS:
        raise ValueError(f"unknown built-in workload {spec!r}; built-in workloads are: "
                         f"{', '.join(workloads.MODELS)}")
    return on_meta(workloads.MODELS[spec])


def from_reference(name: str) -> Shapes:
    return on_meta(lambda: workloads.CharLM(**REFERENCE_MODELS[name]))


def from_state_dict(state: dict) -> Shapes:
    # Checkpoints often nest the weights under a key; buffers such as running means are
    # indistinguishable from parameters here and are kept (they are vectors: never compressed).
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(state.get(key), dict):
            state = state[key]
    shapes = [(k, tuple(v.shape)) for k, v in state.items()
              if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not shapes:
        raise ValueError("the checkpoint holds no floating-point tensors: expected a state_dict "
                         "(name -> tensor), possibly under 'state_dict' or 'model'")
    return shapes


def from_checkpoint(path: str | os.PathLike) -> Shapes:
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception:  # not a zip checkpoint: mmap is impossible, read it normally
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as again:  # its own reason: the mmap attempt's is about mmap
            raise ValueError(_unreadable(path, again)) from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a state_dict")
    return from_state_dict(state)


def _unreadable(path, e: Exception) -> str:
    """One line on why torch.load refused a file: torch's own message is paragraphs, with
    terminal colour codes."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    pickled = re.search(r"GLOBAL ([\w.]+) was not an allowed global", text)
    if pickled:
        return (f"{path} holds a pickled {pickled[1].rsplit('.', 1)[-1]} (saved with "
                "torch.save(model)?), not a state_dict: reading it would run code from the file. "
                "Save the weights with torch.save(model.state_dict(), path) and give that file")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{path} is not a readable torch checkpoint: {type(e).__name__}: {first[:200]}"


def total_numel(shapes: Sequence[tuple[str, tuple[int, ...]]]) -> int:
    import math

    return sum(math.prod(s) for _, s in shapes)
