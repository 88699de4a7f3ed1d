"""A model's batches, outputs and loss as the ecosystem has them: the one place that the worker,
the workload check, the held-out evaluation and a resumed run's first pass ask.

A batch is ``(inputs, targets)``, the model called as ``model(inputs)``; or a mapping of keyword
arguments, the model called as ``model(**batch)`` (what Hugging Face's collators yield), with
``labels`` in it when the model is to compute its own loss.

What the model returns may be a tensor (the logits, or the prediction for float targets), an
output with ``.loss`` (used when the batch carries labels), an output with ``.logits``, or a tuple
whose first item is the logits (with labels, the loss: Hugging Face's ``return_dict=False``).

The loss is, in this order: the workload's own ``loss(outputs, batch)`` when it gives one; the
model's own when the batch carries labels; else cross-entropy for integer targets and mean
squared error for float ones, of the logits against the targets.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

LABELS = "labels"  # Hugging Face's key: a model given it computes its own loss
Loss = Callable[[Any, Any], torch.Tensor]  # the workload's own: loss(outputs, batch)

OUTPUTS = ("a floating-point tensor, an output with .logits (or .loss, when the batch carries "
           "labels), or a tuple whose first item is the logits")
BATCHES = ("an (inputs, targets) pair of tensors, or a dict of keyword arguments for the model "
           "(with 'labels' for the model's own loss)")


def is_keywords(batch) -> bool:
    return isinstance(batch, Mapping)


def has_labels(batch) -> bool:
    return is_keywords(batch) and batch.get(LABELS) is not None


def batch_error(batch) -> str | None:
    """Why ``batch`` is neither kind of batch, or None."""
    if is_keywords(batch):
        if not batch or not all(isinstance(k, str) for k in batch):
            return f"a dict batch must map argument names to values, got keys {list(batch)[:5]}"
        if not any(isinstance(v, torch.Tensor) for v in batch.values()):
            return "a dict batch holds no tensor"
        return None
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch):
        return None
    got = type(batch).__name__ + (f" of {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    return f"a batch must be {BATCHES}; got {got}"


def to_device(batch, device: torch.device | str):
    if is_keywords(batch):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return tuple(t.to(device) for t in batch)


def call(model: Callable, batch):
    """The model's output on ``batch``: ``model(**batch)`` or ``model(inputs)``."""
    return model(**batch) if is_keywords(batch) else model(batch[0])


def targets(batch) -> torch.Tensor | None:
    """What the outputs are compared with: the targets, or a dict batch's labels (None without)."""
    return batch.get(LABELS) if is_keywords(batch) else batch[1]


def _field(output, name: str):
    """``output.name`` or ``output[name]`` (Hugging Face's outputs are both), None when absent."""
    value = output.get(name) if isinstance(output, Mapping) else getattr(output, name, None)
    return value if isinstance(value, torch.Tensor) else None


def logits(output) -> torch.Tensor | None:
    """The logits (or prediction) in ``output``, None when it holds none the lab can find."""
    if isinstance(output, torch.Tensor):
        return output
    found = _field(output, "logits")
    if found is None and isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        found = output[0]
    return found


def own_loss(output) -> torch.Tensor | None:
    """The loss a model computed itself: ``.loss``, or a tuple's first item when it is a scalar
    (a model given labels with ``return_dict=False`` puts it first)."""
    found = _field(output, "loss")
    if found is None and isinstance(output, (tuple, list)) and output and _scalar(output[0]):
        found = output[0]
    return found


def _scalar(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() == 0


def describe(output) -> str:
    """An output's type, and its fields when it has any: what a person recognises in a message."""
    name = type(output).__name__
    if isinstance(output, Mapping):
        return f"{name} with fields {', '.join(map(str, output.keys())) or 'none'}"
    if isinstance(output, (tuple, list)):
        return f"{name} of {len(output)} ({', '.join(type(o).__name__ for o in output[:4])})"
    return name


def loss_source(batch, custom: Loss | None) -> str:
    """Which loss trains on batches like ``batch``, said for a person (meta.json, ``commlab run``)."""
    if custom is not None:
        return "the workload's own loss(outputs, batch)"
    if has_labels(batch):
        return "the model's own (outputs.loss: the batch carries labels)"
    y = targets(batch)
    if y is not None and y.is_floating_point():
        return "mean squared error (float targets)"
    return "cross-entropy (integer targets)"


def lab_loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if targets.is_floating_point():
        return F.mse_loss(output, targets)
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))


