"""Headroom: how much of a training step allreduce costs, read the way PyTorch reads it.

PyTorch's documentation of ``noop_hook`` says the hook, which sends nothing, is there for
headroom analysis of allreduce optimization: if registering it speeds training up by less than
about 10%, allreduce is usually not the performance bottleneck.  So: run the same workload twice,
once with the ``allreduce`` hook and once with ``noop``, and compare the median step time.

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

THRESHOLD = 0.10  # PyTorch's rule of thumb for noop_hook


@dataclass
class Headroom:
    workload: str
    world_size: int
    steps: int
    skip: int
    step_s_allreduce: float  # median step time with the allreduce hook
    step_s_noop: float  # ... and with noop, which communicates nothing
    speedup: float  # how much faster noop is: t_allreduce / t_noop - 1
    comm_share: float  # communication's share of an allreduce step: 1 - t_noop / t_allreduce
    allreduce_is_bottleneck: bool
    verdict: str
    run_ids: dict[str, str]

    def to_dict(self) -> dict:
        return asdict(self)


def read_headroom(step_s_allreduce: float, step_s_noop: float,
                  threshold: float = THRESHOLD) -> dict[str, Any]:
    """Speed-up, communication share and the verdict, from two step times (pure)."""
    if not (step_s_allreduce > 0 and step_s_noop > 0):
        raise ValueError(f"step times must be above 0, got {step_s_allreduce} and {step_s_noop}")
    speedup = step_s_allreduce / step_s_noop - 1
    share = 1 - step_s_noop / step_s_allreduce
    bottleneck = speedup >= threshold
    verdict = (f"noop is {speedup:.0%} faster per step than allreduce: "
               + (f"at or above {threshold:.0%}, so allreduce is a bottleneck here and a cheaper "
                  "hook (fp16, PowerSGD) may pay off" if bottleneck else
                  f"under {threshold:.0%}, so allreduce is not the bottleneck; compressing "
                  "gradients would save little"))
    return {"speedup": speedup, "comm_share": share, "allreduce_is_bottleneck": bottleneck,
            "verdict": verdict}


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
    times, run_ids = {}, {}
    for hook, cfg in configs.items():
        run = _run_to_end(cfg, timeout_s)
        steady = metrics.steady_rows(run.metrics_records(), run.config_dict(), warmup=skip)
        if not steady:
            raise RuntimeError(f"the {hook} run has no steady step from step {skip} on (run folder "
                               f"{run.path})")
        times[hook], run_ids[hook] = metrics.median(steady, "step_s"), run.id
    return Headroom(workload, world_size, steps, skip, times["allreduce"], times["noop"],
                    **read_headroom(times["allreduce"], times["noop"]), run_ids=run_ids)


def _run_to_end(cfg, timeout_s: float):
    from commlab.engine.launch import start as launch

    run = launch(cfg)
    try:
        status = run.wait(timeout_s)
    except BaseException:  # interrupted (Ctrl-C, a page left, a test timeout): stop the run too
        run.stop()
        raise
    if status in store.GOING:
        run.stop()
        raise RuntimeError(f"the {cfg.hook} run did not finish within {timeout_s:g} s; stopped it")
    if status != "finished":
        error = run.status_record().get("error") or "no error recorded"
        raise RuntimeError(f"the {cfg.hook} run ended {status}: {error} (run folder {run.path})")
    return run
