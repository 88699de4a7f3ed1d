"""Built-in workloads (no downloads) and the loader for a user's ``module:function``.

The contract for a user's workload: a function callable with no required arguments that returns
``(model, batches)``, where ``model`` is a ``torch.nn.Module`` and ``batches`` is a callable
returning an iterator of ``(inputs, targets)`` for this rank.  Integer targets train with
cross-entropy, float targets with mean squared error.  If the function accepts any of the keyword
arguments ``rank``, ``world_size``, ``batch_size`` or ``seed``, the lab passes them.

Held-out data (optional): return ``(model, batches, eval_batches)``, where ``eval_batches`` is a
callable returning a finite iterable of ``(inputs, targets)`` that no rank trains on.  Rank 0
draws it once (at most ``MAX_EVAL_BATCHES`` batches) and evaluates the model on all of it every
``eval_every`` steps and after the last: the loss, and the accuracy for integer targets.  A
workload without it trains as before, with no held-out evaluation.  A resumed run draws and
discards the batches the first run trained on (``batches`` must give the same stream again).

The built-in workloads' held-out sets are fixed and disjoint from training: ``charlm`` evaluates
on other standard-library files than it trains on (loss and bits per character), ``mlp``,
``cnn`` and ``wide`` on samples from the same generator drawn from a stream no rank trains on.
"""
from __future__ import annotations

import importlib
import inspect
import itertools
import math
import os
import sys
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from commlab.seeds import stream_seed
from commlab.workload_names import BUILTIN_NAMES, DESCRIPTIONS, spec_error  # noqa: F401 (re-exported)

CONTRACT = ("a workload function must return (model, batches): model a torch.nn.Module, batches a "
            "callable that yields (inputs, targets) tensors for this rank (integer targets: "
            "cross-entropy; float targets: mean squared error); optionally a third item, "
            "eval_batches, a callable that yields the held-out (inputs, targets)")
MAX_EVAL_BATCHES = 1000  # a held-out set is drawn once and kept: an endless one is cut here
# The data stream of held-out samples of the generated workloads: training draws stream ``rank``
# (``stream_seed``), below the 64 ranks a run may have, so no rank ever draws this one.
EVAL_STREAM = 999
EVAL_METRICS = ("accuracy", "bits_per_char")  # reported beside the held-out loss

Batches = Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]]


@dataclass
class Workload:
    model: nn.Module
    batches: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]
    eval_batches: Batches | None = None  # the held-out set; None: the run evaluates nothing
    # What is reported beside the held-out loss (one of EVAL_METRICS); None: the accuracy for
    # integer targets, nothing for float ones.
    eval_metric: str | None = None


def loss_fn(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if targets.is_floating_point():
        return F.mse_loss(output, targets)
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))


def held_out(work: Workload) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """The workload's held-out batches, drawn once (at most MAX_EVAL_BATCHES); None without any."""
    if work.eval_batches is None:
        return None
    batches = list(itertools.islice(work.eval_batches(), MAX_EVAL_BATCHES))
    if not batches:
        raise ValueError("eval_batches() yielded nothing: a held-out set needs at least one batch")
    return batches


def evaluate(model: nn.Module, batches: list, metric: str | None = None,
             device: torch.device | str = "cpu") -> dict:
    """The model's loss on the held-out ``batches`` (the mean over every target, as ``loss_fn``
    takes it over a batch) and ``metric``: the accuracy (default for integer targets), or the
    bits per character (the loss in bits).  The model is left in the mode it was in."""
    was_training = model.training
    model.eval()
    total = correct = count = 0
    try:
        with torch.no_grad():
            for x, y in batches:
                x, y = x.to(device), y.to(device)
                out = model(x)
                total += float(loss_fn(out, y)) * y.numel()
                count += y.numel()
                if not y.is_floating_point():
                    correct += int((out.reshape(-1, out.shape[-1]).argmax(-1) == y.reshape(-1)).sum())
    finally:
        model.train(was_training)
    loss = total / count
    integer = not batches[0][1].is_floating_point()
    metric = metric or ("accuracy" if integer else None)
    if metric == "accuracy":
        return {"loss": loss, "accuracy": correct / count}
    if metric == "bits_per_char":
        return {"loss": loss, "bits_per_char": loss / math.log(2)}
    return {"loss": loss}


