"""``commlab run``: one run in the foreground; exit 0 only when it finished."""
from __future__ import annotations

import argparse
import signal
import sys

from commlab.config import RunConfig

FLAGS = {  # flag -> RunConfig field
    "hook": "hook", "wrapper": "wrapper", "impl": "impl", "world_size": "world_size",
    "steps": "steps", "workload": "workload", "matrix_approximation_rank": "matrix_approximation_rank",
    "start_powersgd_iter": "start_powerSGD_iter", "min_compression_rate": "min_compression_rate",
    "bucket_cap_mb": "bucket_cap_mb", "backend": "backend", "seed": "seed", "runs_dir": "runs_dir",
    "batch_size": "batch_size", "lr": "lr", "optimizer": "optimizer", "error_every": "error_every",
    "save_grads_at": "save_grads_at", "stall_timeout_s": "stall_timeout_s",
    "emulate_bandwidth_gbps": "emulate_bandwidth_gbps", "emulate_latency_us": "emulate_latency_us",
}


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The settings flags, shared by every command that takes a run configuration."""
    p.add_argument("--config", help="a JSON or TOML file of settings; flags override it")
    p.add_argument("--hook")
    p.add_argument("--wrapper")
    p.add_argument("--impl")
    p.add_argument("--world-size", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--workload", help="charlm, mlp, cnn, wide, or module:function")
    p.add_argument("--matrix-approximation-rank", type=int)
    p.add_argument("--start-powersgd-iter", type=int)
    p.add_argument("--min-compression-rate", type=float)
    p.add_argument("--no-error-feedback", action="store_true")
    p.add_argument("--no-warm-start", action="store_true")
    p.add_argument("--bucket-cap-mb", type=float)
    p.add_argument("--backend")
    p.add_argument("--seed", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--optimizer")
    p.add_argument("--error-every", type=int, help="record the approximation error every K steps")
    p.add_argument("--save-grads-at", help="comma-separated steps whose gradients are saved")
    p.add_argument("--stall-timeout-s", type=float)
    p.add_argument("--emulate-bandwidth-gbps", type=float)
    p.add_argument("--emulate-latency-us", type=float)
    p.add_argument("--runs-dir")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    base = RunConfig.load(args.config) if getattr(args, "config", None) else RunConfig()
    overrides = {field: getattr(args, flag) for flag, field in FLAGS.items()
                 if getattr(args, flag, None) is not None}
    if getattr(args, "no_error_feedback", False):
        overrides["use_error_feedback"] = False
    if getattr(args, "no_warm_start", False):
        overrides["warm_start"] = False
    return base.with_overrides(**overrides)


def result_payload(run) -> dict:
    s = run.summary()
    return {k: s[k] for k in ("run_id", "run_dir", "status", "steps", "final_loss",
                              "median_step_s", "bytes_per_step", "compression_ratio", "hook_impl")} \
        | {"error": s["error"]}


def _run(args: argparse.Namespace) -> int:
    from commlab.api import launch
    from commlab.commands import emit

    cfg = config_from_args(args).check()
    # Ctrl-C or a TERM to this foreground command stops the run it started, also one pressed
    # while the run is still being started (the handle does not exist yet).
    pressed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: pressed.append(True))
    run = launch(cfg)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: run.stop())
    if pressed:
        run.stop()
    warning = run.launch_info().get("warning")
    if warning and not args.json:
        print(f"warning: {warning}", file=sys.stderr)
    if not args.json:
        info = run.launch_info()
        print(f"run {run.id}: {cfg.label()} on {cfg.world_size} {info['backend']} rank(s) "
              f"({info['hook_impl']} implementation) -> {run.path}", file=sys.stderr)
        _follow(run, cfg.steps)
    run.wait()
    payload = result_payload(run)
    text = (f"{payload['status']}: {payload['steps']} steps, final loss {payload['final_loss']}, "
            f"median step {payload['median_step_s']} s, {payload['bytes_per_step']} B/step, "
            f"compression x{payload['compression_ratio']}, hook {payload['hook_impl']}")
    if payload["error"]:
        text += f"\n{payload['error']}"
        tb = run.status_record().get("traceback")
        if tb:
            text += "\n" + tb
    emit(args, payload, text)
    return 0 if payload["status"] == "finished" else 1


def _follow(run, steps: int) -> None:
    """A progress line on stderr while the run goes."""
    import time

    from commlab.engine.store import JsonlTail

    tail = JsonlTail(run.file("metrics.jsonl"))
    while run.is_running():
        for row in tail.read_new():
            print(f"\rstep {row['step'] + 1}/{steps}  loss {row['loss']:.4f}", end="", file=sys.stderr)
        time.sleep(0.25)
    print(file=sys.stderr)


def register(sub) -> None:
    p = sub.add_parser("run", help="start a run in the foreground")
    add_run_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run)