def compute_loss(output, batch, custom: Loss | None = None) -> torch.Tensor:
    """The training loss of ``output`` on ``batch`` (see the module's docstring for the order);
    ValueError says why there is none (``loss_error`` says it before anything starts)."""
    if custom is not None:
        return custom(output, batch)
    if has_labels(batch):
        found = own_loss(output)
        if found is None:
            raise ValueError(_no_own_loss(output))
        return found
    if is_keywords(batch):
        raise ValueError(NO_TARGETS)
    found = logits(output)
    if found is None:
        raise ValueError(f"the model must return {OUTPUTS}; got {describe(output)}")
    return lab_loss(found, batch[1])


def forward_loss(model: Callable, batch, custom: Loss | None = None):
    """(loss, output) of one forward pass on ``batch``."""
    output = call(model, batch)
    return compute_loss(output, batch, custom), output


NO_TARGETS = ("a dict batch without 'labels' leaves nothing to compare the outputs with: put the "
              "targets under 'labels' (the model computes its own loss) or give the workload a "
              "loss(outputs, batch)")


def _no_own_loss(output) -> str:
    return (f"the batch carries labels, so the model's own loss is used, but its output has no "
            f".loss (nor a scalar first item): got {describe(output)}")


def loss_error(output, batch, custom: Loss | None = None, need_grad: bool = True) -> str | None:
    """Why no loss can be made of ``output`` on ``batch`` (it would fail, or compare the wrong
    things silently), or None.  With ``need_grad`` (an output computed with gradients on, as in
    training) the loss must also reach the model's parameters."""
    if custom is not None:
        try:
            value = custom(output, batch)
        except Exception as e:  # the person's code may raise anything
            return f"loss(outputs, batch) raised {type(e).__name__}: {e}"
        return _scalar_error(value, "loss(outputs, batch)", need_grad)
    if has_labels(batch):
        found = own_loss(output)
        return (_no_own_loss(output) if found is None
                else _scalar_error(found, "the model's own loss", need_grad))
    if is_keywords(batch):
        return NO_TARGETS
    found = logits(output)
    if found is None or not found.is_floating_point():
        return f"the model must return {OUTPUTS}; got {describe(output)}"
    return shape_error(found, batch[1])


def _scalar_error(value, what: str, need_grad: bool) -> str | None:
    if not _scalar(value):
        got = (f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
               if isinstance(value, torch.Tensor) else type(value).__name__)
        return f"{what} must be a floating-point scalar tensor (backward starts from it), got {got}"
    if need_grad and not value.requires_grad:
        return f"{what} does not depend on the model's parameters: backward would have nothing to do"
    return None


def shape_error(output: torch.Tensor, targets: torch.Tensor) -> str | None:
    """Why ``lab_loss`` cannot compare these two exactly (it would fail, or broadcast silently)."""
    if targets.is_floating_point():
        if output.shape != targets.shape:
            return (f"float targets of shape {tuple(targets.shape)} against outputs of shape "
                    f"{tuple(output.shape)}: mean squared error needs equal shapes (it would "
                    "broadcast them and train on the wrong thing)")
        return None
    classes = output.shape[-1] if output.dim() else 0
    if output.dim() < 2 or output.numel() // max(classes, 1) != targets.numel():
        return (f"integer targets of shape {tuple(targets.shape)} against outputs of shape "
                f"{tuple(output.shape)}: cross-entropy needs outputs (..., classes) with one "
                "target per row")
    if targets.numel() and not 0 <= int(targets.min()) <= int(targets.max()) < classes:
        return (f"integer targets must be class indices 0..{classes - 1} (the outputs' last "
                f"dimension), got {int(targets.min())}..{int(targets.max())}")
    return None


def weight(batch) -> int:
    """How much a batch's mean loss counts in a held-out mean: its targets' elements (a dict
    batch's labels), else its first tensor's rows."""
    y = targets(batch)
    if y is not None:
        return y.numel()
    first = next(v for v in batch.values() if isinstance(v, torch.Tensor))
    return first.shape[0] if first.dim() else 1


def correct(output, batch) -> int | None:
    """How many targets the logits' argmax hits, for ``(inputs, integer targets)`` batches; None
    where accuracy is not defined here (float targets, dict batches: a language model's labels
    are shifted inside the model)."""
    if is_keywords(batch) or batch[1].is_floating_point():
        return None
    found = logits(output)
    if found is None:
        return None
    return int((found.reshape(-1, found.shape[-1]).argmax(-1) == batch[1].reshape(-1)).sum())