# ---------------------------------------------------------------------------- charlm
class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.fc_out = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x))))


class CharLM(nn.Module):
    """A small GPT; sized up on the meta device it gives the shapes of real language models."""

    def __init__(self, vocab: int = 256, block_size: int = 64, n_layer: int = 2, n_head: int = 4,
                 n_embd: int = 128):
        super().__init__()
        self.block_size = block_size
        self.tok = nn.Embedding(vocab, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


TRAIN_BYTES = 1 << 20
EVAL_BYTES = 1 << 16  # of held-out text, from the files after the training ones
EVAL_SEQUENCES = 128  # held-out windows of block_size + 1 characters: about 8k characters


def stdlib_files(max_bytes: int = TRAIN_BYTES) -> tuple[list[Path], list[Path]]:
    """The standard library's top-level modules in a fixed order, split into those the training
    text reads (its first ``max_bytes``) and the rest, which it never reads."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    size = 0
    for i, path in enumerate(files):
        size += path.stat().st_size
        if size >= max_bytes:
            return files[:i + 1], files[i + 1:]
    return files, []


def _read(files: list[Path], max_bytes: int) -> bytes:
    out = bytearray()
    for path in files:
        out += path.read_bytes()
        if len(out) >= max_bytes:
            break
    return bytes(out[:max_bytes])


def stdlib_text(max_bytes: int = TRAIN_BYTES) -> bytes:
    """Source text that ships with every Python: its standard library, read in a fixed order."""
    return _read(stdlib_files(max_bytes)[0], max_bytes)


def stdlib_held_out_text(max_bytes: int = EVAL_BYTES) -> bytes:
    """Held-out text: the standard-library files after the ones ``stdlib_text`` reads."""
    rest = stdlib_files()[1]
    if not rest:
        raise ValueError("this Python's standard library is too small to hold out text")
    return _read(rest, max_bytes)


def charlm(rank: int = 0, world_size: int = 1, batch_size: int = 16, seed: int = 0,
           block_size: int = 64) -> Workload:
    data = torch.frombuffer(bytearray(stdlib_text()), dtype=torch.uint8).long()
    model = CharLM(block_size=block_size)

    def batches():
        g = torch.Generator().manual_seed(stream_seed(seed, rank))
        while True:
            ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=g)
            x = torch.stack([data[i:i + block_size] for i in ix])
            y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
            yield x, y

    def eval_batches():
        held = torch.frombuffer(bytearray(stdlib_held_out_text()), dtype=torch.uint8).long()
        starts = torch.linspace(0, len(held) - block_size - 1, EVAL_SEQUENCES).long()
        x = torch.stack([held[i:i + block_size] for i in starts])
        y = torch.stack([held[i + 1:i + 1 + block_size] for i in starts])
        return zip(x.split(64), y.split(64))

    return Workload(model, batches, eval_batches, "bits_per_char")


# ---------------------------------------------------------------------------- mlp
def mlp_model(d_in: int = 64, classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, classes))


def mlp(rank: int = 0, world_size: int = 1, batch_size: int = 64, seed: int = 0) -> Workload:
    d_in, classes = 64, 10
    teacher = torch.randn(d_in, classes, generator=torch.Generator().manual_seed(seed))
    model = mlp_model(d_in, classes)

    def batches():
        g = torch.Generator().manual_seed(stream_seed(seed, rank))
        while True:
            x = torch.randn(batch_size, d_in, generator=g)
            yield x, (x @ teacher).argmax(dim=1)

    def eval_batches():
        x = torch.randn(2048, d_in, generator=torch.Generator().manual_seed(stream_seed(seed, EVAL_STREAM)))
        return zip(x.split(512), (x @ teacher).argmax(dim=1).split(512))

    return Workload(model, batches, eval_batches, "accuracy")


# ---------------------------------------------------------------------------- cnn
def shape_images(n: int, g: torch.Generator, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy pictures of four shapes: horizontal bar, vertical bar, square outline, disc."""
    labels = torch.randint(4, (n,), generator=g)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    imgs = 0.3 * torch.randn(n, 1, size, size, generator=g)
    centers = torch.randint(4, size - 4, (n, 2), generator=g)
    for i in range(n):
        cy, cx = centers[i].tolist()
        kind = int(labels[i])
        if kind == 0:
            mask = (yy - cy).abs() <= 1
        elif kind == 1:
            mask = (xx - cx).abs() <= 1
        elif kind == 2:
            mask = torch.maximum((yy - cy).abs(), (xx - cx).abs()) == 3
        else:
            mask = (yy - cy) ** 2 + (xx - cx) ** 2 <= 9
        imgs[i, 0][mask] += 1.0
    return imgs, labels


def cnn_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 4))


