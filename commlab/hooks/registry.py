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
torch 2.13 (docs/hooks.md); tests/test_hooks.py re-checks the bf16 and batched causes.  ``plan``,
``stock_warning`` and ``support_table`` are pure and import no torch, for the CLI and the UI.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from commlab.config import (
    COMPRESSOR_HOOKS,
    HOOKS,
    LOCALSGD_HOOKS,
    POWERSGD_HOOKS,
    QUANTIZATION_HOOKS,
    RESOLVED_BACKENDS,
    WRAPPERS,
    RunConfig,
    Setting,
    settings,
)

BACKENDS = RESOLVED_BACKENDS  # a plan is made for the backend a run resolved "auto" to
ONE_BUCKET_ONLY = "one bucket only"
NONE_IN_PYTORCH = "none in PyTorch"

_TORCH = "torch.distributed.algorithms.ddp_comm_hooks"
# hook -> (PyTorch's module, its function, commlab's module or None)
_HOOKS = {
    "allreduce": (f"{_TORCH}.default_hooks", "allreduce_hook", None),
    "fp16": (f"{_TORCH}.default_hooks", "fp16_compress_hook", None),
    "bf16": (f"{_TORCH}.default_hooks", "bf16_compress_hook", f"{__package__}.compress"),
    "powersgd": (f"{_TORCH}.powerSGD_hook", "powerSGD_hook", f"{__package__}.powersgd"),
    "batched_powersgd": (f"{_TORCH}.powerSGD_hook", "batched_powerSGD_hook", f"{__package__}.powersgd"),
    "noop": (f"{_TORCH}.debugging_hooks", "noop_hook", None),
    "quantize_pertensor": (f"{_TORCH}.quantization_hooks", "quantization_pertensor_hook",
                           f"{__package__}.quantization"),
    "quantize_perchannel": (f"{_TORCH}.quantization_hooks", "quantization_perchannel_hook",
                            f"{__package__}.quantization"),
    "post_localsgd": (f"{_TORCH}.post_localSGD_hook", "post_localSGD_hook", None),
    # PyTorch has none of these: commlab's are the only ones (no stock module).
    **{h: (None, f"{h}_hook", f"{__package__}.compressors") for h in COMPRESSOR_HOOKS},
}
# Hooks no wrapper may wrap (RunConfig refuses it): noop sends nothing, the others pick their wire format.
UNWRAPPED = ("noop", *QUANTIZATION_HOOKS, *COMPRESSOR_HOOKS)
# hook -> (module, function(cfg, process_group)) building its state; the others take the group
_STATE_BUILDERS = {
    "post_localsgd": (f"{__package__}.localsgd", "make_state"),
    **{h: (f"{__package__}.compressors", "make_state") for h in COMPRESSOR_HOOKS},
}
# hook -> its arguments after (state, bucket), from the settings table
_HOOK_ARGS = {"quantize_perchannel": lambda cfg: {"bucket_size": cfg.quantization_bucket_size}}
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
_QUANTIZATION_BROKEN = ("PyTorch's {name} fails at its first step on every backend ({error}: it "
                        "indexes the allgather future's value as one stacked tensor, torch 2.13 gives "
                        "the list of gathered tensors; measured on Gloo, 1 and 2 buckets, 2 and 3 "
                        "ranks) and allgathers from inside a future callback, as powerSGD_hook allreduces")
_QUANTIZATION_ERRORS = {"quantize_pertensor": "IndexError",
                        "quantize_perchannel": "no step completed within 60 s"}
