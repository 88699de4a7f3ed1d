"""Where a short run's seconds go, phase by phase, from the command to its return; and what a
sweep of short runs pays beyond its runs' own steps:

    python benchmarks/startup.py [--runs 5] [--workload mlp] [--steps 1] [--world-size 2] [--sweep 4]

Each run is ``commlab run ... --json`` as a person types it; the phases are read off the run
folder's own records (launch.json's ``created_at``,
supervisor.json's ``up_at``, rank 0's
meta.json ``phases`` (rank 0's: its imports done, the process group, DDP and the hook set up) and ``started_at``, the first step's time, the finished status's ``at``) and
the command's return is timed here.  Medians over ``--runs``, with the load beside them (these
machines are shared: a busy one stretches every phase).  ``--sweep N``: ``commlab sweep`` of N
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

from commlab.engine import store  # noqa: E402

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


def one_run(argv: list[str], runs_dir: Path) -> dict[str, float]:
    command = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "commlab", "run", *argv, "--runs-dir", str(runs_dir),
                             "--json"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    out, _ = proc.communicate(timeout=600)
    returned = time.time()
    payload = json.loads(out.strip().splitlines()[-1])
    run = store.RunFolder(payload["run_dir"])
    launch, sup, meta = run.launch_info(), run.supervisor(), run.meta()
    first = run.metrics_records()[0]
    return {"command": command, "folder": launch["created_at"], "supervisor": sup["up_at"],
            "imported": meta["phases"]["imported"], "process_group": meta["phases"]["process_group"],
            "set_up": meta["phases"]["set_up"], "first_step": meta["started_at"] + first["t"],
            "ended": run.status_record().get("at") or run.status_record().get("ended_at"),
            "returned": returned}


def sweep_cost(n: int, argv: list[str], rounds: int) -> None:
    """A sweep of ``n`` runs against one run of the same job, ABAB."""
    sweep_argv = [*argv, "--matrix-approximation-rank", "1", "--start-powersgd-iter", "0",
                  "--no-use-error-feedback", "--no-warm-start", "--repeats", str(n), "--no-baseline"]
    one, whole, overhead = [], [], []
    with tempfile.TemporaryDirectory(prefix="commlab-sweep-cost-") as tmp:
        for k in range(rounds):
            runs_dir = Path(tmp) / str(k)
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-m", "commlab", "run", *argv, "--runs-dir", str(runs_dir),
                            "--json"], capture_output=True, check=True, cwd=ROOT, timeout=600)
            one.append(time.monotonic() - t0)
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-m", "commlab", "sweep", *sweep_argv, "--runs-dir",
                            str(runs_dir / "sweep"), "--json"], capture_output=True, check=True, cwd=ROOT,
                           timeout=1800)
            whole.append(time.monotonic() - t0)
            trained = sum(store.RunFolder(p).metrics_records()[-1]["t"]
                          for p in (runs_dir / "sweep").glob("2*") if (p / "config.json").exists())
            overhead.append((whole[-1] - trained) / n)
    print(f"\nsweep of {n} runs of {argv[argv.index('--steps') + 1]} steps against one run, {rounds} rounds:")
    print(f"  one run {statistics.median(one):.1f} s; the sweep {statistics.median(whole):.1f} s = "
          f"{statistics.median(w / o for w, o in zip(whole, one)):.2f}x one run; overhead per run "
          f"{statistics.median(overhead):.1f} s")


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
        times, loads = [], []
        for _ in range(args.runs):
            loads.append(os.getloadavg()[0])
            times.append(one_run(argv, Path(tmp)))
    print(f"{args.runs} runs of `commlab run {' '.join(argv)}`; load {min(loads):.1f} to {max(loads):.1f}")
    print(f"{'phase':<40} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, a, b in PHASES:
        spans = [t[b] - t[a] for t in times]
        print(f"{name:<40} {statistics.median(spans):9.2f} {min(spans):7.2f} {max(spans):7.2f}")
    if args.sweep:
        sweep_cost(args.sweep, argv, args.rounds)


if __name__ == "__main__":
    main()
