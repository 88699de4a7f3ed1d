"""The classroom's demonstration on a real link: the same small training run with plain allreduce
and with PowerSGD, each on a real 100 Mb/s link (``commlab.engine.launchers.reallink``: every rank
in a network namespace of its own, veths to a bridge shaped by the kernel's token bucket), side by
side: the step time, the bytes each rank puts on the wire a step, and the kernel's own count of
the bytes held to the ledger's.

The runs are ordinary runs (``commlab.engine.launchers.warm.Batch``, which hands a real-link run
to its own launcher, the one place that starts processes): they are listed on the Runs page, and
they die with the process that asked for them.  They go at the same time, each on a link of its
own (its own namespaces and bridge), so that a class waits for one start-up, not two; they share
this machine's cores, and the result says so (``together``).

Where no network namespace can be made (no root, no unprivileged user namespace, no ``ip`` or
``tc``), ``why_not`` says why, by name, before anything starts.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from commlab.analysis import kernel_bytes, metrics
from commlab.config import RunConfig
from commlab.engine import procs, store
from commlab.engine.launchers import reallink
from commlab.engine.run_state import RunStatus

RATE_MBPS = 100.0
WORKLOAD = "mlp"  # the smallest built-in model: 340 KB of gradients a step, 27 ms at 100 Mb/s
STEPS = 30
WORLD_SIZE = 2
# PowerSGD compressing from step 2 (the least its error feedback and warm start allow: DDP
# rebuilds its buckets at step 1), rank 2: some 8 KB a step in place of 340 KB.
HOOKS: dict[str, dict] = {"allreduce": {},
                          "powersgd": {"matrix_approximation_rank": 2, "start_powerSGD_iter": 2}}
OWNER = "classroom: a real link"
POLL_S = 0.25
COUNTERS_S = 30.0  # a rank's node records its veth's counters as its torchrun ends: a moment after


@dataclass
class Side:
    """One hook's run on the real link."""

    hook: str
    run_id: str
    steps: int
    steady_steps: int
    step_s: float  # median steady step
    wire_bytes: float  # median steady bytes each rank sent a step, by the ledger (2(N-1)/N · payload)
    compression_ratio: float | None  # steady: plain bytes / sent bytes
    kernel: list[dict] = field(default_factory=list)  # kernel_bytes.compare's rows, one per rank
    agree: bool = False  # kernel_bytes.agree: the kernel counted the ledger's bytes, within control


@dataclass
class Demonstration:
    rate_mbps: float
    workload: str
    world_size: int
    together: bool  # the runs went at the same time (each on a link of its own, sharing the cores)
    sides: list[Side]
    wall_s: float

    def link_s(self, side: Side) -> float:
        """Seconds the side's bytes take at the rate: the least a step can take on this link."""
        return side.wire_bytes * 8 / (self.rate_mbps * 1e6)

    def to_dict(self) -> dict:
        return asdict(self)


def why_not() -> str | None:
    """None where this machine can make the real link; else why not, by name (what is missing, or
    what the kernel answered), before anything starts."""
    prefix, how = reallink.privilege()
    if prefix is None:
        return f"a real link needs network namespaces: {how}"
    if err := reallink.qdisc_error(prefix, reallink.shaping(RATE_MBPS, reallink.ASSUMED_HZ)):
        return f"this kernel cannot shape a link with tc's tbf: {err}"
    return None


def configs(steps: int = STEPS, rate_mbps: float = RATE_MBPS, runs_dir: str | None = None) -> dict[str, RunConfig]:
    """The two runs' settings, checked (a ConfigError names the field before anything starts)."""
    base = {"workload": WORKLOAD, "world_size": WORLD_SIZE, "steps": steps, "eval_every": 0,
            "real_link_mbps": rate_mbps, **({"runs_dir": runs_dir} if runs_dir else {})}
    return {hook: RunConfig.from_dict({**base, "hook": hook, **extra}, "the real-link demonstration").check()
            for hook, extra in HOOKS.items()}


def demonstrate(steps: int = STEPS, rate_mbps: float = RATE_MBPS, runs_dir: str | None = None,
                progress: Callable[[float, str], None] | None = None, timeout_s: float = 600.0) -> Demonstration:
    """Run allreduce and PowerSGD on a real link of ``rate_mbps``, both at once, and read them.
    ``progress(fraction, what)`` is called as they go.  Raises RuntimeError naming why where no
    namespace can be made, or a run does not finish (both are stopped then)."""
    if reason := why_not():
        raise RuntimeError(reason)
    cfgs = configs(steps, rate_mbps, runs_dir)
    say = progress or (lambda fraction, what: None)
    from commlab.engine.launchers.warm import Batch

    t0 = time.monotonic()
    say(0.0, "starting both runs: namespaces, veths, the token buckets, torchrun")
    with Batch(OWNER) as batch:  # a real-link run goes to its own launcher, never a pool
        runs = {hook: batch.start(cfg) for hook, cfg in cfgs.items()}
        try:
            _follow(runs, steps, timeout_s, say)
        except BaseException:  # a failure, a timeout, a page left: neither run outlives the demonstration
            for run in runs.values():
                run.stop()
            raise
    say(1.0, "reading the kernel's counters")
    sides = [_read(hook, run) for hook, run in runs.items()]
    return Demonstration(rate_mbps, WORKLOAD, WORLD_SIZE, True, sides, time.monotonic() - t0)


def _follow(runs: dict, steps: int, timeout_s: float, say: Callable[[float, str], None]) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        done = {hook: len(run.metrics_records()) for hook, run in runs.items()}
        status = {hook: run.status() for hook, run in runs.items()}
        if failed := {h: s for h, s in status.items() if s not in store.GOING and s != RunStatus.FINISHED}:
            hook, s = next(iter(failed.items()))
            raise RuntimeError(f"the {hook} run ended {s}: {runs[hook].status_record().get('error') or 'no error recorded'}"
                               f" (run folder {runs[hook].path})")
        if all(s == RunStatus.FINISHED for s in status.values()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the runs did not finish within {timeout_s:g} s; stopped them")
        # start-up counts as the first tenth: most of a short run's time is torchrun's start
        fraction = 0.1 + 0.9 * min(1.0, sum(done.values()) / (steps * len(runs)))
        say(min(fraction, 0.99), ", ".join(f"{h} step {done[h]}/{steps}" if done[h] else f"{h} starting"
                                           for h in runs))
        time.sleep(POLL_S)


def _read(hook: str, run) -> Side:
    cfg = run.config_dict()
    records = run.metrics_records()
    steady = metrics.steady_rows(records, cfg)
    # each rank's node writes its counters as its torchrun ends, which can follow the run's status
    if not procs.wait_until(lambda: len(list(run.path.glob("link.rank*.json"))) == cfg["world_size"], COUNTERS_S):
        raise RuntimeError(f"the {hook} run's ranks recorded no kernel counters within {COUNTERS_S:g} s ({run.path})")
    link = [store.read_json(p) for p in run.path.glob("link.rank*.json")]
    rows = kernel_bytes.compare(link, store.read_json(run.file("ledger.json"))["rows"], cfg["world_size"],
                                store.read_json(run.file("meta.json"))["num_parameters"])
    return Side(hook, run.id, len(records), len(steady), metrics.median(steady, "step_s"),
                metrics.median(steady, "wire_bytes"), metrics.steady_compression_ratio(records, cfg),
                rows, kernel_bytes.agree(rows))