# (piece, key) -> backend -> why PyTorch's piece fails there
_STOCK_FAILS = {
    ("hook", "bf16"): {"gloo": _BF16_REFUSED.format(name="bf16_compress_hook")},
    ("hook", "powersgd"): {"gloo": _POWERSGD_GLOO},
    ("hook", "batched_powersgd"): {"gloo": _BATCHED_BROKEN, "nccl": _BATCHED_BROKEN},
    ("wrapper", "bf16"): {"gloo": _BF16_REFUSED.format(name="bf16_compress_wrapper")},
    **{("hook", h): dict.fromkeys(BACKENDS, _QUANTIZATION_BROKEN.format(name=_HOOKS[h][1], error=error))
       for h, error in _QUANTIZATION_ERRORS.items()},
}
# What auto's reason adds for a stock hook that runs with a state commlab builds differently.
_STATE_NOTES = {"post_localsgd": (
    "; commlab passes it subgroups made with dist.new_subgroups(group_size=localsgd_subgroup_size): "
    "PostLocalSGDState(subgroup=None) makes one subgroup per machine on the first local step, which "
    "raises ValueError without CUDA (measured on Gloo) and would hold every rank of one machine")}
# Failures that a single bucket avoids: with one bucket only one callback chain is ever waiting.
_ONE_BUCKET_FAILS = {("hook", "powersgd", "gloo")}


@dataclass
class HookChoice:
    state: object  # what to pass to ddp.register_comm_hook
    hook: Callable  # the hook
    impl: str  # "stock" (PyTorch's) or "commlab"
    name: str  # readable, e.g. "fp16_compress_wrapper(powerSGD_hook)"
    reason: str  # why this implementation was chosen, one sentence
    averager: object = None  # post-local SGD's PeriodicModelAverager: average_parameters() after each step


def hook_name(hook: str, wrapper: str = "none") -> str:
    """PyTorch's spelling of a hook, wrapped: ``bf16_compress_wrapper(powerSGD_hook)``."""
    name = _HOOKS[hook][1]
    return name if wrapper == "none" else f"{_WRAPPERS[wrapper][1]}({name})"


def hook_args(cfg: RunConfig) -> dict:
    """The keyword arguments ``cfg``'s hook takes after (state, bucket); pure, for the exports."""
    return _HOOK_ARGS[cfg.hook](cfg) if cfg.hook in _HOOK_ARGS else {}


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


def _commlab_only(piece: tuple[str, str]) -> bool:
    kind, key = piece
    return kind == "hook" and _HOOKS[key][0] is None


def _commlab_pieces(hook: str, wrapper: str, impl: str, backend: str) -> set[tuple[str, str]]:
    """The pieces for which commlab's variant runs (always, for those PyTorch has none of)."""
    only = {p for p in _pieces(hook, wrapper) if _commlab_only(p)}
    if impl == "stock":
        return only
    pieces = [p for p in _pieces(hook, wrapper) if _has_variant(p)]
    if impl == "commlab":
        return set(pieces)
    return only | {p for p in pieces if _fails(p, backend)}


def _plan(hook: str, wrapper: str, impl: str, backend: str) -> tuple[str, str]:
    _check(hook, wrapper, backend)
    name = hook_name(hook, wrapper)
    problems = [why for p in _pieces(hook, wrapper) if (why := _fails(p, backend))]
    ours = _commlab_pieces(hook, wrapper, impl, backend)
    if _commlab_only(("hook", hook)):
        return "commlab", (f"PyTorch has no {name}: commlab's issues every collective from the hook "
                           "body, in bucket order, so it is safe on every backend")
    note = _STATE_NOTES.get(hook, "")
    if impl == "stock":
        if problems:
            return "stock", f"impl=stock asks for PyTorch's {name} on {backend}, although {problems[0]}"
        return "stock", f"impl=stock asks for PyTorch's {name}, which works on {backend}{note}"
    if not ours:
        if impl == "commlab":
            return "stock", (f"commlab has no variant of {name}: PyTorch's issues its only collective "
                             "from the hook body (or none), so it is already safe on every backend")
        return "stock", f"PyTorch's {name} works on {backend}{note}"
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
            if hook in UNWRAPPED and wrapper != "none":
                continue
            pieces = _pieces(hook, wrapper)
            fails = [p for p in pieces if _fails(p, backend)]
            if _commlab_only(("hook", hook)):
                works = NONE_IN_PYTORCH
            elif not fails:
                works: bool | str = True
            elif all((*p, backend) in _ONE_BUCKET_FAILS for p in fails):
                works = ONE_BUCKET_ONLY
            else:
                works = False
            impl, why = _plan(hook, wrapper, "auto", backend)
            rows.append({"hook": hook, "wrapper": wrapper, "name": hook_name(hook, wrapper),
                         "stock_works": works, "auto_impl": impl, "why": why})
    return rows


