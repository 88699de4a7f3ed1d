"""Which hook runs: PyTorch's stock hook wherever it works on the backend, commlab's variant elsewhere.

A configuration names a hook and optionally a compress wrapper around it.  Each of the two pieces
is chosen on its own:

- ``impl="auto"``: PyTorch's piece where it works on the backend, commlab's where it does not;
- ``impl="stock"``: PyTorch's pieces, failing the way they fail (``stock_warning`` says how);
- ``impl="commlab"``: commlab's piece wherever commlab has one.  commlab has variants only of the
  pieces that fail somewhere (PowerSGD, batched PowerSGD, the bf16 hook and wrapper): PyTorch's
  allreduce, fp16 and noop hooks and the fp16 wrapper issue their only collective from the hook body
  or none at all, so they are already safe and are used as they are.

``HookChoice.impl`` is "commlab" when any piece is commlab's.  What fails where was measured on
torch 2.13 (README, "Which hook actually runs"); tests/test_hooks.py re-checks the bf16 and batched causes.  ``plan``,
``stock_warning`` and ``support_table`` are pure and import no torch, for the CLI and the UI.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from commlab.config import HOOKS, POWERSGD_HOOKS, RESOLVED_BACKENDS, WRAPPERS, RunConfig

BACKENDS = RESOLVED_BACKENDS  # a plan is made for the backend a run resolved "auto" to
ONE_BUCKET_ONLY = "one bucket only"

_TORCH = "torch.distributed.algorithms.ddp_comm_hooks"
# hook -> (PyTorch's module, its function, commlab's module or None)
_HOOKS = {
    "allreduce": (f"{_TORCH}.default_hooks", "allreduce_hook", None),
    "fp16": (f"{_TORCH}.default_hooks", "fp16_compress_hook", None),
    "bf16": (f"{_TORCH}.default_hooks", "bf16_compress_hook", f"{__package__}.compress"),
    "powersgd": (f"{_TORCH}.powerSGD_hook", "powerSGD_hook", f"{__package__}.powersgd"),
    "batched_powersgd": (f"{_TORCH}.powerSGD_hook", "batched_powerSGD_hook", f"{__package__}.powersgd"),
    "noop": (f"{_TORCH}.debugging_hooks", "noop_hook", None),
}
_WRAPPERS = {
    "fp16": (f"{_TORCH}.default_hooks", "fp16_compress_wrapper", None),
    "bf16": (f"{_TORCH}.default_hooks", "bf16_compress_wrapper", f"{__package__}.compress"),
}

_BF16_REFUSED = ("DDP refuses PyTorch's {name} without CUDA 11+ and NCCL 2.10+ (TypeError at "
                 "register_comm_hook), though Gloo reduces bfloat16")
_POWERSGD_GLOO = ("PyTorch's powerSGD_hook allreduces from inside future callbacks, which on Gloo "
                  "deadlocks or mismatches collectives across ranks with two or more buckets")
_BATCHED_BROKEN = ("PyTorch's batched_powerSGD_hook fails in _orthogonalize once compression starts "
                   "(AssertionError: it passes a 2-D matrix where torch 2.13 expects a 3-D batch)")
# (piece, key) -> backend -> why PyTorch's piece fails there
_STOCK_FAILS = {
    ("hook", "bf16"): {"gloo": _BF16_REFUSED.format(name="bf16_compress_hook")},
    ("hook", "powersgd"): {"gloo": _POWERSGD_GLOO},
    ("hook", "batched_powersgd"): {"gloo": _BATCHED_BROKEN, "nccl": _BATCHED_BROKEN},
    ("wrapper", "bf16"): {"gloo": _BF16_REFUSED.format(name="bf16_compress_wrapper")},
}
# Failures that a single bucket avoids: with one bucket only one callback chain is ever waiting.
_ONE_BUCKET_FAILS = {("hook", "powersgd", "gloo")}


@dataclass
class HookChoice:
    state: object  # what to pass to ddp.register_comm_hook
    hook: Callable  # the hook
    impl: str  # "stock" (PyTorch's) or "commlab"
    name: str  # readable, e.g. "fp16_compress_wrapper(powerSGD_hook)"
    reason: str  # why this implementation was chosen, one sentence


def hook_name(hook: str, wrapper: str = "none") -> str:
    """PyTorch's spelling of a hook, wrapped: ``bf16_compress_wrapper(powerSGD_hook)``."""
    name = _HOOKS[hook][1]
    return name if wrapper == "none" else f"{_WRAPPERS[wrapper][1]}({name})"


def _pieces(hook: str, wrapper: str) -> list[tuple[str, str]]:
    return [("hook", hook)] + ([("wrapper", wrapper)] if wrapper != "none" else [])


def _has_variant(piece: tuple[str, str]) -> bool:
    kind, key = piece
    return (_HOOKS if kind == "hook" else _WRAPPERS)[key][2] is not None


def _fails(piece: tuple[str, str], backend: str) -> str | None:
    return _STOCK_FAILS.get(piece, {}).get(backend)


