"""What a row of the hook table (``commlab.hook_specs``) holds: a few core fields, a set of
capabilities, and optional records for what only some hooks have.

PyTorch's ``DDPCommHookType`` is one flat table of partials; a row here is that taken further,
composed the way ``PowerSGDState`` groups its fields: where the hook's function lives and how its
state is built (core), where PyTorch's own fails (``StockFailure``), how it averages the model
(``Averaging``), what its checkpoint holds (``Checkpointing``), how a run's label names its
settings (``Label``), what a compressor sends (``Definition``, its words in
``commlab.hook_definitions``), and ``Capability``: what a hook is, wherever the lab treats it apart,
so that no reader compares hook names.

Pure: no torch.  Settings are named as ``RunConfig`` spells them; modules by their dotted path.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from commlab.rules import Rule

ALLREDUCE, ALLGATHER = "allreduce", "allgather"  # what a hook's messages go through

# What a hook's checkpoint holds (``Checkpointing.holds``).
NO_STATE = "none"  # nothing beyond the model and optimizer
WHOLE_STATE = "state"  # the state object, pickled whole (PowerSGD's, the compressors')
STEP_COUNTS = "steps"  # step counts only: the state holds process groups, which do not pickle


@dataclass(frozen=True)
class Build:
    """An object a hook needs, made from the settings: ``attr`` called with the process group
    first (``process_group=``, as a keyword, when ``group_keyword``), then, when ``subgroup``,
    subgroups of ``localsgd_subgroup_size`` ranks, then the keywords ``settings`` names
    ({keyword: setting}).  ``module`` None: the module of the hook's implementation that runs
    (PyTorch's or commlab's: each holds its own state class).  ``starts``: the setting, among
    ``settings``' values, naming the step the hook starts at (plain allreduce before).

    The exports write the same call as source text, leaving out the keywords whose value is
    ``defaults``' (the class's own) unless ``always`` names them."""

    attr: str
    settings: Mapping[str, str] = field(default_factory=dict)
    module: str | None = None
    subgroup: bool = False
    group_keyword: bool = False
    defaults: Mapping[str, Any] = field(default_factory=dict)
    always: tuple[str, ...] = ()
    starts: str | None = None

    def kwargs(self, cfg: Any) -> dict[str, Any]:
        """The keywords, read off ``cfg``."""
        return {k: getattr(cfg, s) for k, s in self.settings.items()}

    def spelled(self, cfg: Any) -> dict[str, Any]:
        """The keywords an export spells out: those ``always`` names and those off the default."""
        return {k: v for k, v in self.kwargs(cfg).items()
                if k in self.always or k not in self.defaults or v != self.defaults[k]}

    def reads(self) -> tuple[str, ...]:
        return (*self.settings.values(), *(("localsgd_subgroup_size",) if self.subgroup else ()))


@dataclass(frozen=True)
class StockFailure:
    """Where PyTorch's own function of a hook or wrapper fails, and why (measured on torch 2.13)."""

    fails: Mapping[str, str] = field(default_factory=dict)  # backend -> why PyTorch's fails there
    one_bucket_works: tuple[str, ...] = ()  # backends where a single bucket avoids that failure
    fails_at_compression: bool = False  # it fails when compression starts, not at once
    note: str = ""  # what the reason for PyTorch's adds (how commlab builds its state)


@dataclass(frozen=True)
class Averaging:
    """The model averaged after every optimizer step, one period apart (post-local SGD, DiLoCo)."""

    period: str  # the setting naming the steps from one averaging to the next
    averager: Build | None = None  # what averages; None: the hook's state is its own averager
    first_step: str | None = None  # the setting naming the step averaging starts at; None: 0
    precision: str | None = None  # the setting naming what it sends (OUTER_PRECISIONS); None: the parameters as they are


@dataclass(frozen=True)
class Checkpointing:
    """What a hook's checkpoint holds, and whether a run of it resumes from one."""

    holds: str = NO_STATE  # NO_STATE, WHOLE_STATE or STEP_COUNTS
    why: str = ""  # how its state survives a checkpoint, in the exports' words
    keeps: tuple[str, ...] = ()  # the state's fields that change as it runs: what a lab checkpoint holds
    not_resumable: str | None = None  # why a run of it cannot be continued from its checkpoint


@dataclass(frozen=True)
class Label:
    """How a run's label names the hook's own settings (``commlab.config.label_of``)."""

    short_names: Mapping[str, str] = field(default_factory=dict)  # setting -> its name in labels
    named_when_changed: tuple[str, ...] = ()  # settings a label names only off their default


@dataclass(frozen=True)
class Definition:
    """What a compressor computes and sends, in formula-like sentences, and where that differs from
    its paper and from GRACE's code (sands-lab/grace, ``grace_dl/torch``, the field's reference
    implementation).  tests/test_grace.py re-types GRACE's formulas and runs them beside commlab's on
    the same inputs and draws: each difference said here is shown there, each agreement is bit for bit.
    The Launch and Compare pages, ``commlab hooks`` and docs/hooks.md read it (``commlab.ui.definitions``)."""

    sends: str  # what one rank sends, and what the ranks' messages make
    paper: str  # the paper it follows, and where the lab differs from it
    grace: str  # where GRACE's code differs from the lab's, or that they agree
    choice: str  # the lab's own choice where it differs, and why


