"""The one description of a run's hook as code, which every Python export asks: which pieces
(PyTorch's, or commlab's where PyTorch's fails on the target backend or PyTorch has none), their
imports, the state's construction, the hook's expression, the register call and the averager.

``facts`` is the one place the exports read the hook table (``HookSpec``): every other module of
the package reads a ``HookFacts``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from commlab.config import RunConfig
from commlab.hook_specs import SPECS, WRAPPER_SPECS, Build
from commlab.hooks import registry
from commlab.tune.export.text import call, comment

COMMLAB_MODULE = "commlab.hooks"
COMMLAB_ALIAS = "commlab_hooks"
LOCALSGD_SUBGROUPS = ("PostLocalSGDState(subgroup=None) would make one subgroup per machine on the "
                      "first local step, which raises ValueError without CUDA and would not be the "
                      "run's localsgd_subgroup_size")
# Accelerate's DDPCommunicationHookType members that name a hook, in the table's order.
ACCELERATE_MEMBERS = tuple(dict.fromkeys(s.accelerate for s in SPECS.values() if s.accelerate))
DDP_DEFAULT_BUCKET_CAP_MB = 25.0


@dataclass(frozen=True)
class HookFacts:
    """What the exports know of a run's hook and wrapper, read off their rows of the hook table."""

    name: str  # PyTorch's spelling of the hook, unwrapped
    attr: str  # its function
    state: Build | None  # None: the hook takes the process group as its state
    averager: Build | None  # stepped after every optimizer step (post-local SGD's; DiLoCo's is its state)
    outer_loop: bool  # its state is its averager: an outer optimizer over local steps (DiLoCo)
    subgroup: bool  # its collectives span subgroups of localsgd_subgroup_size ranks
    sends_nothing: bool
    checkpoint: str  # hook_specs' NO_STATE, WHOLE_STATE or STEP_COUNTS
    checkpoint_why: str
    starts: str | None  # the setting naming the step it starts at
    accelerate: str | None  # its member of Accelerate's DDPCommunicationHookType
    wrapper_accelerate: str  # the wrapper's member ("NO" without a wrapper)

    @property
    def averages_parameters(self) -> bool:
        return self.averager is not None


def facts(cfg: RunConfig) -> HookFacts:
    s = SPECS[cfg.hook]
    return HookFacts(
        name=registry.hook_name(cfg.hook), attr=s.attr, state=s.state,
        averager=s.averaging.averager if s.averaging else None,
        outer_loop=s.outer_loop, subgroup=s.subgroup, sends_nothing=s.sends_nothing,
        checkpoint=s.checkpoint.holds, checkpoint_why=s.checkpoint.why, starts=s.starts, accelerate=s.accelerate,
        wrapper_accelerate=WRAPPER_SPECS[cfg.wrapper].accelerate if cfg.wrapper != "none" else "NO")


# ============================================================================ which pieces
@dataclass(frozen=True)
class Choice:
    """One piece as the export writes it: PyTorch's, or commlab's where PyTorch's fails or where
    PyTorch has none."""

    piece: registry.Piece
    commlab: bool

    @property
    def alias(self) -> str:
        return COMMLAB_ALIAS if self.commlab else alias(self.piece.module)

    @property
    def module(self) -> str:
        return COMMLAB_MODULE if self.commlab else self.piece.module

    @property
    def expr(self) -> str:
        return f"{self.alias}.{self.piece.attr}"

    def why(self, backend: str) -> str:
        if self.piece.module is None:
            return f"commlab's {self.piece.attr} (PyTorch has none)"
        if self.commlab:
            return f"commlab's {self.piece.attr} (PyTorch's fails on {backend}: see above)"
        return f"PyTorch's {self.piece.attr} (works on {backend})"


def alias(module: str) -> str:
    """The name a PyTorch hook module is imported as."""
    # default_hooks -> default, powerSGD_hook -> powerSGD, debugging_hooks -> debugging
    return re.sub(r"_hooks?$", "", module.rsplit(".", 1)[1])


def choices(cfg: RunConfig, backend: str) -> list[Choice]:
    """The hook, then the wrapper if any: commlab's where PyTorch's fails on ``backend`` and where
    PyTorch has none.

    PyTorch's PowerSGD works on Gloo with one bucket, but how many buckets DDP makes depends on the
    model, which an export never loads: commlab's is used on Gloo whatever the bucket cap."""
    found = registry.pieces(cfg.hook, cfg.wrapper, backend)
    # commlab.hooks offers every variant the hook table names (its __all__ is read off the table).
    return [Choice(p, p.module is None or (bool(p.fails) and p.has_variant)) for p in found]


