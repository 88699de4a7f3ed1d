"""Where a sweep's wall time goes: start-up, training, the end of each run, and the gaps between runs.

    python benchmarks/sweep_startup.py                       # runs a 4-setting x 3-seed sweep at the
                                                             # default steps, then reads it
    python benchmarks/sweep_startup.py --steps 50 --workload mlp
    python benchmarks/sweep_startup.py --read runs/sweeps/<id>   # reads a sweep already run

Per run, from its folder: start-up is launch (launch.json's created_at) to rank 0 entering the
training loop (meta.json's started_at: torchrun, imports, the process group, the model, DDP);
training is the last step's ``t`` (held-out evaluations included); the end is from there to the
run recording its end (status.json: checkpoint, the last evaluation); a gap is one run's end to
the next run's launch (the processes' exit, then the sweep's own idle time).  Printed, never asserted: the machine is shared.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from commlab.config import RunConfig  # noqa: E402
from commlab.engine import store  # noqa: E402
from commlab.tune import sweep as sw  # noqa: E402


def timeline(sweep: sw.Sweep) -> list[dict]:
    rows = []
    for run in sweep.runs():
        created = run.launch_info().get("created_at")
        started = run.meta().get("started_at")
        # A run that ends itself records no ended_at: its status file's last write is the end.
        ended = store.read_json(run.file("status.json"), {}).get("ended_at") or (
            run.file("status.json").stat().st_mtime if run.file("status.json").exists() else None)
        records = run.metrics_records()
        train = records[-1]["t"] if records else 0.0
        rows.append({"run": run.id, "status": run.status(), "created": created, "ended": ended,
                     "startup_s": (started - created) if started and created else None,
                     "train_s": train,
                     "end_s": (ended - started - train) if ended and started else None})
    for a, b in zip(rows, rows[1:]):
        a["gap_s"] = (b["created"] - a["ended"]) if a["ended"] and b["created"] else None
    return rows


def report(sweep: sw.Sweep, wall_s: float | None = None) -> None:
    rows = timeline(sweep)
    if not rows:
        print("no runs")
        return
    span = (rows[-1]["ended"] or time.time()) - rows[0]["created"]
    total = {k: sum(r.get(k) or 0.0 for r in rows) for k in ("startup_s", "train_s", "end_s", "gap_s")}
    print(f"sweep {sweep.id}: {len(rows)} runs, {sweep.status()}")
    print(f"{'run':<48} {'start-up s':>10} {'train s':>8} {'end s':>6} {'gap s':>6}")
    for r in rows:
        print(f"{r['run']:<48} {r['startup_s'] or 0:>10.2f} {r['train_s']:>8.2f} {r['end_s'] or 0:>6.2f} "
              f"{r.get('gap_s') or 0:>6.2f}")
    if wall_s is not None:
        print(f"wall time (the command): {wall_s:.1f} s")
    print(f"first launch to last end: {span:.1f} s")
    for k, name in (("startup_s", "start-up"), ("train_s", "training"), ("end_s", "end of run"),
                    ("gap_s", "gaps between runs")):
        print(f"  {name:<18} {total[k]:8.1f} s  {total[k] / span:6.1%}")
    starts = [r["startup_s"] for r in rows if r["startup_s"] is not None]
    if starts:
        print(f"start-up per run: median {statistics.median(starts):.2f} s, "
              f"min {min(starts):.2f}, max {max(starts):.2f}")
    print(f"overhead share (start-up + end + gaps): "
          f"{(total['startup_s'] + total['end_s'] + total['gap_s']) / span:.1%}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--read", help="a sweep folder to read instead of running one")
    p.add_argument("--workload", default=RunConfig.workload)
    p.add_argument("--steps", type=int, default=RunConfig.steps)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--runs-dir", default=None)
    args = p.parse_args()
    if args.read:
        report(sw.Sweep(args.read))
        return
    import tempfile

    base = RunConfig(workload=args.workload, steps=args.steps, stall_timeout_s=1200,
                     runs_dir=args.runs_dir or tempfile.mkdtemp(prefix="commlab-sweep-bench-"))
    spec = sw.SweepSpec(base=base, repeats=args.repeats)  # baseline + ranks 1, 2, 4: 4 settings
    t0 = time.time()
    sweep = sw.run_sweep(spec, lambda p: None)
    report(sweep, time.time() - t0)


if __name__ == "__main__":
    main()
