"""Every hook the lab runs, one row each: everything the rest of the lab asks about a hook.

PyTorch keeps one table of its hooks (``DDPCommHookType``); this is that table taken further.  A
row (``commlab.hook_row.HookSpec``) says where PyTorch's function lives and where commlab's variant
does, how the hook's state is built from the settings table and so which settings it reads, what it
is (its capabilities: it gathers, it sends nothing, it compresses by PowerSGD's layer rule...), and,
where a hook has them, its records: where PyTorch's fails on which backend and why (measured on
torch 2.13), how it averages the model, what its checkpoint holds, how a run's label names its
settings, what a compressor sends (the words in ``commlab.hook_definitions``).  The worker,
validation, the exports, the what-if model, checkpoints, sweep axes, labels, the forms and the CLI
all read it; none of them compares hook names.

Adding a hook is one module (its function, and its state class if it has one) and one row here,
every row one ``HookSpec(...)``.

Pure: no torch.  Settings are named as ``RunConfig`` spells them (tests/test_hook_specs.py holds
every name to the settings table); modules by their dotted path, imported only when a hook is built.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from commlab import hook_definitions as defined
from commlab.hook_row import (
    ALLGATHER,
    ALLREDUCE,
    STEP_COUNTS,
    WHOLE_STATE,
    Averaging,
    Build,
    Capability,
    Checkpointing,
    HookSpec,
    Label,
    StockFailure,
    WrapperSpec,
)
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

# What DiLoCo's outer collective sends the pseudo-gradient in, and the collective it goes by:
# int8 codes travel by allgather (a sum of int8 codes overflows in an allreduce), with one float32
# scale a parameter tensor, and are averaged in float32 on every rank.
OUTER_PRECISIONS = {"fp32": ALLREDUCE, "bf16": ALLREDUCE, "fp16": ALLREDUCE, "int8": ALLGATHER}


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

# ---------------------------------------------------------------------------- records rows share
_POWERSGD_STOCK = f"{TORCH_HOOKS}.powerSGD_hook"
_POWERSGD_VARIANT = f"{OURS}.powersgd"
_POWERSGD_STATE = Build("PowerSGDState", {s: s for s in POWERSGD_SETTINGS}, defaults=TORCH_POWERSGD_DEFAULTS,
                        always=("matrix_approximation_rank", "start_powerSGD_iter"),  # what a sweep tunes
                        starts="start_powerSGD_iter")
_POWERSGD_CHECKPOINT = Checkpointing(
    WHOLE_STATE, why=("PowerSGDState pickles without its process group and joins the default group when "
                      "loaded (PyTorch's \"Checkpointing of Communication Hooks\")."),
    # its fields that change as it runs (the rest are its settings), its random generator last
    keeps=("iter", "error_dict", "p_memory_dict", "q_memory_dict", "total_numel_before_compression",
           "total_numel_after_compression", "next_stats_report", "rng"))
_POWERSGD_LABEL = Label({"matrix_approximation_rank": "r", "start_powerSGD_iter": "start",
                         "min_compression_rate": "rate"}, named_when_changed=("min_compression_rate",))
_POWERSGD_IS = frozenset({Capability.LOW_RANK_MEMORIES, Capability.BLOCKING_TWIN})

_COMPRESSORS = f"{OURS}.compressors"
_COMPRESSOR_KEEPS = ("iter", "error_dict", "momentum_dict", "generator")
_COMPRESSOR_WHY = ("the state, built with process_group=None, pickles whole: each bucket's error feedback "
                   "and momentum, its step and its random generators.")
_COMPRESSOR_CHECKPOINT = Checkpointing(WHOLE_STATE, why=_COMPRESSOR_WHY, keeps=_COMPRESSOR_KEEPS)
_GATHERS_CODES = frozenset({Capability.GATHERS, Capability.OWN_WIRE_FORMAT})
_SPARSE = {"compress_ratio": "compress_ratio", "use_error_feedback": "sparse_error_feedback"}


def _seeded(state: str, settings: Mapping[str, str] | None = None) -> Build:
    """A compressor's state: its own settings, and the run's seed for its random generators."""
    return Build(state, {**(settings or {}), "random_seed": "seed"})


# DiLoCo's state is its own averager: its hook records the parameters the first outer step starts from.
_DILOCO = Build("DiLoCoState", {"sync_every": "sync_every", "outer_lr": "outer_lr",
                                "outer_momentum": "outer_momentum", "nesterov": "outer_nesterov",
                                "precision": "outer_precision"})

# ---------------------------------------------------------------------------- the table
SPECS: dict[str, HookSpec] = {s.name: s for s in (
    # PyTorch's "DDP Communication Hooks" page
    HookSpec("allreduce", PAGE, "allreduce_hook", f"{TORCH_HOOKS}.default_hooks", accelerate="NO"),
    HookSpec("fp16", PAGE, "fp16_compress_hook", f"{TORCH_HOOKS}.default_hooks", accelerate="FP16"),
    HookSpec("bf16", PAGE, "bf16_compress_hook", f"{TORCH_HOOKS}.default_hooks", f"{OURS}.compress",
             failure=StockFailure({"gloo": _BF16_REFUSED.format(name="bf16_compress_hook")}), accelerate="BF16"),
    HookSpec("powersgd", PAGE, "powerSGD_hook", _POWERSGD_STOCK, _POWERSGD_VARIANT, state=_POWERSGD_STATE,
             capabilities=_POWERSGD_IS | {Capability.LAYER_RULE},
             failure=StockFailure({"gloo": _POWERSGD_GLOO}, one_bucket_works=("gloo",)),
             checkpoint=_POWERSGD_CHECKPOINT, label=_POWERSGD_LABEL, accelerate="POWER_SGD",
             rules=(_START_AFTER_REBUILD,), exports=("PowerSGDState",)),
    HookSpec("batched_powersgd", PAGE, "batched_powerSGD_hook", _POWERSGD_STOCK, _POWERSGD_VARIANT,
             state=_POWERSGD_STATE, capabilities=_POWERSGD_IS,
             failure=StockFailure(_everywhere(_BATCHED_BROKEN), fails_at_compression=True),
             checkpoint=_POWERSGD_CHECKPOINT, label=_POWERSGD_LABEL, accelerate="BATCHED_POWER_SGD",
             rules=(_START_AFTER_REBUILD,), exports=("PowerSGDState",)),
    HookSpec("noop", PAGE, "noop_hook", f"{TORCH_HOOKS}.debugging_hooks",
             capabilities=frozenset({Capability.SENDS_NOTHING})),
    # PyTorch's other algorithms: quantization by allgather, post-local SGD
    HookSpec("quantize_pertensor", QUANTIZATION, "quantization_pertensor_hook",
             f"{TORCH_HOOKS}.quantization_hooks", f"{OURS}.quantization", capabilities=_GATHERS_CODES,
             failure=StockFailure(_everywhere(_QUANTIZATION_BROKEN.format(
                 name="quantization_pertensor_hook", error="IndexError")))),
    HookSpec("quantize_perchannel", QUANTIZATION, "quantization_perchannel_hook",
             f"{TORCH_HOOKS}.quantization_hooks", f"{OURS}.quantization",
             bound={"bucket_size": "quantization_bucket_size"}, capabilities=_GATHERS_CODES,
             failure=StockFailure(_everywhere(_QUANTIZATION_BROKEN.format(
                 name="quantization_perchannel_hook", error="no step completed within 60 s")))),
    HookSpec("post_localsgd", LOCAL_SGD, "post_localSGD_hook", f"{TORCH_HOOKS}.post_localSGD_hook",
             state=Build("PostLocalSGDState", {"start_localSGD_iter": "start_localSGD_iter",
                                               "post_local_gradient_allreduce": "post_local_gradient_allreduce"},
                         subgroup=True, starts="start_localSGD_iter"),
             failure=StockFailure(note=_LOCALSGD_NOTE),
             averaging=Averaging("averager_period", first_step="averager_warmup_steps", averager=Build(
                 "PeriodicModelAverager", {"period": "averager_period", "warmup_steps": "averager_warmup_steps"},
                 module="torch.distributed.algorithms.model_averaging.averagers", group_keyword=True)),
             checkpoint=Checkpointing(STEP_COUNTS, not_resumable=(
                 "the checkpoint holds no PostLocalSGDState iteration or averager step, so the resumed run "
                 "would start local SGD over")),
             rules=(_SUBGROUPS_DIVIDE,)),
    # The classic compressors: commlab's alone (commlab.hooks.compressors)
    HookSpec("topk", COMPRESSOR, "topk_hook", None, _COMPRESSORS, state=_seeded("TopKState", _SPARSE),
             capabilities=_GATHERS_CODES, checkpoint=_COMPRESSOR_CHECKPOINT, exports=("TopKState",),
             definition=defined.TOPK),
    HookSpec("randomk", COMPRESSOR, "randomk_hook", None, _COMPRESSORS,
             state=_seeded("RandomKState", {"compress_ratio": "compress_ratio"}),
             capabilities=frozenset({Capability.OWN_WIRE_FORMAT}),  # the same entries on every rank: summed
             checkpoint=Checkpointing(WHOLE_STATE, why=_COMPRESSOR_WHY,
                                      keeps=(*_COMPRESSOR_KEEPS, "shared_generator")),
             exports=("RandomKState",), definition=defined.RANDOMK),
    HookSpec("qsgd", COMPRESSOR, "qsgd_hook", None, _COMPRESSORS, state=_seeded("QSGDState", {"levels": "qsgd_levels"}),
             capabilities=_GATHERS_CODES, checkpoint=_COMPRESSOR_CHECKPOINT, exports=("QSGDState",),
             definition=defined.QSGD),
    HookSpec("terngrad", COMPRESSOR, "terngrad_hook", None, _COMPRESSORS,
             state=_seeded("TernGradState", {"clip_sigmas": "terngrad_clip_sigmas"}),
             capabilities=_GATHERS_CODES, checkpoint=_COMPRESSOR_CHECKPOINT, exports=("TernGradState",),
             definition=defined.TERNGRAD),
    HookSpec("signsgd", COMPRESSOR, "signsgd_hook", None, _COMPRESSORS, state=_seeded("SignSGDState"),
             capabilities=_GATHERS_CODES, checkpoint=_COMPRESSOR_CHECKPOINT, exports=("SignSGDState",),
             definition=defined.SIGNSGD),
    HookSpec("ef_signsgd", COMPRESSOR, "ef_signsgd_hook", None, _COMPRESSORS, state=_seeded("EFSignSGDState"),
             capabilities=_GATHERS_CODES, checkpoint=_COMPRESSOR_CHECKPOINT, exports=("EFSignSGDState",),
             definition=defined.EF_SIGNSGD),
    HookSpec("onebit", COMPRESSOR, "onebit_hook", None, _COMPRESSORS, state=_seeded("OneBitState"),
             capabilities=_GATHERS_CODES, checkpoint=_COMPRESSOR_CHECKPOINT, exports=("OneBitState",),
             definition=defined.ONEBIT),
    HookSpec("threshold", COMPRESSOR, "threshold_hook", None, _COMPRESSORS,
             state=_seeded("ThresholdState", {"threshold": "sparsify_threshold",
                                              "use_error_feedback": "sparse_error_feedback"}),
             capabilities=_GATHERS_CODES, checkpoint=_COMPRESSOR_CHECKPOINT, exports=("ThresholdState",),
             definition=defined.THRESHOLD),
    HookSpec("dgc", COMPRESSOR, "dgc_hook", None, _COMPRESSORS,
             state=_seeded("DGCState", {"compress_ratio": "compress_ratio", "momentum": "compressor_momentum",
                                        "clip_norm": "dgc_clip_norm"}),
             capabilities=_GATHERS_CODES, checkpoint=_COMPRESSOR_CHECKPOINT, exports=("DGCState",),
             definition=defined.DGC),
    HookSpec("natural", COMPRESSOR, "natural_hook", None, _COMPRESSORS, state=_seeded("NaturalState"),
             capabilities=_GATHERS_CODES, checkpoint=_COMPRESSOR_CHECKPOINT, exports=("NaturalState",),
             definition=defined.NATURAL),
    HookSpec("signum", COMPRESSOR, "signum_hook", None, _COMPRESSORS,
             state=_seeded("SignumState", {"momentum": "compressor_momentum"}),
             capabilities=_GATHERS_CODES, checkpoint=_COMPRESSOR_CHECKPOINT, exports=("SignumState",),
             definition=defined.SIGNUM),
    # The field's newer algorithms: commlab's alone (commlab.hooks.diloco)
    HookSpec("diloco", SEMI_SYNC, "diloco_hook", None, f"{OURS}.diloco", state=_DILOCO,
             capabilities=frozenset({Capability.STEPS_ON_OWN_GRADIENTS}),
             averaging=Averaging("sync_every", precision="outer_precision"),
             checkpoint=Checkpointing(
                 why=("DiLoCoState (the parameters at the last sync, the outer SGD's momentum) is not saved "
                      "by these lines: save the model at a sync step, where it is the last sync's parameters, "
                      "and the outer momentum starts again from zero when resumed."),
                 not_resumable=("the checkpoint holds the model and the inner optimizer, not the outer "
                                "optimizer's momentum nor the parameters at the last sync, so the resumed "
                                "run would start the outer optimization over")),
             label=Label({"sync_every": "H", "outer_lr": "outer_lr", "outer_momentum": "mom",
                          "outer_nesterov": "nesterov", "outer_precision": "outer"},
                         named_when_changed=("outer_momentum", "outer_nesterov")),
             rules=(_NESTEROV_NEEDS_MOMENTUM,), exports=("DiLoCoState",)),
)}

WRAPPER_SPECS: dict[str, WrapperSpec] = {w.name: w for w in (
    WrapperSpec("fp16", "fp16_compress_wrapper", f"{TORCH_HOOKS}.default_hooks", accelerate="FP16"),
    WrapperSpec("bf16", "bf16_compress_wrapper", f"{TORCH_HOOKS}.default_hooks", f"{OURS}.compress",
                failure=StockFailure({"gloo": _BF16_REFUSED.format(name="bf16_compress_wrapper")}),
                accelerate="BF16"),
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
