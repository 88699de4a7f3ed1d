"""Built-in workloads (no downloads) and the loader for a user's ``module:function``.

The contract for a user's workload: a function callable with no required arguments that returns
``(model, batches)``, where ``model`` is a ``torch.nn.Module`` and ``batches`` is a callable
returning an iterator of batches for this rank: ``(inputs, targets)``, or a dict of keyword
arguments for the model (``model(**batch)``; with ``labels`` in it the model's own loss trains).
Integer targets train with cross-entropy, float targets with mean squared error, of the model's
logits; the outputs the ecosystem returns (a tensor, ``.loss``, ``.logits``, a tuple) are read by
``commlab.model_io``.  If the function accepts any of the keyword arguments ``rank``,
``world_size``, ``batch_size`` or ``seed``, the lab passes them.

Held-out data (optional): return ``(model, batches, eval_batches)``, where ``eval_batches`` is a
callable returning a finite iterable of batches (of the same kinds) that no rank trains on.  Rank 0
draws it once (at most ``MAX_EVAL_BATCHES`` batches) and evaluates the model on all of it every
``eval_every`` steps and after the last: the loss, and the accuracy for integer targets.  A
workload without it trains as before, with no held-out evaluation.  A resumed run draws and
discards the batches the first run trained on (``batches`` must give the same stream again).

Sharded runs (``sharding`` fsdp or hsdp) call FSDP2's ``fully_shard`` on each of the model's
units (``shard_units``: every direct child module that holds parameters, the items of a
``ModuleList`` or ``ModuleDict`` one by one), then on the model.  A model may name its own units:
a method ``fsdp_units()`` returning the modules to shard one by one (a transformer's blocks).

A loss of its own (optional), for a model whose loss is neither of the lab's: return a dict by
name, ``{"model": ..., "batches": ..., "eval_batches": ..., "loss": ...}`` (only the first two
required), where ``loss(outputs, batch)`` returns the scalar tensor backward starts from.

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

from commlab import model_io
from commlab.seeds import stream_seed
from commlab.workload_names import BUILTIN_NAMES

CONTRACT = ("a workload function must return (model, batches): model a torch.nn.Module, batches a "
            "callable that yields batches for this rank, (inputs, targets) tensors (integer "
            "targets: cross-entropy; float targets: mean squared error) or a dict of keyword "
            "arguments for the model (with 'labels': the model's own loss); optionally a third "
            "item, eval_batches, a callable that yields the held-out batches; or a dict of those "
            "by name, which may add loss, a callable loss(outputs, batch) -> scalar tensor")
# The names a workload's dict may hold (see the module's docstring); the first two are required.
PARTS = ("model", "batches", "eval_batches", "loss")
MAX_EVAL_BATCHES = 1000  # a held-out set is drawn once and kept: an endless one is cut here
# The data stream of held-out samples of the generated workloads: training draws stream ``rank``
# (``stream_seed``), below the 64 ranks a run may have, so no rank ever draws this one.
EVAL_STREAM = 999
EVAL_METRICS = ("accuracy", "bits_per_char")  # reported beside the held-out loss

# A batch is (inputs, targets) or a dict of keyword arguments (``commlab.model_io``).
Batches = Callable[[], Iterable]


@dataclass
class Workload:
    model: nn.Module
    batches: Callable[[], Iterator]
    eval_batches: Batches | None = None  # the held-out set; None: the run evaluates nothing
    # What is reported beside the held-out loss (one of EVAL_METRICS); None: the accuracy for
    # integer targets, nothing for float ones.
    eval_metric: str | None = None
    loss: model_io.Loss | None = None  # the workload's own loss(outputs, batch); None: the lab's

    def loss_of(self, model, batch) -> torch.Tensor:
        """The training loss of ``model`` (the DDP wrapper in a run) on one batch."""
        return model_io.forward_loss(model, batch, self.loss)[0]


def shard_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules a sharded run shards one by one (``fully_shard`` on each, then on the root), by
    name: the model's own ``fsdp_units()`` when it declares one (its override of the rule), else
    every direct child module that holds parameters, a ``ModuleList``'s or ``ModuleDict``'s items
    one by one (a container is never called, so FSDP would never gather it).  Empty: the model has
    no layer to shard."""
    names = {id(m): n for n, m in model.named_modules()}
    declared = getattr(model, "fsdp_units", None)
    if callable(declared):
        return [(names.get(id(m), "?"), m) for m in declared()]

    def units(name: str, module: nn.Module) -> list[tuple[str, nn.Module]]:
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            return [u for n, child in module.named_children() for u in units(f"{name}.{n}", child)]
        return [(name, module)] if any(True for _ in module.parameters()) else []

    return [u for n, child in model.named_children() for u in units(n, child)]


def held_out(work: Workload) -> list | None:
    """The workload's held-out batches, drawn once (at most MAX_EVAL_BATCHES); None without any."""
    if work.eval_batches is None:
        return None
    batches = list(itertools.islice(work.eval_batches(), MAX_EVAL_BATCHES))
    if not batches:
        raise ValueError("eval_batches() yielded nothing: a held-out set needs at least one batch")
    return batches


