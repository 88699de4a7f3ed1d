"""Where a short run's seconds go, phase by phase, from the command to its return; and what a
sweep of short runs pays beyond its runs' own steps:

    python benchmarks/startup.py [--runs 5] [--workload mlp] [--steps 1] [--world-size 2] [--sweep 4]

Each run is ``commlab run ... --json`` as a person types it; the phases are read off the run
folder's own records (launch.json's ``created_at``,
supervisor.json's ``up_at``, rank 0's
meta.json ``phases`` (rank 0's: its imports done, the process group, DDP and the hook set up) and ``started_at``, the first step's time, the finished status's ``at``) and
the command's return is timed here.  Medians over ``--runs``, with the load beside them (these
machines are shared: a busy one stretches every phase), for the ranks forked from torchrun (the
default on a machine without a GPU driver) and started as interpreters of their own
(``COMMLAB_FORK_RANKS=0``), the two taken in turn.  ``--sweep N``: ``commlab sweep`` of N
runs of ``--steps`` steps (one setting, N seeds, no baseline) against one such run, one after the
other, alternately: the sweep's time over one run's, and its overhead per run (its time less the
training time its runs recorded, over N).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from commlab.devices import FORK_ENV  # noqa: E402
from commlab.engine import run_folder  # noqa: E402

# Times each process reports of itself (wall clock): a process's create time, as psutil reads it
# off /proc, is off by up to a second (the boot time it adds is whole seconds), so none is used.
PHASES = (
    ("command -> run folder", "command", "folder"),
    ("run folder -> supervisor up", "folder", "supervisor"),
    ("supervisor -> ranks' imports done", "supervisor", "imported"),
    ("imports -> process group", "imported", "process_group"),
    ("process group -> DDP and hook set up", "process_group", "set_up"),
    ("set up -> first step done", "set_up", "first_step"),
    ("first step -> recorded end", "first_step", "ended"),
    ("recorded end -> command returned", "ended", "returned"),
    ("command -> first step done", "command", "first_step"),
    ("command -> returned", "command", "returned"),
)


STARTS = {"forked": {}, "exec'd": {FORK_ENV: "0"}}  # how the ranks start: the environment


def one_run(argv: list[str], runs_dir: Path, env: dict | None = None) -> dict[str, float]:
    command = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "commlab", "run", *argv, "--runs-dir", str(runs_dir),
                             "--json"], stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, **(env or {})})
    out, _ = proc.communicate(timeout=600)
    returned = time.time()
    payload = json.loads(out.strip().splitlines()[-1])
    run = run_folder.RunFolder(payload["run_dir"])
    launch, sup, meta = run.launch_info(), run.supervisor(), run.meta()
    first = run.metrics_records()[0]
    return {"command": command, "folder": launch["created_at"], "supervisor": sup["up_at"],
            "imported": meta["phases"]["imported"], "process_group": meta["phases"]["process_group"],
            "set_up": meta["phases"]["set_up"], "first_step": meta["started_at"] + first["t"],
            "ended": run.status_record().get("at") or run.status_record().get("ended_at"),
            "returned": returned}


COLD_RUNS = """
import sys
from commlab.engine.launchers.warm import Batch
from commlab.tune import sweep as sw
spec = sw.SweepSpec.from_dict(__import__("json").loads(sys.argv[1]))
with Batch("benchmark", warm=False) as batch:
    for cfg in sw.grid(spec):
        batch.start(cfg).wait(processes=False)
