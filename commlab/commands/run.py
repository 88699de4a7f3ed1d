"""``commlab run``: one run in the foreground; exit 0 only when it finished."""
from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Collection

from commlab.config import ConfigError, RunConfig, settings
from commlab.engine.run_state import RunStatus

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


def config_from_args(args: argparse.Namespace, axes: Collection[str] = (),
                     base: RunConfig | None = None) -> RunConfig:
    """``base`` (a run's), the file's settings (``--config``) or the defaults, the flags given on
    top; ``axes`` left out."""
    if base is None:
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
                              "median_step_s", "bytes_per_step", "steady_compression_ratio",
                              "compression_ratio", "hook_impl",
                              "heldout_loss", "heldout_accuracy", "heldout_bits_per_char")} \
        | {"evals": run.evals(), "resumed_from": run.resumed_from(), "error": s["error"],
           "loss": run.meta().get("loss")}


def _heldout_text(payload: dict) -> str:
    if payload["heldout_loss"] is None:
        return ""
    extra = next((f", {name} {payload[key]:.4f}" for key, name in (
        ("heldout_accuracy", "accuracy"), ("heldout_bits_per_char", "bits/char"))
        if payload[key] is not None), "")
    return f", held-out loss {payload['heldout_loss']:.4f}{extra}"


def _run(args: argparse.Namespace) -> int:
    from commlab.commands import emit
    from commlab.engine.launch import start
    from commlab.engine.launchers.choice import chosen

    if args.resume and args.config:
        raise ConfigError({"config": "--resume continues a run with its own settings: give the "
                                     "ones to change (steps, eval_every, ...) as flags"})
    if args.resume:
        from commlab.engine.checkpoint import resume_config  # torch: only to open a checkpoint

        cfg = resume_config(args.resume, **{s.name: getattr(args, s.name, None) for s in settings()})
    else:
        cfg = config_from_args(args).check()
    # Ctrl-C or a TERM to this foreground command stops the run it started, also one pressed
    # while the run is still being started (the handle does not exist yet).
    slurm = slurm_from_args(args)
    launcher = chosen(args.resume, node_from_args(args), slurm, cfg=cfg)
    pressed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: pressed.append(True))
    run = start(cfg, launcher)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: run.stop())
    if pressed:
        run.stop()
    warning = run.launch_info().get("warning")
    if warning and not args.json:
        print(f"warning: {warning}", file=sys.stderr)
    whole = run.whole()  # the run folder; on node K of several, ``run`` is this node's records
    if not args.json:
        info = run.launch_info()
        where = launcher.describe(cfg, info)
        print(f"run {whole.id}: {cfg.label()} on {where} ({info['hook_impl']} implementation) "
              f"-> {whole.path}", file=sys.stderr)
        _follow(whole, cfg.steps, run)
    run.wait(processes=False)  # its end is recorded: the command returns while the processes exit
    if whole.path != run.path:  # node K: node 0 records the run's end
        whole.wait(timeout=60, processes=False)
    payload = result_payload(whole if whole.exists() else run)
    if whole.path != run.path:  # this node's own end is the command's word (its record takes the run's when it ended well)
        own = run.status_record()
        payload |= {"status": own["status"], "error": own.get("error")}
    text = result_text(payload) + _heldout_text(payload)
    if payload["error"]:
        text += f"\n{payload['error']}"
        tb = run.status_record().get("traceback")
        if tb:
            text += "\n" + tb
    emit(args, payload, text)
    return 0 if payload["status"] == RunStatus.FINISHED else 1


def result_text(payload: dict) -> str:
    """A finished run's figures for reading: a few significant digits, units, thousands separated."""
    from commlab.analysis import metrics
    from commlab.analysis.units import human_bytes, number, seconds

    text = (f"{payload['status']}: {number(payload['steps'])} steps, final loss "
            f"{number(payload['final_loss'])}, median step {seconds(payload['median_step_s'])}")
    if payload["bytes_per_step"] is not None:
        text += f", {human_bytes(payload['bytes_per_step'])} per step and rank"
    if payload.get("steady_compression_ratio") is not None:
        text += f", {metrics.STEADY_RATIO} {payload['steady_compression_ratio']:.2f}x"
    if payload["compression_ratio"] is not None:
        text += f" ({metrics.CUMULATIVE_RATIO} {payload['compression_ratio']:.2f}x)"
    text += f", hook implementation {payload['hook_impl']}"
    return text + (f"; loss: {payload['loss']}" if payload.get("loss") else "")


