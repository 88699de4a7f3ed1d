"""One run's configuration: a dataclass that validates with messages a person can act on, and
the one settings table.

Each field carries, beside its default, its help, its allowed values, its group and where else it
shows (dataclass field metadata, as torchtitan's config dataclasses carry theirs); ``settings()``
reads the table back.  The CLI flags, the Launch form, the sweep's axes and the Export page are
generated from it, so a new setting is written here once.  Settings are spelled as PyTorch spells
them where PyTorch has a name (``PowerSGDState``'s arguments keep their exact spelling,
``start_powerSGD_iter`` included).  Files are JSON or TOML (``commlab.config_files``);
unknown keys are refused, as Accelerate's config classes refuse them.

A run's label and the settings that apply to a hook read the table back, so they live beside it;
a setting's declaration and the reading of a value are ``commlab.config_fields``, the rules between
settings ``commlab.config_checks``.  Their public names are importable from here as well.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commlab import config_files
from commlab.config_checks import RULES, field_errors, runs_dir_error
from commlab.config_fields import (
    BACKENDS,
    DEFAULT_TRACE_STEPS,
    GROUPS,
    IMPLS,
    MAX_STEPS,
    MAX_TRACED_STEPS,
    OPTIMIZERS,
    REDUCE_DTYPES,
    RESOLVED_BACKENDS,
    SHARDINGS,
    SHOWN_CHARS,
    Bounds,
    ConfigError,
    coerce,
    default_runs_dir,
    is_plain_allreduce,
    kind_of,
    link_label,
    link_of,
    setting,
    shown,
)
from commlab.hook_specs import HOOKS, OUTER_PRECISIONS, SPECS, WRAPPERS

# The public names: the table's and what reads it back, and those of the modules it was split into,
# importable from here as they were before the split.
__all__ = ["BACKENDS", "GROUPS", "HOOK_GROUPS", "HOOKS", "IMPLS", "MAX_STEPS", "MAX_TRACED_STEPS", "OPTIMIZERS",
           "REDUCE_DTYPES", "RESOLVED_BACKENDS", "RULES", "SHARDINGS", "SHOWN_CHARS", "WRAPPERS", "Bounds", "ConfigError", "RunConfig", "Setting",
           "applies", "default_runs_dir", "is_plain_allreduce", "label_of", "link_label", "link_of",
           "own_settings", "runs_dir_error", "setting", "settings", "shown"]


@dataclass
class RunConfig:
    """The settings table: every setting, its default, help, allowed values and where it shows."""

    # -- the communication hook
    hook: str = setting("allreduce", choices=HOOKS, group="hook", export=True, help=(
        "The communication hook DDP calls for every gradient bucket instead of its allreduce. "
        "A compressor's definition (what it sends, against its paper and GRACE) shows under it."))
    wrapper: str = setting("none", choices=WRAPPERS, group="hook", export=True, sweep=(),
                           label="compress wrapper", help=(
        "A compress wrapper casts each bucket to fp16/bf16 around the hook and back."))
    impl: str = setting("auto", choices=IMPLS, group="hook", label="implementation", help=(
        "auto: PyTorch's hook wherever it works on this backend, commlab's Gloo-safe variant "
        "where it does not. stock: PyTorch's always (it may hang or fail). commlab: "
        "commlab's variant wherever one exists."))
    overlap: bool = setting(True, group="hook", label="overlap (commlab's PowerSGD)", help=(
        "commlab's PowerSGD and batched PowerSGD hand each bucket to one communication thread "
        "per rank, so backward goes on while they wait for their allreduces (and the next "
        "bucket's P allreduce goes out while a bucket waits for its own); off, they wait in "
        "the hook and backward stops (the blocking variant, for comparison)."))
    # -- PowerSGDState's arguments (read only by the PowerSGD hooks) in its order and spelling;
    #    the help carries the tuning advice of its docstring; lab defaults suit a 200-step run
    matrix_approximation_rank: int = setting(1, group="powersgd", bounds=Bounds(1, 1024, (
        "P and Q need at least one column; each gradient's r is capped at min(n, m) anyway, and "
        "PyTorch advises 1-4 (32 for some NLP tasks)")), export=True, sweep=(1, 2, 4), help=(
        "The rank r of P and Q: lower compresses more. Start at 1 and double (1, 2, 4, ...) until "
        "the loss is good enough; usually 1-4 suffices (some NLP tasks needed 32). Higher ranks "
        "cost compute and may not help."))
    start_powerSGD_iter: int = setting(20, group="powersgd", bounds=Bounds(0, MAX_STEPS, (
        "a step number; one past steps keeps plain allreduce throughout")), export=True, sweep=(), help=(
        "Plain allreduce until this step, PowerSGD after: early training is sensitive to inexact "
        "gradients. Start at about 10% of the steps and raise it until the loss is good enough; "
        "with a warm-up, no fewer than the warm-up steps. At least 2 with error feedback or warm "
        "start (DDP rebuilds its buckets after step 0)."))
    min_compression_rate: float = setting(2.0, group="powersgd", bounds=Bounds(0, 1e6, (
        "it multiplies (n + m) * r in the rule (n + m) * r * rate < n * m; past 1e6 no gradient "
        "of a real model is compressed"), lo_open=True), export=True, sweep=(), help=(
        "A gradient viewed as an n x m matrix is compressed only when (n + m) * r * "
        "min_compression_rate < n * m; otherwise it is allreduced uncompressed. A 1-D tensor of "
        "length k is k x 1: never compressed at a rate of 1 or more (torch 2.13 compresses it "
        "below 1)."))
    use_error_feedback: bool = setting(True, group="powersgd", export=True,
                                       aliases=("--error-feedback",), help=(
        "Keep what compression lost and add it to the next step's gradient."))
    warm_start: bool = setting(True, group="powersgd", export=True, help=(
        "Reuse last step's Q as the start of this step's power iteration."))
    orthogonalization_epsilon: float = setting(0.0, group="powersgd", bounds=Bounds(0, 1, (
        "it is added to each column norm: past 1 it distorts the norm instead of guarding a zero")), export=True, help=(
        "Added to each column norm when orthogonalizing P, against division by zero (e.g. 1e-8); "
        "0 is best for accuracy when no column is all zeros."))
    random_seed: int = setting(0, group="powersgd", bounds=Bounds(0, 2**32 - 1, (
        "PowerSGDState seeds numpy's RandomState with it, which takes 0 to 2**32 - 1")), export=True, help=(
        "Seeds the random initial Q (the same on every rank)."))
    batch_tensors_with_same_shape: bool = setting(False, group="powersgd", export=True, help=(
        "Compress same-shaped tensors in one batched operation; raise the bucket cap so more of "
        "them share a bucket. Helps when compression compute is the bottleneck."))
    # -- PostLocalSGDState's and PeriodicModelAverager's arguments (read only by post_localsgd)
    start_localSGD_iter: int = setting(20, group="localsgd", bounds=Bounds(0, MAX_STEPS, (
        "a step number; one past steps keeps global gradient allreduce throughout")), export=True,
        sweep=(), help=(
        "PostLocalSGDState: gradients are allreduced over all ranks until this step, then only "
        "within each rank's subgroup; set averager_warmup_steps to the same step, as PyTorch "
        "advises."))
    post_local_gradient_allreduce: bool = setting(True, group="localsgd", export=True, help=(
        "PostLocalSGDState: after the start, still allreduce gradients within each subgroup "
        "(off: every rank steps with its own gradient)."))
    localsgd_subgroup_size: int = setting(1, group="localsgd", bounds=Bounds(1, 64, (
        "ranks per subgroup; it must divide the number of ranks")), export=True, help=(
        "Ranks per local subgroup (dist.new_subgroups(group_size=...)); 1: every rank trains "
        "alone between averagings. PyTorch's default (one subgroup per machine) needs CUDA."))
    averager_period: int = setting(4, group="localsgd", bounds=Bounds(1, MAX_STEPS, (
        "a number of steps; 1 averages every step, costing more than allreducing gradients")),
        export=True, sweep=(2, 4, 8), help=(
        "PeriodicModelAverager: average the parameters over all ranks every this many steps, "
        "after the optimizer step."))
    averager_warmup_steps: int = setting(20, group="localsgd", bounds=Bounds(0, MAX_STEPS, (
        "a step number")), export=True, help=(
        "PeriodicModelAverager: no parameter averaging before this step (use start_localSGD_iter)."))
    # -- the quantization and sparsification hooks' hyperparameters (commlab.hooks.compressors)
    quantization_bucket_size: int = setting(512, group="compressors", bounds=Bounds(1, 2**24, (
        "elements per channel; each channel sends its own scale and zero point")), export=True,
        sweep=(64, 512, 4096),
        help=("quantization_perchannel_hook's bucket_size: the bucket is cut into channels of "
              "this many elements, each quantized to uint8 with its own scale."))
    compress_ratio: float = setting(0.01, group="compressors", bounds=Bounds(0, 1, (
        "the share of a bucket's elements that is sent"), lo_open=True), export=True,
        sweep=(0.001, 0.01, 0.1), help=(
        "topk, randomk and dgc send k = ceil(compress_ratio * n) elements of each n-element bucket."))
    sparse_error_feedback: bool = setting(True, group="compressors", export=True, help=(
        "topk and threshold keep what they did not send and add it to the next step's gradient."))
    sparsify_threshold: float = setting(1e-3, group="compressors", bounds=Bounds(0, 1e6, (
        "a gradient magnitude"), lo_open=True), export=True, sweep=(1e-4, 1e-3, 1e-2), help=(
        "threshold sends the elements whose magnitude exceeds this (their number varies per "
        "rank and step, so it allgathers the counts first)."))
    qsgd_levels: int = setting(7, group="compressors", bounds=Bounds(1, 127, (
        "levels per sign; up to 127 fits the signed level in one byte")), export=True,
        sweep=(1, 7, 127), help=(
        "QSGD's s: each element is rounded at random to one of s levels of the bucket's norm "
        "(7 levels pack into 4 bits, 127 into 8)."))
    compressor_momentum: float = setting(0.9, group="compressors", bounds=Bounds(0, 0.999, (
        "a momentum factor below 1: at 1 the momentum would never forget")), export=True, help=(
        "dgc's momentum correction and signum's momentum (the optimizer should then be plain "
        "SGD without momentum)."))
    dgc_clip_norm: float = setting(0.0, group="compressors", bounds=Bounds(1e-6, 1e6, (
        "a gradient norm"), off=0.0), export=True, help=(
        "dgc's local gradient clipping: each rank clips a bucket's gradient to this norm times "
        "N^-1/2 before accumulating it (0 = off)."))
    terngrad_clip_sigmas: float = setting(2.5, group="compressors", bounds=Bounds(0.5, 100, (
        "standard deviations of the bucket's elements: below half of one most of the bucket is "
        "clipped"), off=0.0), export=True, sweep=(0.0, 2.5), label="terngrad clipping (σ)",
        before=0.0, help=(
        "terngrad's gradient clipping (Wen et al. 2017, as GRACE has it): each bucket is clipped "
        "to ±this many standard deviations of its elements before it is ternarized; 2.5 as in the "
        "paper (0 = off: unbiased for the bucket itself, with a larger scale)."))
    # -- DiLoCo's outer loop (read only by diloco; commlab.hooks.diloco): torchft's DiLoCo names
    #    the period sync_every; the outer optimizer's defaults are the paper's
    sync_every: int = setting(8, group="diloco", bounds=Bounds(1, MAX_STEPS, (
        "a number of steps; 1 syncs after every step")), export=True, sweep=(8, 32), label="sync_every (H)",
        help=("DiLoCo's H: each replica takes this many steps with its own gradients and the run's "
              "optimizer (the inner one), then the replicas' pseudo-gradients (the parameters at the "
              "last sync minus their own) are averaged and the outer optimizer steps."))
    outer_lr: float = setting(0.7, group="diloco", bounds=Bounds(0, 10, (
        "the outer SGD's step on the averaged pseudo-gradient; 1 without momentum is plain model "
        "averaging, past 10 it overshoots by far"), lo_open=True), export=True, sweep=(0.4, 0.7, 1.0),
        help="The outer SGD's learning rate (DiLoCo's 0.7).")
    outer_momentum: float = setting(0.9, group="diloco", bounds=Bounds(0, 0.999, (
        "a momentum factor below 1: at 1 the momentum would never forget")), export=True,
        help="The outer SGD's momentum (DiLoCo's 0.9; 0 with outer_nesterov off and outer_lr 1 is model averaging).")
    outer_nesterov: bool = setting(True, group="diloco", export=True, help=(
        "Nesterov momentum in the outer SGD (DiLoCo's); it needs outer_momentum above 0."))
    outer_precision: str = setting("fp32", choices=tuple(OUTER_PRECISIONS), group="diloco", export=True,
                                   sweep=(), help=(
        "What the outer collective sends the pseudo-gradient in: fp32, bf16 or fp16 (cast, divided "
        "by the ranks and allreduced, as PyTorch's fp16 hook does), or int8 (OpenDiLoCo's and "
        "INTELLECT-1's choice): each parameter tensor's codes round(x / scale) with scale = "
        "max|x| / 127, allgathered with the scales (an int8 sum would overflow in an allreduce) "
        "and averaged in float32 on every rank."))
    # -- the job and its workload
    world_size: int = setting(2, group="job", bounds=Bounds(1, 64, (
        "each rank is a process of its own on this machine, with torch (about 300 MB) loaded")), export=True, label="ranks", help=(
        "Processes (ranks) torchrun starts; NCCL needs one GPU per rank."))
    backend: str = setting("auto", choices=BACKENDS, group="job", help=(
        "auto: NCCL when there is a GPU per rank, Gloo on the CPU otherwise."))
    bucket_cap_mb: float = setting(25.0, group="job", bounds=Bounds(0, 65536, (
        "DDP turns the cap into a byte count; past 64 GiB it is more than any model here, and "
        "past the model's size it makes one bucket"), lo_open=True), export=True, label="bucket cap (MiB)", help=(
        "DDP's bucket_cap_mb: it starts a new bucket once one reaches this many MiB."))
    # -- sharding (commlab.engine.sharding): FSDP2's fully_shard in place of DDP
    sharding: str = setting("ddp", choices=SHARDINGS, group="sharding", sweep=(), help=(
        "ddp: every rank holds the whole model and DDP all-reduces the gradients through the hook. "
        "fsdp: FSDP2's fully_shard per layer of the workload (every direct child module that holds "
        "parameters, or the model's own fsdp_units()), then on the root: each rank holds a shard, "
        "all-gathers a layer's parameters to use it and reduce-scatters its gradients. hsdp: shards "
        "within each of `replicas` groups, replicated across them, with an all-reduce between replicas."))
    replicas: int = setting(2, group="sharding", bounds=Bounds(1, 64, (
        "replica groups; it must divide the number of ranks")), label="replicas (HSDP)", help=(
        "HSDP's R: the ranks form an R x (ranks / R) mesh (init_device_mesh dims 'replicate', "
        "'shard'); each replica shards the model over its ranks/R ranks. Read only by hsdp."))
    reduce_dtype: str = setting("fp32", choices=REDUCE_DTYPES, group="sharding", help=(
        "MixedPrecisionPolicy's reduce_dtype: what FSDP reduce-scatters (and HSDP all-reduces) the "
        "gradients in; bf16 halves the bytes. Read only by fsdp and hsdp."))
    reshard_after_forward: bool = setting(True, group="sharding", help=(
        "fully_shard's reshard_after_forward: free each layer's gathered parameters after forward and "
        "all-gather them again in backward (less memory, one more all-gather per layer); off, they "
        "stay gathered until backward. Read only by fsdp and hsdp."))
    workload: str = setting("charlm", group="workload", help=(
        "A built-in model and data, or your own module:function returning (model, batches); the "
        "module is imported from the folder the lab started in."))
    steps: int = setting(200, group="job", bounds=Bounds(1, MAX_STEPS, (
        "each step writes a line of metrics; a million steps is days of training here")), help="Training steps; each writes one line of metrics.")
    eval_every: int = setting(50, group="job", bounds=Bounds(0, MAX_STEPS, (
        "a number of steps")), label="eval_every (steps)", help=(
        "Evaluate on the workload's held-out set every K steps and after the last (rank 0, "
        "outside the timed step, its time recorded apart); 0 = never."))
    save_checkpoint: bool = setting(True, group="job", help=(
        "Save a checkpoint when the run finishes (model, optimizer, hook state, step), from "
        "which `commlab run --resume RUN_DIR` continues it."))
    batch_size: int = setting(16, group="workload", bounds=Bounds(1, 65536, (
        "each rank holds a batch and its activations in memory at once")), label="batch size per rank", help=(
        "Examples each rank draws per step."))
    lr: float = setting(3e-3, group="workload", bounds=Bounds(0, 100, (
        "a step size past 100 diverges at once with every optimizer here"), lo_open=True), label="learning rate", help=(
        "The learning rate the optimizer steps with on every rank."))
    optimizer: str = setting("adamw", choices=OPTIMIZERS, group="workload", help=(
        "The optimizer every rank steps with the averaged gradients."))
    seed: int = setting(0, group="workload", bounds=Bounds(0, 2**32 - 1, (
        "it seeds torch and each rank's data generator (seed * 1000 + rank: seeds.stream_seed), as random_seed does "
        "numpy's")), help=(
        "Seeds the initial weights (the same on every rank) and the data, so that runs with "
        "different hooks draw the same batches."))
    # -- instrumentation
    instrument: bool = setting(True, group="instrument",
                               label="instrument (bytes, buckets, errors)", help=(
        "Wrap the hook to record the bytes it hands over, the bucket layout, what it "
        "compresses and the run's communication ledger (every collective by kind and size); "
        "error_every, save_grads_at and the emulated link need it."))
    error_every: int = setting(0, group="instrument", bounds=Bounds(0, MAX_STEPS, (
        "a number of steps")), label="error_every (steps)", help=(
        "Measure the approximation error against the exact mean gradient every K steps (one "
        "extra allreduce, counted apart); 0 = never."))
    save_grads_at: list[int] = setting(default_factory=list, group="instrument",
                                       label="save_grads_at (steps)", help=(
        "Steps whose exact mean gradients are saved, comma-separated."))
    trace_steps: list[int] = setting(default_factory=lambda: list(DEFAULT_TRACE_STEPS), group="instrument",
                                     label="trace_steps (steps)", help=(
        "Steps whose timeline is recorded on every rank (forward, backward, each bucket's hook call, "
        "collectives, futures, the optimizer step; on a sharded run each unit's all-gathers, "
        "reduce-scatter and all-reduce between replicas) into timeline.json and trace.json (Chrome "
        f"trace); the default, 1, is the first step after DDP rebuilt its buckets. At most "
        f"{MAX_TRACED_STEPS} steps; needs instrument on (off, the default records no timeline; "
        "torch.profiler still profiles these steps); steps past the end are not traced."))
    torch_profiler: bool = setting(False, group="instrument", label="torch.profiler on the traced steps",
                                   help=(
        "Also profile the trace_steps with torch.profiler on every rank (CPU, and CUDA on a GPU: "
        "every operator and kernel, which the lab's own timeline leaves out) and write each "
        "rank's Chrome trace to profiler/step<s>.rank<k>.json; it slows the steps it profiles."))
    stall_timeout_s: float = setting(120.0, group="instrument", bounds=Bounds(1, 7 * 86400, (
        "the supervisor looks about twice a second; past a week a hung run holds the machine "
        "unnoticed")), help=(
        "The run is called stalled when no step completes for this long."))
    # -- an emulated network link (0 = off): each collective the hook issues completes no
    #    earlier than a ring allreduce over it would, 2(N-1)·latency + 2(N-1)/N·bytes/bandwidth,
    #    after it started; collectives share the one link (see commlab.hooks.instrument)
    emulate_bandwidth_gbps: float = setting(0.0, group="instrument", bounds=Bounds(1e-3, 1e4, (
        "below 1 Mb/s one bucket is held for minutes; past 10 Tb/s the link adds nothing here"),
        off=0.0), help=(
        "Hold each collective back as if the link moved this many Gb/s (0 = off). Held to a real "
        "link of the same rate (--real-link-mbps; docs/tuning.md): within 20% where the bytes "
        "dominate; a real link adds a cost per collective that only the latency stands for."))
    emulate_latency_us: float = setting(0.0, group="instrument", bounds=Bounds(0, 1e6, (
        "up to one second per ring hop")), help=(
        "Add this latency per ring hop to each collective (0 = off)."))
    # -- a real link (0 = off): each rank in a network namespace of its own, shaped by the kernel
    #    (commlab.engine.launchers.reallink)
    real_link_mbps: float = setting(0.0, group="job", bounds=Bounds(1, 10000, (
        "below 1 Mb/s one bucket takes minutes; past 10 Gb/s the veths and this machine's cores, "
        "not the shaper, set the pace"), off=0.0), help=(
        "Run each rank in a network namespace of its own, joined to the others by veths and a "
        "bridge that tc's token bucket (tbf) shapes to this many Mb/s each way: real TCP on a real, "
        "slower link (0 = off: loopback). Needs root or an unprivileged user namespace."))
    runs_dir: str = setting(default_factory=default_runs_dir, group="job", form=False, help=(
        "The folder of run folders (default: $COMMLAB_RUNS_DIR, else ./runs); the app uses the "
        "one it was started with."))

    def __post_init__(self):
        if isinstance(self.save_grads_at, (list, tuple)):
            self.save_grads_at = sorted(set(self.save_grads_at))

    # ------------------------------------------------------------------ validation
    def errors(self, gpu_count: int | None = None) -> dict[str, str]:
        """Every problem with these settings, by field name; empty when the run may start."""
        return field_errors(self, gpu_count)

    def check(self, gpu_count: int | None = None) -> RunConfig:
        errs = self.errors(gpu_count)
        if errs:
            raise ConfigError(errs)
        return self

    # ------------------------------------------------------------------ conversions
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def checked(cls, data: dict[str, Any], source: str = "config") -> tuple[RunConfig | None, dict[str, str]]:
        """(config, every problem by field) at once, as a form shows them: a value of the wrong
        type is named beside the out-of-range ones, not instead of them (the config is None then;
        the other fields are checked with the bad one left at its default, and no rule between
        settings is judged on a field that is itself wrong)."""
        try:
            cfg = cls.from_dict(data, source)
        except ConfigError as e:
            typed = e.errors
        else:
            return cfg, cfg.errors()
        # Unknown keys are refused before any value is read: then the values get their turn.
        kept = {k: v for k, v in data.items() if k in {f.name for f in dataclasses.fields(cls)}}
        try:
            cls.from_dict({k: v for k, v in kept.items() if k not in typed}, source)
        except ConfigError as e:
            typed |= e.errors
        rest = cls.from_dict({k: v for k, v in kept.items() if k not in typed}, source)
        return None, typed | field_errors(rest, None, typed)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> RunConfig:
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError({k if len(k) <= SHOWN_CHARS else shown(k):
                               f"unknown setting in {source}; valid settings are: "
                               f"{', '.join(known)}" for k in unknown})
        errs: dict[str, str] = {}
        values = {}
        for key, value in data.items():
            try:
                values[key] = coerce(known[key], value)
            except (TypeError, ValueError) as e:
                errs[key] = str(e)
        if errs:
            raise ConfigError(errs)
        return cls(**values)

    @classmethod
    def recorded(cls, data: dict[str, Any], source: str = "config") -> RunConfig:
        """A config a run recorded: a setting added since reads as what the run did without it
        (its ``before``), not as today's default: a TernGrad run recorded before clipping existed
        exports and resumes unclipped."""
        then = {f.name: f.metadata["before"] for f in dataclasses.fields(cls)
                if f.metadata.get("before", dataclasses.MISSING) is not dataclasses.MISSING}
        return cls.from_dict({**then, **data}, source)

    def with_overrides(self, **overrides: Any) -> RunConfig:
        data = self.to_dict()
        data.update({k: v for k, v in overrides.items() if v is not None})
        return RunConfig.from_dict(data, "overrides")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_toml(self) -> str:
        return config_files.toml_text(self.to_dict())

    @classmethod
    def from_json(cls, text: str, source: str = "JSON") -> RunConfig:
        return cls.from_dict(config_files.json_settings(text, source), source)

    @classmethod
    def from_toml(cls, text: str, source: str = "TOML") -> RunConfig:
        return cls.from_dict(config_files.toml_settings(text, source), source)

    @classmethod
    def load(cls, path: str | os.PathLike) -> RunConfig:
        p = Path(path)
        text = config_files.file_text(p)
        return cls.from_toml(text, str(p)) if config_files.is_toml(p) else cls.from_json(text, str(p))

    def save(self, path: str | os.PathLike) -> Path:
        p = Path(path)
        p.write_text(self.to_toml() if config_files.is_toml(p) else self.to_json())
        return p

    # ------------------------------------------------------------------ derived
    def label(self) -> str:
        return label_of(self.to_dict())


@dataclass(frozen=True)
class Setting:
    """One row of the settings table, as the CLI, the form, the sweep and the exports read it."""

    name: str
    kind: str  # the field's type as written: str, int, float, bool or list[int]
    default: Any
    help: str
    group: str  # a key of GROUPS
    label: str  # the form's label
    flag: str  # the CLI spelling: --name-in-dashes, lower case
    aliases: tuple[str, ...]  # more CLI spellings
    choices: tuple | None  # the allowed values, when they are a closed list
    bounds: Bounds | None  # a number's allowed values
    sweep: tuple | None  # a sweep axis' default values (empty: the base's value); None: no axis
    export: bool  # offered by the Export page's form
    form: bool  # drawn on the Launch form

    @property
    def sweepable(self) -> bool:
        return self.sweep is not None


def settings() -> tuple[Setting, ...]:
    """The settings table, one row per RunConfig field in its order (defaults as of now: the
    runs folder follows $COMMLAB_RUNS_DIR)."""
    return tuple(_setting(f) for f in dataclasses.fields(RunConfig))


def _setting(f: dataclasses.Field) -> Setting:
    m = f.metadata
    if "help" not in m:
        raise TypeError(f"RunConfig.{f.name} is not a row of the settings table: declare it with "
                        "setting(default, help=..., group=...)")
    if kind_of(f) in ("int", "float") and m["bounds"] is None:
        raise TypeError(f"RunConfig.{f.name} is a number without bounds: give it bounds=Bounds(lo, "
                        "hi, why), or a value past what the workers take passes validation")
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    return Setting(name=f.name, kind=kind_of(f), default=default, help=m["help"], group=m["group"],
                   label=m["label"] or f.name, flag="--" + f.name.lower().replace("_", "-"),
                   aliases=m["aliases"], choices=m["choices"], bounds=m["bounds"], sweep=m["sweep"],
                   export=m["export"], form=m["form"])


# The groups of settings that belong to hooks: one there that a hook's spec reads means nothing to
# the hooks that do not read it (``applies``).  The hook and its implementation apply to every run.
HOOK_GROUPS = ("hook", "powersgd", "localsgd", "compressors", "diloco")
_READ_BY_SOME_HOOK = frozenset(name for spec in SPECS.values() for name in spec.reads())


def applies(s: Setting, hook: str) -> bool:
    """Whether setting ``s`` has an effect on a run of ``hook``: every setting outside the hook
    groups does; inside them, those no hook reads (the hook, the implementation) and those
    ``hook``'s spec reads."""
    if s.group not in HOOK_GROUPS or s.name not in _READ_BY_SOME_HOOK:
        return True
    spec = SPECS.get(hook)
    return spec is not None and s.name in spec.reads()


