"""One traced step of a sharded run, rank 0's collectives by unit: FSDP, and HSDP 2 x 2 with PowerSGD
between the replicas, the mlp on 4 Gloo ranks.

    python benchmarks/sharded_timeline.py [--step 3] [--runs-dir DIR]

Each run trains ``--step`` + 1 steps and traces the last (PowerSGD compresses from step 2); a table
per run: each phase and collective of the step (``commlab.analysis.timeline``), its unit, traffic,
ranks, message size S and counted bytes (as the ledger files them), issued and completed in ms
from the step's first event, in the order issued.
"""
from __future__ import annotations

import argparse
import tempfile

from commlab import api
from commlab.config import RunConfig

RUNS = {"fsdp": {"sharding": "fsdp"},
        "hsdp + powersgd": {"sharding": "hsdp", "replicas": 2, "hook": "powersgd",
                            "matrix_approximation_rank": 1, "start_powerSGD_iter": 2}}


def table(events: list[dict]) -> list[str]:
    events = sorted(events, key=lambda e: e["start"])
    t0 = events[0]["start"]
    lines = ["| event | unit | traffic | ranks | S bytes | counted bytes | issued ms | completed ms |",
             "|---|---|---|---|---|---|---|---|"]
    for e in events:
        unit = "" if "unit" not in e else e["unit"] or "root"
        lines.append(f"| {e.get('collective', e['kind'])} | {unit} | {e.get('category', '')} | "
                     f"{e.get('ranks', '')} | {e.get('size_bytes', '')} | {e.get('bytes', '')} | "
                     f"{(e['start'] - t0) * 1e3:.2f} | {(e['end'] - t0) * 1e3:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=int, default=3)
    parser.add_argument("--runs-dir", default=None, help="where the runs go (a temporary folder if unset)")
    args = parser.parse_args()
    runs_dir = args.runs_dir or tempfile.mkdtemp(prefix="sharded_timeline-")
    for name, settings in RUNS.items():
        run = api.launch(RunConfig(workload="mlp", world_size=4, steps=args.step + 1, eval_every=0,
                                   trace_steps=[args.step], runs_dir=runs_dir, **settings))
        if run.wait(600) != "finished":
            raise SystemExit(f"{name}: {run.status_record()}")
        print(f"\n{name}, step {args.step}, rank 0 ({run.path}):\n")
        print("\n".join(table(run.timeline()["steps"][str(args.step)]["0"])))


if __name__ == "__main__":
    main()
