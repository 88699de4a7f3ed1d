"""Which hook runs: PyTorch's stock hook wherever it works on the backend, commlab's variant elsewhere.

Everything known about each hook is its row of ``commlab.hook_specs``; this module turns a row and
the run's settings into what DDP registers.  A configuration names a hook and optionally a
compress wrapper around it.  Each of the two pieces is chosen on its own:

- ``impl="auto"``: PyTorch's piece where it works on the backend, commlab's where it does not;
- ``impl="stock"``: PyTorch's pieces, failing the way they fail (``stock_warning`` says how);
- ``impl="commlab"``: commlab's piece wherever commlab has one.  commlab has variants only of the
  pieces that fail somewhere (PowerSGD, batched PowerSGD, the bf16 hook and wrapper, quantization):
  PyTorch's allreduce, fp16 and noop hooks and the fp16 wrapper issue their only collective from
  the hook body or none at all, so they are already safe and are used as they are.

``HookChoice.impl`` is "commlab" when any piece is commlab's.  What fails where was measured on
torch 2.13 (docs/hooks.md); tests/test_hooks.py re-checks the bf16 and batched causes.  ``plan``,
``stock_warning``, ``support_table`` and ``pieces`` are pure and import no
torch, for the CLI and the UI.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from commlab.config import RESOLVED_BACKENDS, RunConfig
from commlab.hook_specs import HOOKS, SPECS, WRAPPER_SPECS, WRAPPERS, Build, HookSpec, WrapperSpec

BACKENDS = RESOLVED_BACKENDS  # a plan is made for the backend a run resolved "auto" to
ONE_BUCKET_ONLY = "one bucket only"
NONE_IN_PYTORCH = "none in PyTorch"


@dataclass
class HookChoice:
    state: object  # what to pass to ddp.register_comm_hook
    hook: Callable  # the hook
    impl: str  # "stock" (PyTorch's) or "commlab"
    name: str  # readable, e.g. "fp16_compress_wrapper(powerSGD_hook)"
    reason: str  # why this implementation was chosen, one sentence
    spec: HookSpec  # everything else the lab knows of the hook
    averager: object = None  # post-local SGD's PeriodicModelAverager, DiLoCo's state: average_parameters() after each step


def hook_name(hook: str, wrapper: str = "none") -> str:
    """PyTorch's spelling of a hook, wrapped: ``bf16_compress_wrapper(powerSGD_hook)``."""
    name = SPECS[hook].attr
    return name if wrapper == "none" else f"{WRAPPER_SPECS[wrapper].attr}({name})"


def hook_args(cfg: RunConfig) -> dict:
    """The keyword arguments ``cfg``'s hook takes after (state, bucket); pure, for the exports."""
    return {k: getattr(cfg, s) for k, s in SPECS[cfg.hook].bound.items()}


Part = HookSpec | WrapperSpec  # a piece of a configuration: its hook, or its wrapper


def _parts(hook: str, wrapper: str) -> list[Part]:
    return [SPECS[hook]] + ([WRAPPER_SPECS[wrapper]] if wrapper != "none" else [])


def _kind(part: Part) -> str:
    return "hook" if isinstance(part, HookSpec) else "wrapper"