def cnn(rank: int = 0, world_size: int = 1, batch_size: int = 32, seed: int = 0) -> Workload:
    model = cnn_model()

    def batches():
        g = torch.Generator().manual_seed(stream_seed(seed, rank))
        while True:
            yield shape_images(batch_size, g)

    def eval_batches():
        x, y = shape_images(512, torch.Generator().manual_seed(stream_seed(seed, EVAL_STREAM)))
        return zip(x.split(128), y.split(128))

    return Workload(model, batches, eval_batches, "accuracy")


# ---------------------------------------------------------------------------- wide
def wide_model(width: int = 1024, depth: int = 4) -> nn.Module:
    return nn.Sequential(*itertools.chain.from_iterable(
        (nn.Linear(width, width), nn.Tanh()) for _ in range(depth)))[:-1]


def wide(rank: int = 0, world_size: int = 1, batch_size: int = 8, seed: int = 0,
         width: int = 1024, depth: int = 4) -> Workload:
    """Large square weight matrices and a small batch: communication dominates the step."""
    teacher = torch.randn(width, width, generator=torch.Generator().manual_seed(seed)) / math.sqrt(width)
    model = wide_model(width, depth)

    def batches():
        g = torch.Generator().manual_seed(stream_seed(seed, rank))
        while True:
            x = torch.randn(batch_size, width, generator=g)
            yield x, torch.tanh(x @ teacher)

    def eval_batches():
        x = torch.randn(256, width, generator=torch.Generator().manual_seed(stream_seed(seed, EVAL_STREAM)))
        return zip(x.split(64), torch.tanh(x @ teacher).split(64))

    return Workload(model, batches, eval_batches)


MODELS = {"charlm": CharLM, "mlp": mlp_model, "cnn": cnn_model, "wide": wide_model}
BUILTIN = {"charlm": charlm, "mlp": mlp, "cnn": cnn, "wide": wide}
assert tuple(BUILTIN) == BUILTIN_NAMES  # named, and described, in commlab.workload_names