class Capability(Enum):
    """What a hook is, where that changes what the lab does with it; each says it in words (a row's
    name and its averaging's precision setting go where ``{hook}`` and ``{precision}`` stand)."""

    GATHERS = "its messages go through allgather, not allreduce (the what-if model prices it so)"
    OWN_WIRE_FORMAT = ("it chooses its own wire format (uint8 codes, packed signs or indices), so a cast "
                       "before it only loses precision")
    SENDS_NOTHING = "{hook} sends nothing, so there is nothing to compress"
    STEPS_ON_OWN_GRADIENTS = ("it averages no gradients (each replica steps with its own); its outer "
                              "collective sends the pseudo-gradient in {precision}")
    LAYER_RULE = "it compresses layer by layer by PowerSGD's rule (layers.json applies)"
    LOW_RANK_MEMORIES = ("it keeps low-rank P and Q memories, watched for PowerSGD's pitfalls "
                         "(commlab.hooks.pitfalls)")
    BLOCKING_TWIN = ("commlab's variant has a twin that waits in the hook body, named blocking_ and its "
                     "function's name, run with overlap off")


# What a compress wrapper cannot go around: a cast before these only loses precision, or casts nothing.
_REFUSE_WRAPPER = (Capability.SENDS_NOTHING, Capability.OWN_WIRE_FORMAT, Capability.STEPS_ON_OWN_GRADIENTS)


@dataclass(frozen=True)
class HookSpec:
    """One hook: its core fields, what it is, and its optional records."""

    name: str  # commlab's name of it: the value of the `hook` setting
    family: str  # one of hook_specs.FAMILIES
    attr: str  # its function, spelled alike in PyTorch's module and in commlab.hooks
    stock: str | None  # PyTorch's module; None: PyTorch has no such hook
    variant: str | None = None  # commlab's module with a variant of the same name; None: PyTorch's is safe
    state: Build | None = None  # None: the hook takes the process group as its state
    bound: Mapping[str, str] = field(default_factory=dict)  # keyword -> setting, bound after (state, bucket)
    capabilities: frozenset[Capability] = frozenset()
    failure: StockFailure = field(default_factory=StockFailure)  # where PyTorch's fails
    averaging: Averaging | None = None  # None: it averages gradients only
    checkpoint: Checkpointing = field(default_factory=Checkpointing)
    label: Label = field(default_factory=Label)
    accelerate: str | None = None  # its member of Accelerate's DDPCommunicationHookType
    rules: tuple[Rule, ...] = ()  # rules between settings of its own
    exports: tuple[str, ...] = ()  # more names commlab.hooks offers for it (its state class)
    definition: Definition | None = None  # what it sends against its paper and GRACE (the compressors')

    @property
    def commlab_only(self) -> bool:
        return self.stock is None

    @property
    def wrap_refusal(self) -> str | None:
        """Why no compress wrapper may wrap it; None: one may."""
        why = next((c.value for c in _REFUSE_WRAPPER if c in self.capabilities), None)
        return why and why.format(hook=self.name, precision=self.averaging and self.averaging.precision)

    @property
    def wrappable(self) -> bool:
        return self.wrap_refusal is None

    @property
    def collective(self) -> str:
        """What its messages go through, for the what-if model."""
        return ALLGATHER if Capability.GATHERS in self.capabilities else ALLREDUCE

    @property
    def sends_nothing(self) -> bool:
        """Gradients are never averaged."""
        return Capability.SENDS_NOTHING in self.capabilities

    @property
    def layerwise(self) -> bool:
        return Capability.LAYER_RULE in self.capabilities

    @property
    def pitfalls(self) -> bool:
        return Capability.LOW_RANK_MEMORIES in self.capabilities

    @property
    def blocking(self) -> str | None:
        """commlab's variant that waits in the hook, run with ``overlap`` off; None: there is none."""
        return f"blocking_{self.attr}" if Capability.BLOCKING_TWIN in self.capabilities else None

    @property
    def starts(self) -> str | None:
        """The setting naming the step it starts at (plain allreduce before); None: step 0."""
        return self.state.starts if self.state else None

    @property
    def averages_parameters(self) -> bool:
        return self.averaging is not None

    @property
    def outer_loop(self) -> bool:
        """Whether its state is its own averager (DiLoCo's outer optimizer): one object, built once."""
        return self.averaging is not None and self.averaging.averager is None

    @property
    def subgroup(self) -> bool:
        """Whether its collectives span subgroups of ``localsgd_subgroup_size`` ranks."""
        return self.state is not None and self.state.subgroup

    def reads(self) -> tuple[str, ...]:
        """Every setting building and running it reads, declared (the wrapper where one may wrap it)."""
        averager = self.averaging.averager if self.averaging else None
        names = [*(("wrapper",) if self.wrappable else ()),
                 *(self.state.reads() if self.state else ()), *(averager.reads() if averager else ()),
                 *self.bound.values(), *(("overlap",) if self.blocking else ())]
        return tuple(dict.fromkeys(names))

    def module(self, commlab: bool) -> str:
        """The module of the implementation that runs: commlab's (its variant, or its only one) or PyTorch's."""
        return (self.variant or self.stock) if commlab or self.stock is None else self.stock


@dataclass(frozen=True)
class WrapperSpec:
    """A compress wrapper around a hook (PyTorch's fp16 and bf16): a piece of a configuration as
    a hook is, with the fields the planning reads of either."""

    name: str
    attr: str
    stock: str
    variant: str | None = None
    failure: StockFailure = field(default_factory=StockFailure)
    accelerate: str = "NO"
    exports: tuple[str, ...] = ()
    commlab_only = False  # PyTorch has both wrappers

    def module(self, commlab: bool) -> str:
        return self.variant if commlab and self.variant else self.stock