def _check(hook: str, wrapper: str, backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid backends are: {', '.join(BACKENDS)}")
    if hook not in HOOKS or wrapper not in WRAPPERS:
        raise ValueError(f"unknown hook {hook!r} or wrapper {wrapper!r}; hooks are "
                         f"{', '.join(HOOKS)}, wrappers are {', '.join(WRAPPERS)}")


def _commlab_pieces(hook: str, wrapper: str, impl: str, backend: str) -> set[tuple[str, str]]:
    """The pieces for which commlab's variant runs."""
    if impl == "stock":
        return set()
    pieces = [p for p in _pieces(hook, wrapper) if _has_variant(p)]
    if impl == "commlab":
        return set(pieces)
    return {p for p in pieces if _fails(p, backend)}


def _plan(hook: str, wrapper: str, impl: str, backend: str) -> tuple[str, str]:
    _check(hook, wrapper, backend)
    name = hook_name(hook, wrapper)
    problems = [why for p in _pieces(hook, wrapper) if (why := _fails(p, backend))]
    ours = _commlab_pieces(hook, wrapper, impl, backend)
    if impl == "stock":
        if problems:
            return "stock", f"impl=stock asks for PyTorch's {name} on {backend}, although {problems[0]}"
        return "stock", f"impl=stock asks for PyTorch's {name}, which works on {backend}"
    if not ours:
        if impl == "commlab":
            return "stock", (f"commlab has no variant of {name}: PyTorch's issues its only collective "
                             "from the hook body (or none), so it is already safe on every backend")
        return "stock", f"PyTorch's {name} works on {backend}"
    names = " and ".join(hook_name(key) if kind == "hook" else _WRAPPERS[key][1]
                         for kind, key in _pieces(hook, wrapper) if (kind, key) in ours)
    if impl == "commlab":
        return "commlab", (f"impl=commlab asks for commlab's {names}: the same algorithm with every "
                           "collective issued from the hook body, in bucket order")
    verb = "run" if len(ours) > 1 else "runs"
    return "commlab", f"commlab's {names} {verb} because {', and '.join(problems)}"


def plan(cfg: RunConfig, backend: str) -> tuple[str, str]:
    """(impl, reason) for ``cfg`` on ``backend`` ("gloo" or "nccl"); needs no process group."""
    return _plan(cfg.hook, cfg.wrapper, cfg.impl, backend)


def stock_warning(cfg: RunConfig, backend: str) -> str | None:
    """With impl=stock, what will go wrong on ``backend``, said before launch; otherwise None."""
    _check(cfg.hook, cfg.wrapper, backend)
    if cfg.impl != "stock":
        return None
    warnings = []
    for piece in _pieces(cfg.hook, cfg.wrapper):
        why = _fails(piece, backend)
        if not why:
            continue
        if (*piece, backend) in _ONE_BUCKET_FAILS:
            advice = ("run with bucket_cap_mb large enough to hold every gradient in one bucket, "
                      "or impl=auto")
        elif piece == ("hook", "batched_powersgd"):
            advice = f"the run fails at step {cfg.start_powerSGD_iter}; use impl=auto or commlab"
        else:
            advice = "the run fails before its first step; use impl=auto or commlab"
        warnings.append(f"{why}: {advice}.")
    return " ".join(warnings) or None


def support_table(backend: str) -> list[dict]:
    """Every hook and wrapper (none wrap noop): does PyTorch's work on ``backend``, what auto runs, why."""
    rows = []
    for hook in HOOKS:
        for wrapper in WRAPPERS:
            if hook == "noop" and wrapper != "none":
                continue
            pieces = _pieces(hook, wrapper)
            fails = [p for p in pieces if _fails(p, backend)]
            if not fails:
                works: bool | str = True
            elif all((*p, backend) in _ONE_BUCKET_FAILS for p in fails):
                works = ONE_BUCKET_ONLY
            else:
                works = False
            impl, why = _plan(hook, wrapper, "auto", backend)
            rows.append({"hook": hook, "wrapper": wrapper, "name": hook_name(hook, wrapper),
                         "stock_works": works, "auto_impl": impl, "why": why})
    return rows


def _resolve(piece: tuple[str, str], commlab: bool) -> Callable:
    kind, key = piece
    stock_module, attr, commlab_module = (_HOOKS if kind == "hook" else _WRAPPERS)[key]
    return getattr(importlib.import_module(commlab_module if commlab else stock_module), attr)


def choose(cfg: RunConfig, backend: str, process_group=None) -> HookChoice:
    """Build the state and hook to register; ``process_group`` None means the default group."""
    impl, reason = plan(cfg, backend)
    ours = _commlab_pieces(cfg.hook, cfg.wrapper, cfg.impl, backend)
    hook = _resolve(("hook", cfg.hook), ("hook", cfg.hook) in ours)
    if cfg.wrapper != "none":
        hook = _resolve(("wrapper", cfg.wrapper), ("wrapper", cfg.wrapper) in ours)(hook)
    if cfg.hook in POWERSGD_HOOKS:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        state: object = PowerSGDState(process_group, **cfg.powersgd_kwargs())
    else:
        state = process_group
    return HookChoice(state, hook, impl, hook_name(cfg.hook, cfg.wrapper), reason)