@dataclass(frozen=True)
class Piece:
    """One piece of a configuration as production code names it (``pieces``)."""

    kind: str  # "hook" or "wrapper"
    key: str  # commlab's name of it: "powersgd", "bf16", ...
    module: str | None  # PyTorch's module; None for a hook PyTorch does not have
    attr: str  # the function, spelled alike in PyTorch and in commlab.hooks
    has_variant: bool  # commlab.hooks has a variant of it
    fails: str | None  # why PyTorch's fails on the backend; None where it works


def pieces(hook: str, wrapper: str, backend: str) -> list[Piece]:
    """The hook, then the wrapper if any, each with where PyTorch's fails: pure, for the exports.
    Raises LookupError for a hook this table does not name a function for."""
    _check(hook, wrapper, backend)
    if hook not in _HOOKS:
        raise LookupError(f"{hook!r} has no function in PyTorch's ddp_comm_hooks or commlab.hooks "
                          f"that production code could register; these do: {', '.join(_HOOKS)}")
    out = []
    for kind, key in _pieces(hook, wrapper):
        module, attr, _ = (_HOOKS if kind == "hook" else _WRAPPERS)[key]
        out.append(Piece(kind, key, module, attr, _has_variant((kind, key)), _fails((kind, key), backend)))
    return out


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
    elif cfg.hook in _STATE_BUILDERS:
        module, builder = _STATE_BUILDERS[cfg.hook]
        state = getattr(importlib.import_module(module), builder)(cfg, process_group)
    else:
        state = process_group
    if hook_args(cfg):  # bound, under the hook's own name: DDP logs the hook by it
        hook = functools.update_wrapper(functools.partial(hook, **hook_args(cfg)), hook)
    averager = None
    if cfg.hook in LOCALSGD_HOOKS:
        from commlab.hooks.localsgd import make_averager

        averager = make_averager(cfg, process_group)
    return HookChoice(state, hook, impl, hook_name(cfg.hook, cfg.wrapper), reason, averager)


class _Noting(RunConfig):
    """A RunConfig that notes the name of everything read of it."""

    def __getattribute__(self, name):
        seen = object.__getattribute__(self, "__dict__").get("_seen")
        if seen is not None:
            seen.add(name)
        return object.__getattribute__(self, name)


@functools.cache
def reads(hook: str) -> frozenset[str]:
    """The settings ``hook`` reads: what building it reads of its config, as ``choose`` builds it
    (on a config that notes what is read, with no process group: the states keep theirs for
    later).  Post-local SGD's state makes its subgroups at once, which needs a process group: for
    it, what the plan, its subgroups, its state and its averager read, without building them."""
    cfg = _Noting(hook=hook)
    cfg._seen = seen = set()
    if hook in LOCALSGD_HOOKS:
        from commlab.hooks import localsgd

        plan(cfg, BACKENDS[0])
        localsgd.state_kwargs(cfg), localsgd.averager_kwargs(cfg), cfg.localsgd_subgroup_size
    else:
        choose(cfg, BACKENDS[0])
    return frozenset(seen)


@functools.cache
def own_settings(hook: str) -> tuple[Setting, ...]:
    """The sweepable settings ``hook`` reads, in the table's order (the wrapper only where one may
    wrap it): what tells apart two runs of it, so a sweep's axes and a run's label.  () for a name
    that is no hook."""
    if hook not in HOOKS:
        return ()
    return tuple(s for s in settings() if s.sweepable and s.name in reads(hook)
                 and (s.name != "wrapper" or hook not in UNWRAPPED))
