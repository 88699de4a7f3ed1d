"""Headroom: how much of a training step allreduce costs, read the way PyTorch reads it.

PyTorch's documentation of ``noop_hook`` (``torch.distributed.algorithms.ddp_comm_hooks.
debugging_hooks``): "This hook should only be used for headroom analysis of allreduce
optimization ... if only less than 10% speedup of training time can be observed after this hook
is registered, it usually implies that allreduce is not a performance bottleneck for this case."
So: run the same workload twice, once with the ``allreduce`` hook and once with ``noop``, and
compare the median step time.

One figure comes out of that comparison, and only one is shown: ``saved``, *the share of the
allreduce step that noop saves*, 1 - t_noop / t_allreduce.  It is the communication that the
step pays for beyond what overlaps with backward (DDP's allreduce runs while backward goes on, so
it is not all of the communication).  It is held against ``THRESHOLD``, PyTorch's 10%, reading
"speedup of training time" as training time saved.  The same two times give other numbers, which
are not shown, because they answer the same question on other scales: noop's speedup
t_allreduce / t_noop - 1 (a step saving 10% is 11.1% faster), or the change from allreduce to
noop, -saved.

The two runs go one after the other (run together they would fight over the same cores), and each
is read over its steady steps (``commlab.analysis.metrics``): the first ``skip`` steps include
start-up work and DDP's bucket rebuild.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from commlab.analysis import metrics
from commlab.config import ConfigError
from commlab.engine import store
from commlab.engine.run_state import RunStatus

THRESHOLD = 0.10  # PyTorch's noop_hook documentation: "less than 10% speedup of training time"
SAVED_LABEL = "step time saved by noop"
SAVED_HELP = ("1 − noop step / allreduce step: the share of an allreduce step that goes away when "
              "the hook sends nothing, which is the communication that does not overlap with "
              f"backward. PyTorch's noop_hook documentation puts the line at {THRESHOLD:.0%}: "
              "below it, allreduce is usually not the bottleneck.")


@dataclass
class Headroom:
    workload: str
    world_size: int
    steps: int
    skip: int
    step_s_allreduce: float  # median step time with the allreduce hook
    step_s_noop: float  # ... and with noop, which communicates nothing
    saved: float  # the one figure: 1 - t_noop / t_allreduce (SAVED_LABEL)
    allreduce_is_bottleneck: bool  # saved >= THRESHOLD
    verdict: str
    run_ids: dict[str, str]

    def to_dict(self) -> dict:
        return {**asdict(self), "threshold": THRESHOLD}


def read_headroom(step_s_allreduce: float, step_s_noop: float,
                  threshold: float = THRESHOLD) -> dict[str, Any]:
    """The share of the step noop saves, and the verdict, from two step times (pure).

    noop can come out slower than allreduce on a noisy machine: ``saved`` is then below 0, and the
    verdict says so rather than clipping it.
    """
    if not (step_s_allreduce > 0 and step_s_noop > 0):
        raise ValueError(f"step times must be above 0, got {step_s_allreduce} and {step_s_noop}")
    saved = 1 - step_s_noop / step_s_allreduce
    bottleneck = saved >= threshold
    # -saved is how much longer noop's step is, on the same scale: no second number.
    what = (f"noop saves {saved:.0%} of the allreduce step" if saved >= 0 else
            f"noop saves nothing: its step is {-saved:.0%} longer (noise)")
    verdict = (f"{what} ({step_s_allreduce * 1e3:.2f} ms → {step_s_noop * 1e3:.2f} ms): "
               + (f"at or above PyTorch's {threshold:.0%} line, so allreduce is a bottleneck here "
                  "and a cheaper hook (fp16, PowerSGD) may pay off" if bottleneck else
                  f"under PyTorch's {threshold:.0%} line, so allreduce is not the bottleneck; "
                  "compressing gradients would save little"))
    return {"saved": saved, "allreduce_is_bottleneck": bottleneck, "verdict": verdict}


def measure_headroom(workload: str = "mlp", steps: int = 40, world_size: int = 2,
                     skip: int = metrics.WARMUP_STEPS,
                     timeout_s: float = 600.0, **settings: Any) -> Headroom:
    """Run ``workload`` with the allreduce hook, then with noop, and read the difference.

    ``settings`` are further RunConfig fields, the same for both runs.  Raises ConfigError
    before anything starts when the settings are wrong, RuntimeError when a run does not finish.
    """
    from commlab.config import RunConfig

    if "hook" in settings or "wrapper" in settings:
        raise ConfigError({"hook": "the comparison sets the hook itself (allreduce, then noop)"})
    if not 0 <= skip < steps:
        raise ConfigError({"skip": f"must be from 0 to steps - 1 ({steps - 1}), got {skip}"})
    base = {"workload": workload, "steps": steps, "world_size": world_size, **settings}
    configs = {hook: RunConfig.from_dict({**base, "hook": hook}, "headroom settings").check()
               for hook in ("allreduce", "noop")}
    from commlab.engine.launchers.warm import Batch

    times, run_ids = {}, {}
    with Batch("headroom measurement") as batch:  # the two runs on the same warm ranks
        for hook, cfg in configs.items():
            run = _run_to_end(batch, cfg, timeout_s)
            steady = metrics.steady_rows(run.metrics_records(), run.config_dict(), warmup=skip)
            if not steady:
                raise RuntimeError(f"the {hook} run has no steady step from step {skip} on (run folder "
                                   f"{run.path})")
            times[hook], run_ids[hook] = metrics.median(steady, "step_s"), run.id
    return Headroom(workload, world_size, steps, skip, times["allreduce"], times["noop"],
                    **read_headroom(times["allreduce"], times["noop"]), run_ids=run_ids)


def _run_to_end(batch, cfg, timeout_s: float):
    run = batch.start(cfg)
    try:
        status = run.wait(timeout_s)
    except BaseException:  # interrupted (Ctrl-C, a page left, a test timeout): stop the run too
        run.stop()
        raise
    if status in store.GOING:
        run.stop()
        raise RuntimeError(f"the {cfg.hook} run did not finish within {timeout_s:g} s; stopped it")
    if status != RunStatus.FINISHED:
        error = run.status_record().get("error") or "no error recorded"
        raise RuntimeError(f"the {cfg.hook} run ended {status}: {error} (run folder {run.path})")
    return run