def _follow(run, steps: int, records=None) -> None:
    """Progress on stderr while the run goes (``commands.Progress``); ``records``: this node's,
    whose end ends the following (node K of a run on several)."""
    from commlab.commands import Progress
    from commlab.engine import procs
    from commlab.engine.store import JsonlTail

    tail = JsonlTail(run.file("metrics.jsonl"))
    progress = Progress(steps)

    def show_new_steps() -> bool:
        rows = tail.read_new()
        if rows:
            progress.update(rows[-1]["step"] + 1, loss=rows[-1]["loss"])
        return not (records or run).is_running()

    try:
        procs.wait_until(show_new_steps, interval=0.25)
    finally:
        progress.close()


def register(sub) -> None:
    p = sub.add_parser("run", help="start a run in the foreground")
    add_run_options(p)
    p.add_argument("--resume", metavar="RUN_DIR", help=(
        "continue this finished run from its checkpoint, in a new run folder that names it: its "
        "settings, with the flags given (--steps counts from its step 0; default: as many steps "
        "again)"))
    add_node_options(p)
    add_launcher_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run)


def add_launcher_options(p: argparse.ArgumentParser, nodes_flag: bool = False) -> None:
    """Where the runs start: this machine, or Slurm (``commlab.engine.launchers.slurm``); ``nodes_flag``
    adds --nodes (``run`` has it among its several-nodes flags)."""
    g = p.add_argument_group("Slurm", "--launcher slurm submits each run as a batch job (sbatch); "
                             "the runs folder must be shared with the compute nodes")
    g.add_argument("--launcher", choices=["local", "slurm"], default="local", help="where the runs start")
    if nodes_flag:
        g.add_argument("--nodes", "--nnodes", dest="nnodes", type=int, metavar="N",
                       help="nodes per run (default: 1)")
        g.add_argument("--ifname", metavar="NAME", help="the network interface the ranks talk on "
                       "between nodes (default: $GLOO_SOCKET_IFNAME)")
    g.add_argument("--partition", help="the Slurm partition (default: the cluster's)")
    g.add_argument("--time-limit", metavar="HH:MM:SS", help="the job's time limit (default: 01:00:00)")
    g.add_argument("--rdzv-port", type=int, metavar="PORT", help="the rendezvous port on the "
                   "allocation's first node (default: 29400)")


def slurm_from_args(args: argparse.Namespace):
    """The Slurm job each run is submitted as, or None for this machine; ConfigError naming the flag."""
    from commlab.engine.launchers.slurm import SlurmJob

    if args.launcher != "slurm":
        # a sweep's --nodes and --ifname are Slurm's; a run's are its own several-nodes flags
        only = ("partition", "time_limit", "rdzv_port", *(("nnodes", "ifname") if args.command == "sweep" else ()))
        given = [f for f in only if getattr(args, f, None) not in (None, 1)]
        if given:
            raise ConfigError({f: "only with --launcher slurm" for f in given})
        return None
    placed = [f for f in ("node_rank", "rdzv_endpoint", "run_id", "local_addr", "join_timeout")
              if getattr(args, f, None) is not None]
    if placed:
        raise ConfigError({f: "Slurm places the nodes of a --launcher slurm run: leave it out" for f in placed})
    return SlurmJob.given(args.nnodes, args.time_limit, args.partition, args.ifname, args.rdzv_port)


def add_node_options(p: argparse.ArgumentParser) -> None:
    """Where this command's run stands on several nodes (``commlab.engine.launchers.nodes``)."""
    g = p.add_argument_group("several nodes", "run the same command on every node, each with its "
                             "--node-rank; the runs folder must be one shared folder")
    g.add_argument("--nnodes", "--nodes", type=int, metavar="N", help="nodes in the run (default: 1)")
    g.add_argument("--node-rank", type=int, metavar="K", help="this node's place, 0 to N-1; node 0 "
                   "serves the rendezvous")
    g.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="node 0's address and a free port there")
    g.add_argument("--run-id", metavar="ID", help="the same on every node: the run folder's name")
    g.add_argument("--ifname", metavar="NAME", help="the network interface the ranks talk on "
                   "(default: $GLOO_SOCKET_IFNAME; refused when neither names one)")
    g.add_argument("--local-addr", metavar="ADDR", help="this node's address as the others reach it "
                   "(default: the interface's IPv4 address)")
    g.add_argument("--join-timeout", type=float, metavar="S", help="seconds to wait for every node "
                   "to join (default: 600, torchrun's)")


def node_from_args(args: argparse.Namespace):
    """This node of a run on several (ConfigError naming the flag), or None on one node, and on
    Slurm, which places the nodes itself (``slurm_from_args`` reads --nodes then)."""
    from commlab.engine.launchers.nodes import Nodes

    if args.launcher == "slurm":
        return None

    return Nodes.given(args.nnodes, args.node_rank, args.rdzv_endpoint, args.run_id, args.ifname,
                       args.local_addr, args.join_timeout)