def evaluate(model: nn.Module, batches: list, metric: str | None = None,
             device: torch.device | str = "cpu", loss: model_io.Loss | None = None) -> dict:
    """The model's loss on the held-out ``batches`` (each batch's loss weighted by its targets'
    elements, ``model_io.weight``: the mean over every target, as the loss takes it over a
    batch) and ``metric``: the accuracy (default for integer targets, where the outputs give
    logits), or the bits per character (the loss in bits).  ``loss`` is the workload's own, as in
    training.  The model is left in the mode it was in."""
    was_training = model.training
    model.eval()
    total = count = 0
    hits: int | None = 0
    try:
        with torch.no_grad():
            for batch in batches:
                batch = model_io.to_device(batch, device)
                value, out = model_io.forward_loss(model, batch, loss)
                weight = model_io.weight(batch)
                total += float(value) * weight
                count += weight
                hit = model_io.correct(out, batch)
                hits = None if hit is None or hits is None else hits + hit
    finally:
        model.train(was_training)
    loss_value = total / count
    metric = metric or ("accuracy" if hits is not None else None)
    if metric == "accuracy" and hits is not None:
        return {"loss": loss_value, "accuracy": hits / count}
    if metric == "bits_per_char":
        return {"loss": loss_value, "bits_per_char": loss_value / math.log(2)}
    return {"loss": loss_value}


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
    if isinstance(out, dict):
        return _by_name(spec, out)
    if not (isinstance(out, tuple) and len(out) in (2, 3) and isinstance(out[0], nn.Module)
            and callable(out[1]) and (len(out) == 2 or out[2] is None or callable(out[2]))):
        raise ValueError(f"workload {spec!r} returned {type(out).__name__}; {CONTRACT}")
    return Workload(*out)


def _by_name(spec: str, parts: dict) -> Workload:
    """A workload returned as a dict (``PARTS``): unknown names are refused, not ignored, so that
    a misspelt ``loss`` does not train silently with the lab's."""
    unknown = [k for k in parts if k not in PARTS]
    if unknown:
        raise ValueError(f"workload {spec!r} returned a dict with {', '.join(map(repr, unknown))}: "
                         f"it may hold {', '.join(PARTS)} (model and batches required)")
    if not isinstance(parts.get("model"), nn.Module):
        got = type(parts.get("model")).__name__ if "model" in parts else "nothing"
        raise ValueError(f"workload {spec!r} returned a dict whose 'model' is {got}, not a "
                         f"torch.nn.Module; {CONTRACT}")
    for name in PARTS[1:]:
        if not callable(parts.get(name)) and (name == "batches" or parts.get(name) is not None):
            raise ValueError(f"workload {spec!r}: {name!r} must be callable, got "
                             f"{type(parts.get(name)).__name__}; {CONTRACT}")
    return Workload(parts["model"], parts["batches"], parts.get("eval_batches"),
                    loss=parts.get("loss"))


# How long the check draws batches to see that there are enough for the run: a real loader may
# be slow, and the check answers a form.
DRAW_FOR_S = 10.0


def check(spec: str, *, rank: int = 0, world_size: int = 1, batch_size: int | None = None,
          seed: int = 0, steps: int = 1, sharded: bool = False) -> str | None:
    """Why this workload cannot train, or None: it is loaded as rank ``rank`` is, and must have
    parameters, batches the model takes and a loss can be made of (``model_io.loss_error``), and
    at least ``steps`` of them (counted for ``DRAW_FOR_S`` seconds at most); ``sharded``: a layer
    to shard (``shard_units``).  Runs the user's code: call it in a process of its own."""
    try:
        w = load(spec, rank, world_size, batch_size, seed)
    except ValueError as e:
        return str(e)
    if not any(p.requires_grad for p in w.model.parameters()):
        return (f"workload {spec!r}: the model has no parameter that requires a gradient: DDP "
                "has nothing to average")
    if sharded and not shard_units(w.model):
        return (f"workload {spec!r}: the model has no layer to shard: no direct child module holds "
                "parameters (its parameters are all its own); wrap them in a layer, or declare "
                "fsdp_units() returning the modules to shard one by one")
    error, batches = _first_batch_error(spec, w, w.batches, "batches()", "a batch")
    return error or _held_out_error(spec, w) or _too_few(spec, batches, steps)


def _first_batch_error(spec: str, w: Workload, make, source: str, what: str, prefix: str = ""):
    """Why the first batch of ``make()``'s iterator cannot train or be evaluated (a kind of batch
    ``model_io`` knows, that the model takes and a loss can be made of), or None; and the
    iterator, to draw on.  A training batch runs with gradients on, as in training: its loss must
    reach the parameters."""
    batches = iter(())
    try:
        batches = iter(make())
        batch = next(batches)
    except StopIteration:
        return f"workload {spec!r}: {source} yielded nothing; {CONTRACT}", batches
    except Exception as e:
        return f"workload {spec!r}: drawing {what} raised {type(e).__name__}: {e}", batches
    msg = model_io.batch_error(batch)
    if msg:
        return f"workload {spec!r}: {prefix}{msg}; {CONTRACT}", batches
    training = not prefix
    called = " (called as model(**batch))" if model_io.is_keywords(batch) else "'s inputs"
    with torch.set_grad_enabled(training):
        try:
            output = model_io.call(w.model, batch)
        except Exception as e:
            return (f"workload {spec!r}: the model raised {type(e).__name__} on {what}{called}: "
                    f"{e}"), batches
        msg = model_io.loss_error(output, batch, w.loss, need_grad=training)
    return (f"workload {spec!r}: {prefix}{msg}" if msg else None), batches


def _held_out_error(spec: str, w: Workload) -> str | None:
    """Why the workload's held-out set (if it has one) cannot be evaluated: its first batch."""
    if w.eval_batches is None:
        return None
    return _first_batch_error(spec, w, w.eval_batches, "eval_batches()", "a held-out batch",
                              prefix="held-out batch: ")[0]


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