# ---------------------------------------------------------------------------- loading
def resolve(spec: str) -> Callable[..., object]:
    """The workload function for a built-in name or ``module:function``; raises ValueError."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    if ":" not in spec:
        raise ValueError(f"unknown workload {spec!r}; use a built-in ({', '.join(BUILTIN)}) or "
                         "module:function for your own")
    module_name, _, fn_name = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a user's module usually sits where they started the lab
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the user's module may raise anything while importing
        raise ValueError(f"module {module_name!r} does not import: {type(e).__name__}: {e}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ValueError(f"module {module_name!r} has no function {fn_name!r}; {CONTRACT}")
    return fn


def load(spec: str, rank: int = 0, world_size: int = 1, batch_size: int | None = None,
         seed: int = 0) -> Workload:
    fn = resolve(spec)
    offered = {"rank": rank, "world_size": world_size, "batch_size": batch_size, "seed": seed}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins may have no signature: offer them nothing
        params = {}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in offered.items() if v is not None and (takes_any or k in params)}
    try:
        out = fn(**kwargs)
    except Exception as e:
        raise ValueError(f"workload {spec!r} raised {type(e).__name__}: {e}") from None
    if isinstance(out, Workload):
        return out
    if not (isinstance(out, tuple) and len(out) in (2, 3) and isinstance(out[0], nn.Module)
            and callable(out[1]) and (len(out) == 2 or out[2] is None or callable(out[2]))):
        raise ValueError(f"workload {spec!r} returned {type(out).__name__}; {CONTRACT}")
    return Workload(*out)


# How long the check draws batches to see that there are enough for the run: a real loader may
# be slow, and the check answers a form.
DRAW_FOR_S = 10.0


def check(spec: str, *, rank: int = 0, world_size: int = 1, batch_size: int | None = None,
          seed: int = 0, steps: int = 1) -> str | None:
    """Why this workload cannot train, or None: it is loaded as rank ``rank`` is, and must have
    parameters, batches of (inputs, targets) tensors whose shapes fit the loss, and at least
    ``steps`` of them (counted for ``DRAW_FOR_S`` seconds at most).  Runs the user's code: call
    it in a process of its own."""
    try:
        w = load(spec, rank, world_size, batch_size, seed)
    except ValueError as e:
        return str(e)
    if not any(p.requires_grad for p in w.model.parameters()):
        return (f"workload {spec!r}: the model has no parameter that requires a gradient: DDP "
                "has nothing to average")
    error, batches = _first_batch_error(spec, w.model, w.batches, "batches()", "a batch")
    return error or _held_out_error(spec, w) or _too_few(spec, batches, steps)


def _first_batch_error(spec: str, model, make, source: str, what: str, prefix: str = ""):
    """Why the first batch of ``make()``'s iterator cannot train or be evaluated (it must be an
    (inputs, targets) pair of tensors the model takes and the loss can compare), or None; and the
    iterator, to draw on."""
    batches = iter(())
    try:
        batches = iter(make())
        batch = next(batches)
    except StopIteration:
        return f"workload {spec!r}: {source} yielded nothing; {CONTRACT}", batches
    except Exception as e:
        return f"workload {spec!r}: drawing {what} raised {type(e).__name__}: {e}", batches
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2
            and all(isinstance(t, torch.Tensor) for t in batch)):
        return (f"workload {spec!r}: {what} must be an (inputs, targets) pair of tensors; "
                f"{CONTRACT}"), batches
    try:
        with torch.no_grad():
            output = model(batch[0])
    except Exception as e:
        return (f"workload {spec!r}: the model raised {type(e).__name__} on {what}'s inputs: "
                f"{e}"), batches
    msg = loss_mismatch(output, batch[1])
    return (f"workload {spec!r}: {prefix}{msg}" if msg else None), batches


def _held_out_error(spec: str, w: Workload) -> str | None:
    """Why the workload's held-out set (if it has one) cannot be evaluated: its first batch."""
    if w.eval_batches is None:
        return None
    return _first_batch_error(spec, w.model, w.eval_batches, "eval_batches()", "a held-out batch",
                              prefix="held-out batch: ")[0]


def loss_mismatch(output: object, targets: torch.Tensor) -> str | None:
    """Why ``loss_fn`` cannot compare these two exactly (it would fail, or broadcast silently)."""
    if not isinstance(output, torch.Tensor) or not output.is_floating_point():
        return f"the model must return a floating-point tensor, got {type(output).__name__}"
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


def _too_few(spec: str, batches: Iterator, steps: int) -> str | None:
    """Why ``batches`` (one drawn already) cannot feed ``steps`` steps, or None; it draws in a
    daemon thread for ``DRAW_FOR_S`` at most, so a loader that blocks (or just takes long) is
    given the benefit of the doubt instead of hanging the check."""
    import threading

    found: list[str | None] = []

    def count() -> None:
        drawn = 1
        try:
            while drawn < steps:
                next(batches)
                drawn += 1
        except StopIteration:
            found.append(f"workload {spec!r}: batches() ended after {drawn} batch(es), the run "
                         f"takes {steps} steps: yield at least steps batches (or loop forever)")
        except Exception as e:
            found.append(f"workload {spec!r}: drawing batch {drawn + 1} raised "
                         f"{type(e).__name__}: {e}")
        else:
            found.append(None)

    drawing = threading.Thread(target=count, daemon=True)
    drawing.start()
    drawing.join(DRAW_FOR_S)
    return found[0] if found else None
