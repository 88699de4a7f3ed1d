"""Every hook the lab runs, one row each: everything the rest of the lab asks about a hook.

PyTorch keeps one table of its hooks (``DDPCommHookType``); this is that table taken further.  A
row says where PyTorch's function lives and where commlab's variant does, when PyTorch's fails on
which backend and why (measured on torch 2.13), how the hook's state is built from the settings
table and so which settings it reads, whether a compress wrapper may wrap it, what its checkpoint
holds, whether PowerSGD's rule applies layer by layer, what its collectives are, and how
Accelerate names it.  The worker, validation, the exports, the what-if model, checkpoints, sweep
axes, labels, the forms and the CLI all read it; none of them compares hook names.

Adding a hook is one module (its function, and its state class if it has one) and one row here.

Pure: no torch.  Settings are named as ``RunConfig`` spells them (tests/test_hook_specs.py holds
every name to the settings table); modules by their dotted path, imported only when a hook is built.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from commlab.rules import Rule

TORCH_HOOKS = "torch.distributed.algorithms.ddp_comm_hooks"
OURS = "commlab.hooks"
BACKENDS = ("gloo", "nccl")

# Families, in the order the lab lists them.
PAGE = "PyTorch's DDP Communication Hooks page"
QUANTIZATION = "PyTorch's quantization hooks"
LOCAL_SGD = "PyTorch's post-local SGD"
COMPRESSOR = "the classic compressors (commlab's)"
SEMI_SYNC = "semi-synchronous training (DiLoCo)"
FAMILIES = (PAGE, QUANTIZATION, LOCAL_SGD, COMPRESSOR, SEMI_SYNC)

# What a hook's checkpoint holds (``HookSpec.checkpoint``).
NO_STATE = "none"  # nothing beyond the model and optimizer
WHOLE_STATE = "state"  # the state object, pickled whole (PowerSGD's, the compressors')
STEP_COUNTS = "steps"  # step counts only: the state holds process groups, which do not pickle

ALLREDUCE, ALLGATHER = "allreduce", "allgather"  # what a hook's messages go through
# What DiLoCo's outer collective sends the pseudo-gradient in, and the collective it goes by:
# int8 codes travel by allgather (a sum of int8 codes overflows in an allreduce), with one float32
# scale a parameter tensor, and are averaged in float32 on every rank.
OUTER_PRECISIONS = {"fp32": ALLREDUCE, "bf16": ALLREDUCE, "fp16": ALLREDUCE, "int8": ALLGATHER}


@dataclass(frozen=True)
class Build:
    """An object a hook needs, made from the settings: ``attr`` called with the process group
    first (``process_group=``, as a keyword, when ``group_keyword``), then, when ``subgroup``,
    subgroups of ``localsgd_subgroup_size`` ranks, then the keywords ``settings`` names
    ({keyword: setting}).  ``module`` None: the module of the hook's implementation that runs
    (PyTorch's or commlab's: each holds its own state class).

    The exports write the same call as source text, leaving out the keywords whose value is
    ``defaults``' (the class's own) unless ``always`` names them."""

    attr: str
    settings: Mapping[str, str] = field(default_factory=dict)
    module: str | None = None
    subgroup: bool = False
    group_keyword: bool = False
    defaults: Mapping[str, Any] = field(default_factory=dict)
    always: tuple[str, ...] = ()

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


@dataclass(frozen=True)
class HookSpec:
    """One hook.  See the module's docstring; each field's comment says who asks it."""

    name: str  # commlab's name of it: the value of the `hook` setting
    family: str  # one of FAMILIES
    attr: str  # its function, spelled alike in PyTorch's module and in commlab.hooks
    stock: str | None  # PyTorch's module; None: PyTorch has no such hook
    variant: str | None = None  # commlab's module with a variant of the same name; None: PyTorch's is safe
    fails: Mapping[str, str] = field(default_factory=dict)  # backend -> why PyTorch's fails there
    one_bucket_works: tuple[str, ...] = ()  # backends where a single bucket avoids that failure
    fails_at_compression: bool = False  # PyTorch's fails when compression starts, not at once
    note: str = ""  # what the reason for PyTorch's adds (how commlab builds its state)
    state: Build | None = None  # None: the hook takes the process group as its state
    averager: Build | None = None  # run after every optimizer step (post-local SGD's); the state's own Build: the state is it
    period: str | None = None  # the setting naming the steps from one model averaging to the next
    averaging_from: str | None = None  # the setting naming the step model averaging starts at; None: 0
    averaging_precision: str | None = None  # the setting naming what the averaging sends (OUTER_PRECISIONS); None: the parameters as they are
    bound: Mapping[str, str] = field(default_factory=dict)  # keyword -> setting, bound after (state, bucket)
    blocking: str | None = None  # commlab's variant that waits in the hook, run with `overlap` off
    wrap_refusal: str | None = None  # why no compress wrapper may wrap it; None: one may
    checkpoint: str = NO_STATE  # NO_STATE, WHOLE_STATE or STEP_COUNTS
    checkpoint_why: str = ""  # how its state survives a checkpoint, in the exports' words
    keeps: tuple[str, ...] = ()  # the state's fields that change as it runs: what a lab checkpoint holds
    not_resumable: str | None = None  # why a run of it cannot be continued from its checkpoint
    layerwise: bool = False  # compresses layer by layer by PowerSGD's rule (layers.json applies)
    pitfalls: bool = False  # PowerSGD's memories are watched for its pitfalls (commlab.hooks.pitfalls)
    starts: str | None = None  # the setting naming the step it starts at: plain allreduce before
    collective: str = ALLREDUCE  # what its messages go through, for the what-if model
    sends_nothing: bool = False  # noop: gradients are never averaged
    accelerate: str | None = None  # its member of Accelerate's DDPCommunicationHookType
    short_names: Mapping[str, str] = field(default_factory=dict)  # setting -> its name in labels
    named_when_changed: tuple[str, ...] = ()  # settings a label names only off their default
    rules: tuple[Rule, ...] = ()  # rules between settings of its own
    exports: tuple[str, ...] = ()  # more names commlab.hooks offers for it (its state class)
    definition: Definition | None = None  # what it sends against its paper and GRACE (the compressors')

    @property
    def commlab_only(self) -> bool:
        return self.stock is None

    @property
    def wrappable(self) -> bool:
        return self.wrap_refusal is None

    @property
    def averages_parameters(self) -> bool:
        return self.averager is not None

    @property
    def outer_loop(self) -> bool:
        """Whether its state is its averager (DiLoCo's outer optimizer): one object, built once."""
        return self.averager is not None and self.averager == self.state

    @property
    def subgroup(self) -> bool:
        """Whether its collectives span subgroups of ``localsgd_subgroup_size`` ranks."""
        return self.state is not None and self.state.subgroup

    def reads(self) -> tuple[str, ...]:
        """Every setting building and running it reads, declared (the wrapper where one may wrap it)."""
        names = [*(("wrapper",) if self.wrappable else ()),
                 *(self.state.reads() if self.state else ()), *(self.averager.reads() if self.averager else ()),
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
    fails: Mapping[str, str] = field(default_factory=dict)
    accelerate: str = "NO"
    one_bucket_works: tuple[str, ...] = ()
    fails_at_compression: bool = False
    exports: tuple[str, ...] = ()
    commlab_only = False  # PyTorch has both wrappers

    def module(self, commlab: bool) -> str:
        return self.variant if commlab and self.variant else self.stock


# ---------------------------------------------------------------------------- measured failures
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
_LOCALSGD_NOTE = ("; commlab passes it subgroups made with dist.new_subgroups(group_size=localsgd_subgroup_size): "
                  "PostLocalSGDState(subgroup=None) makes one subgroup per machine on the first local step, which "
                  "raises ValueError without CUDA (measured on Gloo) and would hold every rank of one machine")
_OWN_WIRE_FORMAT = ("it chooses its own wire format (uint8 codes, packed signs or indices), so a cast "
                    "before it only loses precision")


def _everywhere(why: str) -> dict[str, str]:
    return dict.fromkeys(BACKENDS, why)


# ---------------------------------------------------------------------------- rules of their own
POWERSGD_SETTINGS = ("matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate",
                     "use_error_feedback", "warm_start", "orthogonalization_epsilon", "random_seed",
                     "batch_tensors_with_same_shape")  # PowerSGDState's arguments, in its order
_START_AFTER_REBUILD = Rule(
    "start_powerSGD_iter", ("hook", "start_powerSGD_iter", "use_error_feedback", "warm_start"),
    lambda c: c.start_powerSGD_iter < 2 and (c.use_error_feedback or c.warm_start),
    lambda c: (f"must be at least 2 while use_error_feedback or warm_start is on, got "
               f"{c.start_powerSGD_iter}: DDP rebuilds its buckets after the first iteration, which "
               "conflicts with any tensor memorized before the rebuild (turn both off to start earlier)"))
_SUBGROUPS_DIVIDE = Rule(
    "localsgd_subgroup_size", ("hook", "localsgd_subgroup_size", "world_size"),
    lambda c: c.world_size % c.localsgd_subgroup_size != 0,
    lambda c: (f"must divide the number of ranks ({c.world_size}), got {c.localsgd_subgroup_size}: "
               "dist.new_subgroups cuts the ranks into subgroups of equal size"))

_NESTEROV_NEEDS_MOMENTUM = Rule(
    "outer_nesterov", ("hook", "outer_nesterov", "outer_momentum"),
    lambda c: c.outer_nesterov and c.outer_momentum == 0,
    lambda c: ("needs outer_momentum above 0, got 0: torch.optim.SGD refuses Nesterov momentum "
               "without momentum (turn outer_nesterov off for plain outer SGD)"))

# PowerSGDState's own defaults (torch 2.13); tests/test_export.py holds them to its signature.
TORCH_POWERSGD_DEFAULTS = {
    "matrix_approximation_rank": 1, "start_powerSGD_iter": 1000, "min_compression_rate": 2,
    "use_error_feedback": True, "warm_start": True, "orthogonalization_epsilon": 0,
    "random_seed": 0, "batch_tensors_with_same_shape": False,
}
_POWERSGD_STATE = Build("PowerSGDState", {s: s for s in POWERSGD_SETTINGS},
                        defaults=TORCH_POWERSGD_DEFAULTS,
                        always=("matrix_approximation_rank", "start_powerSGD_iter"))  # what a sweep tunes
# PowerSGDState's fields that change as it runs (the rest are its settings), its random generator last.
_POWERSGD_KEEPS = ("iter", "error_dict", "p_memory_dict", "q_memory_dict", "total_numel_before_compression",
                   "total_numel_after_compression", "next_stats_report", "rng")
_POWERSGD = dict(family=PAGE, stock=f"{TORCH_HOOKS}.powerSGD_hook", variant=f"{OURS}.powersgd",
                 keeps=_POWERSGD_KEEPS,
                 state=_POWERSGD_STATE, checkpoint=WHOLE_STATE,
                 checkpoint_why=("PowerSGDState pickles without its process group and joins the default "
                                 "group when loaded (PyTorch's \"Checkpointing of Communication Hooks\")."),
                 pitfalls=True, starts="start_powerSGD_iter", rules=(_START_AFTER_REBUILD,),
                 short_names={"matrix_approximation_rank": "r", "start_powerSGD_iter": "start",
                              "min_compression_rate": "rate"},
                 named_when_changed=("min_compression_rate",), exports=("PowerSGDState",))


def _compressor(name: str, state: str, definition: Definition, settings: Mapping[str, str] | None = None,
                collective: str = ALLGATHER, keeps: tuple[str, ...] = ()) -> HookSpec:
    """One of the classic compressors: commlab's alone, its state seeded with the run's seed."""
    return HookSpec(name, COMPRESSOR, f"{name}_hook", None, f"{OURS}.compressors", definition=definition,
                    keeps=("iter", "error_dict", "momentum_dict", "generator", *keeps),
                    state=Build(state, {**(settings or {}), "random_seed": "seed"}),
                    wrap_refusal=_OWN_WIRE_FORMAT, checkpoint=WHOLE_STATE, collective=collective,
                    checkpoint_why=("the state, built with process_group=None, pickles whole: each "
                                    "bucket's error feedback and momentum, its step and its random "
                                    "generators."),
                    exports=(state,))


# ---------------------------------------------------------------------------- the compressors' definitions
# r = compress_ratio, n = the bucket's elements, N = ranks.  GRACE is read at commit fd3a7f4.
_K = "k = max(1, ceil(r·n))"
_TOPK = Definition(
    sends=(f"each rank sends the {_K} entries of largest |x_i| of its bucket (k float32 values and k "
           "int32 indices, by allgather); the result is the mean of the ranks' sparse vectors; with "
           "sparse_error_feedback what was not sent is added to the next step's bucket (e ← x + e − sent)."),
    paper=("Stich et al. 2018 (sparsified SGD with memory): the same, error feedback on; here per DDP "
           "bucket."),
    grace=("k = max(1, int(r·n)), rounded down: one entry fewer whenever r·n is not whole; per tensor; "
           "error feedback is a memory chosen apart (its residual memory). Otherwise bit for bit equal."),
    choice=("k rounded up, so that a small bucket at a small ratio still sends its share; error "
            "feedback on by default, as in the paper."))
_RANDOMK = Definition(
    sends=(f"{_K} entries drawn without replacement from a generator every rank seeds alike (the same "
           "entries on every rank), their values scaled by n/k and summed by one allreduce of k float32 "
           "values, then divided by N: unbiased, E[result] = the mean gradient. No error feedback."),
    paper=("Stich et al. 2018 use random-k with memory and without scaling; the n/k scaling is the "
           "unbiased sparsification of Wangni et al. 2018 at uniform probabilities k/n."),
    grace=("no n/k scaling: the values are sent as they are, so its mean is k/n of the gradient (biased, "
           "unless its residual memory is chosen); k = max(1, int(r·n)), rounded down; its indices come "
           "from torch.manual_seed(the tensor name's bytes summed + a step count), which reseeds torch's "
           "global generator."),
    choice=("the unbiased n/k scaling without memory: random-k as the unbiased counterpart of top-k with "
            "memory; k rounded up as top-k's; the lab's own generator, torch's global one untouched."))
_THRESHOLD = Definition(
    sends=("every entry with |x_i| > τ (τ = sparsify_threshold), as float32 values and int32 indices; "
           "their number varies per rank and step, so the counts are allgathered first; with "
           "sparse_error_feedback what was not sent carries over to the next step."),
    paper=("Strom 2015 sends ±τ for each entry over the threshold (its sign and index) and keeps the "
           "remainder in the residual; the lab sends the entries' values."),
    grace="the same (|x_i| > τ, values and indices; memory chosen apart): bit for bit equal.",
    choice=("the values, as GRACE has them: 32 bits an entry more than Strom's ±τ, and no quantization "
            "error on what is sent."))
_DGC = Definition(
    sends=("per bucket: local clipping to dgc_clip_norm·N^(-1/2) of its L2 norm (0 = off), momentum "
           "correction u ← m·u + g, v ← v + u (m = compressor_momentum), the exact top-k of |v| "
           f"({_K}) sent as values and indices by allgather, then momentum factor masking: the sent "
           "entries of u and v are zeroed."),
    paper=("Lin et al. 2018: the same momentum correction, factor masking and local clipping; the paper "
           "estimates the top-k threshold from a 0.1% to 1% sample and warms the sparsity up over the "
           "first epochs (no warm-up here)."),
    grace=("a threshold estimated from a random 1% sample (the smallest of its top r share of "
           "magnitudes), moved ×1.3 or ×0.7 up to ten times toward 0.7k–1.3k entries: the count varies per rank and step, not always within "
           "that (0 to 110 entries for k = 10 in 20 steps of 1,000 entries, measured); its clipping "
           "(off by default) clamps each entry to the root mean square over ranks of the tensor's norm, "
           "with an extra allreduce. With the exact k-th magnitude as its threshold, bit for bit equal."),
    choice=("the exact top-k: the same k on every rank and step, so the allgather's size is fixed and "
            "the ratio exact, at the price of a full top-k on each bucket."))
_QSGD = Definition(
    sends=("the bucket's L2 norm ‖x‖ and, per entry, sign(x_i)·ξ_i, ξ_i the stochastic rounding of "
           "|x_i|/‖x‖·s to a neighbouring whole number (s = qsgd_levels), as codes of 2, 4 or 8 bits "
           "(the fewest that hold 2s+1 codes), by allgather; decoded ‖x‖·sign(x_i)·ξ_i/s: unbiased."),
    paper=("Alistarh et al. 2017: the same quantizer; the paper Elias-codes the levels and normalizes "
           "buckets of d entries (512 in its experiments); the lab a whole DDP bucket, whose larger norm "
           "gives a larger variance."),
    grace=("the same quantizer, multiplied in another order, s/‖x‖·|x_i|: the scaled value differs in its "
           "last bit, so a draw falling between the two would round apart (none did on the same draws: "
           "60,000 entries in the suite, 10,000,000 at s = 7 and at s = 127 measured); codes as int8, 8 bits an entry whatever s; its default s is 127 (the lab's 7)."),
    choice="codes packed to the fewest bits that hold them; the norm of the whole bucket as its scale.")
_TERNGRAD = Definition(
    sends=("the bucket clipped to ±c·σ (c = terngrad_clip_sigmas, σ the standard deviation of its "
           "entries; 0 = no clipping), then s = max|x_i| and per entry sign(x_i)·b_i, b_i ~ "
           "Bernoulli(|x_i|/s), as 2-bit codes and s, by allgather; decoded s·sign(x_i)·b_i: unbiased "
           "for the clipped bucket."),
    paper=("Wen et al. 2017: the same ternarizing and clipping (c = 2.5); the paper ternarizes layer by "
           "layer and shares one scaler, the largest, across workers; the lab per DDP bucket, each rank "
           "its own scaler."),
    grace=("the same clipping at 2.5σ and ternarizing (bit for bit equal on the same draws), per tensor, "
           "codes as int8; a bucket with σ = 0 it clips to zero."),
    choice=("clipping on at 2.5σ by default, as in the paper (terngrad_clip_sigmas = 0 turns it off); a "
            "bucket with σ = 0 (constant, or of one entry) is not clipped, since clipping would zero it; "
            "2-bit codes."))
_NATURAL = Definition(
    sends=("each entry rounded at random to a neighbouring power of two keeping its sign: |x_i| in "
           "[2^e, 2^(e+1)) goes to 2^(e+1) with probability |x_i|/2^e − 1, else to 2^e; sent as bfloat16 "
           "(16 bits, a power of two is exact there) by allgather: unbiased."),
    paper="Horváth et al. 2019: the same rounding, 9 bits an entry (sign and 8-bit exponent); here 16.",
    grace=("the same rounding, drawn on the float's mantissa bits (bit for bit equal on the same draws), "
           "8 bits an entry (sign and 7 bits of exponent): magnitudes above 2^18 are sent as 2^18, those "
           "below 2^-108 as 0; it needs cupy and a GPU."),
    choice="bfloat16 on the wire: the whole exponent range of float32 at 16 bits, no bit packing of our own.")
_SIGNSGD = Definition(
    sends=("each rank sends sign(x_i) as 1 bit (x_i ≥ 0 is +1: a zero entry votes +1) by allgather; every "
           "rank takes the majority vote sign(Σ_ranks sign(x_i)), 0 on a tie (an even number of ranks); "
           "no scale: the optimizer's learning rate sets the step."),
    paper=("Bernstein et al. 2018/2019 (signSGD with majority vote): the same vote, which a parameter "
           "server broadcasts there and each rank counts here from the allgather."),
    grace="the same bits (bit for bit equal); its vote is +1 on a tie (Σ ≥ 0), the lab's 0.",
    choice="0 on a tie: an entry the ranks split on does not move.")
_SIGNUM = Definition(
    sends=("each rank keeps a momentum m ← β·m + (1−β)·g from m = 0 (β = compressor_momentum) and sends "
           "sign(m) as signSGD does (1 bit, m_i ≥ 0 is +1); the majority vote, 0 on a tie."),
    paper="Bernstein et al. 2018/2019 (Signum, majority vote on the momentum): the same.",
    grace=("its momentum starts at the first gradient (m = g, then (1−β)·g + β·m), the lab's at 0, so "
           "the signs part from the second step; +1 on a tie."),
    choice="the paper's momentum from 0; the optimizer should then be plain SGD without momentum.")
_EF_SIGNSGD = Definition(
    sends=("p = g + e (e what was not sent last step); each rank sends ‖p‖₁/n (one float) and sign(p) as "
           "1 bit (p_i ≥ 0 is +1) by allgather; e ← p − (‖p‖₁/n)·sign(p); the result is the mean of the "
           "ranks' decoded vectors."),
    paper=("Karimireddy et al. 2019 (EF-signSGD): p = γ·g + e, the learning rate γ inside the memory; "
           "the lab keeps it out (the optimizer applies it after), the same with plain SGD at a constant "
           "rate, not under a schedule, momentum or Adam; the paper has one worker."),
    grace=("the learning rate inside the memory as in the paper (p = e + lr·g, but p = g at a tensor's "
           "first step) and the ranks' sum divided by lr, not their mean: at lr = 1 N times the lab's "
           "result, bit for bit."),
    choice=("the learning rate out of the memory, so that the hook goes with any optimizer and schedule; "
            "the mean over ranks, as every hook returns."))
_ONEBIT = Definition(
    sends=("p = g + e; each rank sends 1 bit an entry (p_i ≥ 0) and two floats, the means of p's "
           "non-negative and of its negative entries, by allgather; each entry decodes to its side's "
           "mean; e ← p − decoded; the result is the mean of the ranks' decoded vectors."),
    paper=("Seide et al. 2014 (1-bit SGD): the same quantization with error feedback, its two "
           "reconstruction values per column of each weight matrix; here per DDP bucket."),
    grace="the same with its residual memory, per tensor: bit for bit equal.",
    choice="two floats per bucket, not per column: a DDP bucket has no columns.")

# DiLoCo's state is its averager too: its hook records the parameters the first outer step starts from.
_DILOCO = Build("DiLoCoState", {"sync_every": "sync_every", "outer_lr": "outer_lr",
                                "outer_momentum": "outer_momentum", "nesterov": "outer_nesterov",
                                "precision": "outer_precision"})

_SPARSE = {"compress_ratio": "compress_ratio", "use_error_feedback": "sparse_error_feedback"}

# ---------------------------------------------------------------------------- the table
SPECS: dict[str, HookSpec] = {s.name: s for s in (
    # PyTorch's "DDP Communication Hooks" page
    HookSpec("allreduce", PAGE, "allreduce_hook", f"{TORCH_HOOKS}.default_hooks", accelerate="NO"),
    HookSpec("fp16", PAGE, "fp16_compress_hook", f"{TORCH_HOOKS}.default_hooks", accelerate="FP16"),
    HookSpec("bf16", PAGE, "bf16_compress_hook", f"{TORCH_HOOKS}.default_hooks", f"{OURS}.compress",
             fails={"gloo": _BF16_REFUSED.format(name="bf16_compress_hook")}, accelerate="BF16"),
    HookSpec("powersgd", attr="powerSGD_hook", blocking="blocking_powerSGD_hook", fails={"gloo": _POWERSGD_GLOO},
             one_bucket_works=("gloo",), layerwise=True, accelerate="POWER_SGD", **_POWERSGD),
    HookSpec("batched_powersgd", attr="batched_powerSGD_hook", blocking="blocking_batched_powerSGD_hook",
             fails=_everywhere(_BATCHED_BROKEN),
             fails_at_compression=True, accelerate="BATCHED_POWER_SGD", **_POWERSGD),
    HookSpec("noop", PAGE, "noop_hook", f"{TORCH_HOOKS}.debugging_hooks", sends_nothing=True,
             wrap_refusal="noop sends nothing, so there is nothing to compress"),
    # PyTorch's other algorithms: quantization by allgather, post-local SGD
    HookSpec("quantize_pertensor", QUANTIZATION, "quantization_pertensor_hook",
             f"{TORCH_HOOKS}.quantization_hooks", f"{OURS}.quantization",
             fails=_everywhere(_QUANTIZATION_BROKEN.format(name="quantization_pertensor_hook",
                                                          error="IndexError")),
             wrap_refusal=_OWN_WIRE_FORMAT, collective=ALLGATHER),
    HookSpec("quantize_perchannel", QUANTIZATION, "quantization_perchannel_hook",
             f"{TORCH_HOOKS}.quantization_hooks", f"{OURS}.quantization",
             fails=_everywhere(_QUANTIZATION_BROKEN.format(name="quantization_perchannel_hook",
                                                          error="no step completed within 60 s")),
             bound={"bucket_size": "quantization_bucket_size"}, wrap_refusal=_OWN_WIRE_FORMAT,
             collective=ALLGATHER),
    HookSpec("post_localsgd", LOCAL_SGD, "post_localSGD_hook", f"{TORCH_HOOKS}.post_localSGD_hook",
             note=_LOCALSGD_NOTE,
             state=Build("PostLocalSGDState", {"start_localSGD_iter": "start_localSGD_iter",
                                               "post_local_gradient_allreduce": "post_local_gradient_allreduce"},
                         subgroup=True),
             averager=Build("PeriodicModelAverager", {"period": "averager_period",
                                                      "warmup_steps": "averager_warmup_steps"},
                            module="torch.distributed.algorithms.model_averaging.averagers",
                            group_keyword=True),
             period="averager_period", averaging_from="averager_warmup_steps",
             checkpoint=STEP_COUNTS, starts="start_localSGD_iter",
             not_resumable=("the checkpoint holds no PostLocalSGDState iteration or averager step, so the "
                            "resumed run would start local SGD over"),
             rules=(_SUBGROUPS_DIVIDE,)),
    # The classic compressors: commlab's alone (commlab.hooks.compressors)
    _compressor("topk", "TopKState", _TOPK, _SPARSE),
    _compressor("randomk", "RandomKState", _RANDOMK, {"compress_ratio": "compress_ratio"}, collective=ALLREDUCE,
                keeps=("shared_generator",)),
    _compressor("qsgd", "QSGDState", _QSGD, {"levels": "qsgd_levels"}),
    _compressor("terngrad", "TernGradState", _TERNGRAD, {"clip_sigmas": "terngrad_clip_sigmas"}),
    _compressor("signsgd", "SignSGDState", _SIGNSGD),
    _compressor("ef_signsgd", "EFSignSGDState", _EF_SIGNSGD),
    _compressor("onebit", "OneBitState", _ONEBIT),
    _compressor("threshold", "ThresholdState", _THRESHOLD, {"threshold": "sparsify_threshold",
                                                            "use_error_feedback": "sparse_error_feedback"}),
    _compressor("dgc", "DGCState", _DGC, {"compress_ratio": "compress_ratio", "momentum": "compressor_momentum",
                                          "clip_norm": "dgc_clip_norm"}),
    _compressor("natural", "NaturalState", _NATURAL),
    _compressor("signum", "SignumState", _SIGNUM, {"momentum": "compressor_momentum"}),
    # The field's newer algorithms: commlab's alone (commlab.hooks.diloco)
    HookSpec("diloco", SEMI_SYNC, "diloco_hook", None, f"{OURS}.diloco", state=_DILOCO, averager=_DILOCO,
             period="sync_every", averaging_precision="outer_precision",
             wrap_refusal=("it averages no gradients (each replica steps with its own); its outer "
                           "collective sends the pseudo-gradient in outer_precision"),
             checkpoint_why=("DiLoCoState (the parameters at the last sync, the outer SGD's momentum) "
                             "is not saved by these lines: save the model at a sync step, where it is "
                             "the last sync's parameters, and the outer momentum starts again from zero "
                             "when resumed."),
             not_resumable=("the checkpoint holds the model and the inner optimizer, not the outer "
                            "optimizer's momentum nor the parameters at the last sync, so the resumed "
                            "run would start the outer optimization over"),
             short_names={"sync_every": "H", "outer_lr": "outer_lr", "outer_momentum": "mom",
                          "outer_nesterov": "nesterov", "outer_precision": "outer"},
             named_when_changed=("outer_momentum", "outer_nesterov"), rules=(_NESTEROV_NEEDS_MOMENTUM,),
             exports=("DiLoCoState",)),
)}

WRAPPER_SPECS: dict[str, WrapperSpec] = {w.name: w for w in (
    WrapperSpec("fp16", "fp16_compress_wrapper", f"{TORCH_HOOKS}.default_hooks", accelerate="FP16"),
    WrapperSpec("bf16", "bf16_compress_wrapper", f"{TORCH_HOOKS}.default_hooks", f"{OURS}.compress",
                fails={"gloo": _BF16_REFUSED.format(name="bf16_compress_wrapper")}, accelerate="BF16"),
)}

HOOKS = tuple(SPECS)
WRAPPERS = ("none", *WRAPPER_SPECS)
BASELINE = "allreduce"  # DDP's own behaviour: the default baseline (commlab.tune.baseline has the others)


def hooks_of(family: str) -> tuple[str, ...]:
    """The hooks of one of ``FAMILIES``, in the table's order."""
    return tuple(h for h, s in SPECS.items() if s.family == family)


def spec(hook: str) -> HookSpec:
    """The row of ``hook``; KeyError naming the known hooks for any other name."""
    try:
        return SPECS[hook]
    except (KeyError, TypeError):
        raise KeyError(f"unknown hook {hook!r}; hooks are: {', '.join(HOOKS)}") from None


def spec_of(cfg: Mapping[str, Any]) -> HookSpec | None:
    """The row of a stored config's hook; None for a config of a hook this lab no longer has."""
    return SPECS.get(cfg.get("hook"))
