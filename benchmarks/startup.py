"""Where a short run's seconds go, phase by phase, from the command to its return:

    python benchmarks/startup.py [--runs 5] [--workload mlp] [--steps 1] [--world-size 2]

Each run is ``commlab run ... --json`` as a person types it; the phases are read off the run
folder's own records (launch.json's ``created_at``,
supervisor.json's ``up_at``, rank 0's
meta.json ``phases`` (rank 0's: its imports done, the process group, DDP and the hook set up) and ``started_at``, the first step's time, the finished status's ``at``) and
the command's return is timed here.  Medians over ``--runs``, with the load beside them (these
machines are shared: a busy one stretches every phase).
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--workload", default="mlp")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--world-size", type=int, default=2)
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


if __name__ == "__main__":
    main()