def own_settings(hook: str) -> tuple[Setting, ...]:
    """The sweepable settings ``hook`` reads (its spec's ``reads``), in the table's order: what
    tells apart two runs of it, so a sweep's axes and a run's label.  () for a name that is no hook."""
    spec = SPECS.get(hook)
    reads = set(spec.reads()) if spec else set()
    return tuple(s for s in settings() if s.sweepable and s.name in reads)


def label_of(cfg: dict, link: bool = False, seed: bool = False) -> str:
    """A run's settings in a few words, from its config as stored (any version of it): its sharding
    when not DDP (``hsdp×2``: its replicas), its hook, wrapped, the values of its hook's own settings (``own_settings``; the spec's short names),
    its emulated link (``link``) and its seed (``seed``): what tells apart the runs of a sweep,
    the rows of a comparison or the profiles of a what-if.  The one place a run's label is made."""
    hook, wrapper = cfg.get("hook", "?"), cfg.get("wrapper", "none")
    name = hook if wrapper == "none" else f"{wrapper}_wrapper({hook})"
    sharding = cfg.get("sharding", "ddp")
    if sharding != "ddp":  # a DDP run's label is as it was before sharding existed
        name = f"{sharding}{'×' + str(cfg.get('replicas')) if sharding == 'hsdp' else ''} {name}"
    spec = SPECS.get(hook)
    for s in own_settings(hook):
        if s.group == "hook" or s.name not in cfg:
            continue
        value = cfg[s.name]
        if s.name in spec.label.named_when_changed and value == s.default:
            continue
        shown = format(value, "g") if isinstance(value, float) else value
        name += f" {spec.label.short_names.get(s.name, s.name)}={shown}"
    where = link_of(cfg)
    if link and where:
        name += f" [{where}]"
    return name + (f" seed {cfg.get('seed')}" if seed else "")
