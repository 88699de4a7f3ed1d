"""``commlab export``: a run's settings for production, in one format.

    commlab export RUN_DIR --format ddp
    commlab export --config settings.toml --format slurm --nnodes 4 --nproc-per-node 8
    commlab export --hook powersgd --matrix-approximation-rank 2 --format accelerate

Run options given beside RUN_DIR override the run's settings.  Exit 2 when the format cannot
express the settings (Lightning's averager for post-local SGD warms up for start_localSGD_iter
steps, so it cannot carry another averager_warmup_steps, for instance); the message says what to
do instead.
The settings are checked as production reads them: the workload is never imported, and this
machine's GPUs and runs folder do not count.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from commlab.commands.run import add_run_options, config_from_args


def config_for(args: argparse.Namespace):
    """The settings to export: the run's (RUN_DIR), a file's (--config) or the flags', flags last."""
    if args.run_dir:
        from commlab.api import open_run
        from commlab.config import ConfigError

        if args.config:
            raise ConfigError({"config": "give a run folder or --config, not both"})
        try:
            run = open_run(args.run_dir)
        except FileNotFoundError as e:
            raise ConfigError({"run_dir": str(e)}) from None
        damage = run.damage("config.json")
        if damage:
            raise ConfigError({"run_dir": f"{run.path}: {damage}"})
        return config_from_args(args, base=run.config()), run.id
    return config_from_args(args), None


def target_from_args(args: argparse.Namespace, cfg):
    """The target the flags name; without --target-backend, production's NCCL, except for a
    Lightning export, which is made for the backend that runs here (``lightning.default_backend``:
    Lightning's Trainer wants the accelerator the machine has)."""
    from commlab.tune.export import Target
    from commlab.tune.export.lightning import default_backend

    backend = args.target_backend or (default_backend(cfg) if args.format == "lightning" else Target().backend)
    return Target.from_entries(
        nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, backend=backend,
        script=args.script, script_args=args.script_args, rdzv_endpoint=args.rdzv_endpoint,
        job_name=args.job_name, time_limit=args.time_limit, partition=args.partition,
        threads_per_process=args.threads_per_process)


def _export(args: argparse.Namespace) -> int:
    from commlab.commands import EXIT_BAD_INPUT, emit
    from commlab.config import ConfigError
    from commlab.tune.export import export_errors, render

    cfg, source = config_for(args)
    if errors := export_errors(cfg):
        raise ConfigError(errors)
    try:
        out = render(cfg, args.format, target_from_args(args, cfg), source)
    except ValueError as e:  # ExportRefused, a bad target, unbalanced quotes in --script-args
        if args.json:
            emit(args, {"error": str(e), "format": args.format}, "")
        else:
            print(f"commlab export: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.output:
        Path(args.output).write_text(out.text)
    if not args.json:
        for note in out.notes:
            print(f"note: {note}", file=sys.stderr)
    emit(args, {"format": out.format, "filename": out.filename, "notes": out.notes, "text": out.text,
                "output": args.output},
         f"wrote {args.output}" if args.output else out.text.rstrip("\n"))
    return 0


def register(sub) -> None:
    from commlab.config import RESOLVED_BACKENDS
    from commlab.tune.export import ALL_FORMATS, Target

    d = Target()
    p = sub.add_parser("export", help="a run's settings as a config file, a snippet or a launch script")
    p.add_argument("run_dir", nargs="?", help="a run folder (else --config or the run options)")
    add_run_options(p)
    p.add_argument("--format", required=True, choices=list(ALL_FORMATS),
                   help="loop and torchft: DiLoCo's, without DDP")
    p.add_argument("--output", help="write the text to this file instead of printing it")
    p.add_argument("--nnodes", type=int, default=d.nnodes, help="nodes (torchrun, slurm, lightning)")
    p.add_argument("--nproc-per-node", type=int, help="processes per node (default: world size)")
    p.add_argument("--target-backend", choices=RESOLVED_BACKENDS,
                   help=f"the production backend, which decides the hooks and warnings (default: {d.backend}; "
                        "for lightning the run's, or gloo on a machine without a GPU for every rank)")
    p.add_argument("--script", default=d.script, help="the training script torchrun starts")
    p.add_argument("--script-args", help="its arguments, as one shell-quoted string")
    p.add_argument("--rdzv-endpoint", help="host:port of the first node (default: $HEAD_NODE:29500)")
    p.add_argument("--job-name", default=d.job_name, help="SLURM job name and rendezvous id")
    p.add_argument("--time-limit", default=d.time_limit, help="SLURM time limit")
    p.add_argument("--partition", help="SLURM partition")
    p.add_argument("--threads-per-process", type=int, default=d.threads_per_process,
                   help="OMP_NUM_THREADS of each process; SLURM's --cpus-per-task is processes × this")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_export)