# ============================================================================ the hook as code
@dataclass(frozen=True)
class HookCode:
    """What a Python export writes for a run's hook, each part empty where the hook needs none."""

    facts: HookFacts
    chosen: list[Choice]  # the hook, then the wrapper if any
    backend: str
    needs: tuple[str, ...]  # import lines beyond the hooks' modules
    define: str  # a function binding the hook's own arguments (quantization_perchannel_hook's)
    subgroups: str  # post-local SGD's, made once the process group exists
    state: str  # the state's expression; "None" for the process group
    hook: str  # the expression naming the hook, unwrapped
    wrapper: str  # the expression naming the wrapper; "" without one
    averager: str  # post-local SGD's averager, built after the hook is registered

    @property
    def wrapped(self) -> str:
        return f"{self.wrapper}({self.hook})" if self.wrapper else self.hook

    @property
    def commlab(self) -> bool:
        """Whether any piece is commlab's."""
        return any(c.commlab for c in self.chosen)

    def imports(self, extra: tuple[str, ...] = (), hooks: bool = True) -> str:
        """The import lines: the hooks' modules and what the hook's code needs (``hooks``), and ``extra``."""
        modules = dict.fromkeys(sorted((c.module, c.alias) for c in self.chosen)) if hooks else {}
        return "\n".join([f"import {m} as {a}" for m, a in modules] + list(extra)
                         + list(self.needs if hooks else ())) + "\n"

    def choice_line(self) -> str:
        """The one comment line that says which implementation each piece is and why."""
        ours = ""
        if any(c.commlab and c.piece.module for c in self.chosen):
            ours = (" commlab's are PyTorch's algorithm and state with every collective issued from the "
                    "hook body, in bucket order.")
        elif self.commlab and self.facts.outer_loop:
            ours = " commlab's hook averages nothing; the outer step runs after optimizer.step()."
        elif self.commlab:
            ours = " commlab's issues every collective from the hook body, in bucket order."
        return "# Hooks: " + ", ".join(c.why(self.backend) for c in self.chosen) + "." + ours + "\n"

    def setup(self) -> str:
        """Every line before ``register_comm_hook``, the state named ``state``."""
        return self.define + self.subgroups + (f"state = {self.state}\n" if self.state != "None" else "")

    def register(self, model: str) -> str:
        state = "None" if self.state == "None" else "state"
        return f"{model}.register_comm_hook({state}, {self.wrapped})\n"

    def after(self, model: str) -> str:
        """The averager and its step in the training loop, as PyTorch's post-local SGD example."""
        if not self.averager:
            return ""
        return (f"averager = {self.averager}\n"
                + comment(["In the training loop, right after every optimizer.step() (where PyTorch's "
                           "post-local SGD example steps its averager), step the averager:",
                           f"  averager.average_parameters({model}.parameters())"]))


def describe(cfg: RunConfig, backend: str, subgroups_here: bool = True) -> HookCode:
    """``cfg``'s hook as code for ``backend``: the state built with the run's settings as its row
    says (``hook_specs.Build``: the registry builds the live one from the same row), and the hook.
    ``subgroups_here`` False: the snippet runs before the process group exists (Lightning), so the
    state gets none."""
    f = facts(cfg)
    chosen = choices(cfg, backend)
    hook, *wrapper = chosen
    expr = hook.expr
    define, subgroups, state, averager, needs = "", "", "None", "", []
    if registry.hook_args(cfg):
        args = ", ".join(f"{k}={v!r}" for k, v in registry.hook_args(cfg).items())
        define = (f"def {hook.piece.attr}(process_group, bucket):  # with the run's {args}\n"
                  f"    return {hook.expr}(process_group, bucket, {args})\n\n\n")
        expr = hook.piece.attr
    if f.state:
        first = ["process_group=None"]
        if f.state.subgroup:
            if subgroups_here:
                subgroups = (comment([f"Subgroups made here, as the run made them: {LOCALSGD_SUBGROUPS}."])
                             + f"subgroup, _ = dist.new_subgroups(group_size={cfg.localsgd_subgroup_size!r})\n")
                needs.append("import torch.distributed as dist")
            first.append(f"subgroup={'subgroup' if subgroups_here else None}")
        state = call(f"{hook.alias}.{f.state.attr}", first, f.state.spelled(cfg))
    if f.outer_loop:  # DiLoCo's state steps itself after the optimizer
        averager = "state"
    elif f.averager:
        module_alias = f.averager.module.rsplit(".", 1)[1]
        if subgroups_here:
            needs.append(f"import {f.averager.module} as {module_alias}")
        averager = call(f"{module_alias}.{f.averager.attr}", [], f.averager.spelled(cfg))
    return HookCode(f, chosen, backend, tuple(needs), define, subgroups, state, expr,
                    wrapper[0].expr if wrapper else "", averager)


def bucket_cap(cfg: RunConfig) -> str | None:
    """DDP's ``bucket_cap_mb`` argument, where the run's differs from DDP's default."""
    return None if cfg.bucket_cap_mb == DDP_DEFAULT_BUCKET_CAP_MB else f"bucket_cap_mb={cfg.bucket_cap_mb!r}"