"""


def sweep_cost(n: int, argv: list[str], rounds: int) -> None:
    """A sweep of ``n`` runs (on warm ranks) against the same ``n`` runs started cold one after
    another (as sweeps ran before warm ranks) and against one run of the same job, in turn."""
    sweep_argv = [*argv, "--matrix-approximation-rank", "1", "--start-powersgd-iter", "0",
                  "--no-use-error-feedback", "--no-warm-start", "--repeats", str(n), "--no-baseline"]
    took: dict[str, list[float]] = {"one run": [], "sweep, warm ranks": [], "the same runs, cold": []}
    overhead: dict[str, list[float]] = {k: [] for k in took}
    between: list[float] = []
    with tempfile.TemporaryDirectory(prefix="commlab-sweep-cost-") as tmp:
        for k in range(rounds):
            runs_dir = Path(tmp) / str(k)
            jobs = {
                "one run": ([sys.executable, "-m", "commlab", "run", *argv, "--json"], runs_dir / "one"),
                "sweep, warm ranks": ([sys.executable, "-m", "commlab", "sweep", *sweep_argv, "--json"],
                                      runs_dir / "warm"),
                "the same runs, cold": ([sys.executable, "-c", COLD_RUNS, json.dumps(_spec(sweep_argv, runs_dir / "cold"))],
                                        runs_dir / "cold")}
            for name, (command, where) in jobs.items():
                if "--json" in command:
                    command = [*command, "--runs-dir", str(where)]
                t0 = time.monotonic()
                subprocess.run(command, capture_output=True, check=True, cwd=ROOT, timeout=1800)
                took[name].append(time.monotonic() - t0)
                runs = _runs(where)
                trained = sum(r.metrics_records()[-1]["t"] for r in runs)
                overhead[name].append((took[name][-1] - trained) / len(runs))
                if name == "sweep, warm ranks":
                    between += [b.meta()["phases"]["set_up"] - a.status_record()["at"] for a, b in zip(runs, runs[1:])]
    one = statistics.median(took["one run"])
    print(f"\n{n} runs of {argv[argv.index('--steps') + 1]} steps, {rounds} rounds, medians "
          f"(load {os.getloadavg()[0]:.1f}):")
    for name in took:
        print(f"  {name:<22} {statistics.median(took[name]):6.1f} s = {statistics.median(took[name]) / one:4.2f}x "
              f"one run; beyond its steps {statistics.median(overhead[name]):.2f} s a run")
    print(f"  on warm ranks, from a run's recorded end to the next one set up: median "
          f"{statistics.median(between):.2f} s (max {max(between):.2f})")


def _spec(sweep_argv: list[str], runs_dir: Path) -> dict:
    from commlab.cli import build_parser
    from commlab.commands.sweep import spec_from_args

    args = build_parser().parse_args(["sweep", *sweep_argv, "--runs-dir", str(runs_dir)])
    return spec_from_args(args).to_dict()


def _runs(where: Path) -> list:
    """The run folders under ``where`` (a sweep's too), in the order they were started."""
    runs = [run_folder.RunFolder(p.parent) for p in where.glob("*/config.json")]
    return sorted(runs, key=lambda r: r.launch_info()["created_at"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--workload", default="mlp")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--sweep", type=int, default=0, metavar="N", help="also a sweep of N runs against one")
    p.add_argument("--rounds", type=int, default=2, help="sweep/one-run pairs (with --sweep)")
    args = p.parse_args()
    argv = ["--workload", args.workload, "--steps", str(args.steps), "--world-size", str(args.world_size),
            "--eval-every", "0", "--no-save-checkpoint"]
    with tempfile.TemporaryDirectory(prefix="commlab-startup-") as tmp:
        one_run(argv, Path(tmp))  # the page cache warmed, as a person's second run finds it
        times, loads = {start: [] for start in STARTS}, []
        for _ in range(args.runs):
            for start, env in STARTS.items():
                loads.append(os.getloadavg()[0])
                times[start].append(one_run(argv, Path(tmp), env))
    print(f"{args.runs} runs each of `commlab run {' '.join(argv)}`, the ranks forked and exec'd in turn; "
          f"load {min(loads):.1f} to {max(loads):.1f}")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):  # as a machine that sets it runs the lab, not as most do
        print("PYTHONDONTWRITEBYTECODE is set: a module with no compiled copy cached yet is compiled "
              "again by every process that imports it (0.03 to 0.1 s each for the CLI, the supervisor, torchrun)")
    print(f"{'phase (median s, min-max)':<40}" + "".join(f"{start:>20}" for start in STARTS))
    for name, a, b in PHASES:
        cells = []
        for start in STARTS:
            spans = [t[b] - t[a] for t in times[start]]
            cells.append(f"{statistics.median(spans):.2f} ({min(spans):.2f}-{max(spans):.2f})")
        print(f"{name:<40}" + "".join(f"{c:>20}" for c in cells))
    if args.sweep:
        sweep_cost(args.sweep, argv, args.rounds)


if __name__ == "__main__":
    main()