def _check(hook: str, wrapper: str, backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid backends are: {', '.join(BACKENDS)}")
    if hook not in HOOKS or wrapper not in WRAPPERS:
        raise ValueError(f"unknown hook {hook!r} or wrapper {wrapper!r}; hooks are "
                         f"{', '.join(HOOKS)}, wrappers are {', '.join(WRAPPERS)}")


def _commlab_parts(hook: str, wrapper: str, impl: str, backend: str) -> list[Part]:
    """The pieces for which commlab's variant runs (always, for those PyTorch has none of)."""
    parts = _parts(hook, wrapper)
    only = [p for p in parts if p.commlab_only]
    if impl == "stock":
        return only
    ours = [p for p in parts if p.variant is not None]
    if impl == "commlab":
        return ours
    return [p for p in parts if p in only or (p in ours and backend in p.failure.fails)]


def _plan(hook: str, wrapper: str, impl: str, backend: str) -> tuple[str, str]:
    _check(hook, wrapper, backend)
    name = hook_name(hook, wrapper)
    parts = _parts(hook, wrapper)
    problems = [p.failure.fails[backend] for p in parts if backend in p.failure.fails]
    ours = _commlab_parts(hook, wrapper, impl, backend)
    if SPECS[hook].commlab_only:
        where = ("issues its collective after the optimizer step, on the training loop's thread, none "
                 "from the hook" if SPECS[hook].averages_parameters else
                 "issues every collective from the hook body, in bucket order")
        return "commlab", f"PyTorch has no {name}: commlab's {where}, so it is safe on every backend"
    note = SPECS[hook].failure.note
    if impl == "stock":
        if problems:
            return "stock", f"impl=stock asks for PyTorch's {name} on {backend}, although {problems[0]}"
        return "stock", f"impl=stock asks for PyTorch's {name}, which works on {backend}{note}"
    if not ours:
        if impl == "commlab":
            return "stock", (f"commlab has no variant of {name}: PyTorch's issues its only collective "
                             "from the hook body (or none), so it is already safe on every backend")
        return "stock", f"PyTorch's {name} works on {backend}{note}"
    names = " and ".join(p.attr for p in parts if p in ours)
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
    for part in _parts(cfg.hook, cfg.wrapper):
        why = part.failure.fails.get(backend)
        if not why:
            continue
        if backend in part.failure.one_bucket_works:
            advice = ("run with bucket_cap_mb large enough to hold every gradient in one bucket, "
                      "or impl=auto")
        elif part.failure.fails_at_compression:
            advice = f"the run fails at step {getattr(cfg, part.starts)}; use impl=auto or commlab"
        else:
            advice = "the run fails before its first step; use impl=auto or commlab"
        warnings.append(f"{why}: {advice}.")
    return " ".join(warnings) or None


def support_table(backend: str) -> list[dict]:
    """Every hook and wrapper (none wrap noop): does PyTorch's work on ``backend``, what auto runs, why."""
    rows = []
    for hook, spec in SPECS.items():
        for wrapper in WRAPPERS if spec.wrappable else ("none",):
            fails = [p for p in _parts(hook, wrapper) if backend in p.failure.fails]
            if spec.commlab_only:
                works: bool | str = NONE_IN_PYTORCH
            elif not fails:
                works = True
            elif all(backend in p.failure.one_bucket_works for p in fails):
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
    """The hook, then the wrapper if any, each with where PyTorch's fails: pure, for the exports."""
    _check(hook, wrapper, backend)
    return [Piece(_kind(p), p.name, p.stock, p.attr, p.variant is not None,
                  p.failure.fails.get(backend))
            for p in _parts(hook, wrapper)]


def _function(part: Part, commlab: bool) -> Callable:
    return getattr(importlib.import_module(part.module(commlab)), part.attr)


def build(made: Build, module: str, cfg: RunConfig, process_group=None):
    """An object of ``made`` (a state, an averager): ``made.attr`` of ``made.module`` or else of
    ``module``, called as the spec says.  Every rank must call it, in the same order: subgroups are
    process groups."""
    cls = getattr(importlib.import_module(made.module or module), made.attr)
    first = []
    if made.subgroup:
        import torch.distributed as dist

        first.append(dist.new_subgroups(group_size=cfg.localsgd_subgroup_size)[0])
    if made.group_keyword:
        return cls(*first, **made.kwargs(cfg), process_group=process_group)
    return cls(process_group, *first, **made.kwargs(cfg))


def choose(cfg: RunConfig, backend: str, process_group=None) -> HookChoice:
    """Build the state and hook to register; ``process_group`` None means the default group."""
    impl, reason = plan(cfg, backend)
    spec = SPECS[cfg.hook]
    ours = _commlab_parts(cfg.hook, cfg.wrapper, cfg.impl, backend)
    commlab_hook = spec in ours
    hook = _function(spec, commlab_hook)
    if commlab_hook and spec.blocking and not cfg.overlap:
        hook = getattr(importlib.import_module(spec.variant), spec.blocking)
    bound = hook_args(cfg)
    if bound:  # bound, under the hook's own name: DDP logs the hook by it
        hook = functools.update_wrapper(functools.partial(hook, **bound), hook)
    if cfg.wrapper != "none":
        wrapper = WRAPPER_SPECS[cfg.wrapper]
        hook = _function(wrapper, wrapper in ours)(hook)
    module = spec.module(commlab_hook)
    state = build(spec.state, module, cfg, process_group) if spec.state else process_group
    averager = None
    if spec.averaging:
        averager = state if spec.outer_loop else build(spec.averaging.averager, module, cfg, process_group)
    return HookChoice(state, hook, impl, hook_name(cfg.hook, cfg.wrapper), reason, spec, averager)

