"""``commlab run``: one run in the foreground; exit 0 only when it finished."""
from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Collection

from commlab.config import RunConfig, settings

FLAG_TYPES = {"int": int, "float": float}  # the rest is text, parsed as a config file's is
METAVARS = {"int": "N", "float": "X", "list[int]": "N,N,..."}


def add_run_options(p: argparse.ArgumentParser, axes: Collection[str] = ()) -> None:
    """The settings flags, one per row of the settings table, shared by every command that takes a
    run configuration.  The settings named in ``axes`` take comma-separated lists (a sweep's)."""
    p.add_argument("--config", metavar="FILE", help="a JSON or TOML file of settings; flags override it")
    for s in settings():
        text = s.help + (f" One of: {', '.join(map(str, s.choices))}." if s.choices else "") \
            + (f" Allowed: {s.bounds.text}." if s.bounds else "")
        if s.name in axes:
            default = ",".join(map(str, s.sweep)) if s.sweep else "the one --config or the defaults give"
            p.add_argument(s.flag, *s.aliases, dest=s.name, metavar="LIST",
                           help=_escape(f"Comma-separated values to try (default: {default}). {text}"))
        elif s.kind == "bool":
            p.add_argument(s.flag, *s.aliases, dest=s.name, action=argparse.BooleanOptionalAction,
                           help=_escape(f"{text} (default: {'on' if s.default else 'off'})"))
        else:
            p.add_argument(s.flag, *s.aliases, dest=s.name, type=FLAG_TYPES.get(s.kind, str),
                           metavar="NAME" if s.choices else METAVARS.get(s.kind, "TEXT"),
                           help=_escape(f"{text} (default: {_shown(s)})"))


def config_from_args(args: argparse.Namespace, axes: Collection[str] = ()) -> RunConfig:
    """The file's settings (``--config``) or the defaults, the flags given on top; ``axes`` left out."""
    base = RunConfig.load(args.config) if getattr(args, "config", None) else RunConfig()
    return base.with_overrides(**{s.name: getattr(args, s.name, None) for s in settings()
                                  if s.name not in axes})


def _shown(s) -> str:
    if s.kind == "list[int]":
        return ",".join(map(str, s.default)) or "none"
    return str(s.default)


def _escape(text: str) -> str:
    return text.replace("%", "%%")  # argparse formats help with %


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
    from commlab.engine import procs
    from commlab.engine.store import JsonlTail

    tail = JsonlTail(run.file("metrics.jsonl"))

    def show_new_steps() -> bool:
        for row in tail.read_new():
            print(f"\rstep {row['step'] + 1}/{steps}  loss {row['loss']:.4f}", end="", file=sys.stderr)
        return not run.is_running()

    procs.wait_until(show_new_steps, interval=0.25)
    print(file=sys.stderr)


def register(sub) -> None:
    p = sub.add_parser("run", help="start a run in the foreground")
    add_run_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run)
