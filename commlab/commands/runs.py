"""``commlab runs``: every run with its status."""
from __future__ import annotations


def _runs(args) -> int:
    from commlab.api import list_runs
    from commlab.commands import emit

    rows = [r.summary() for r in list_runs(args.runs_dir)]
    lines = [f"{r['run_id']:<60} {r['error']}" if r["status"] == "damaged" else
             f"{r['run_id']:<60} {r['status']:<9} {r['hook']}/{r['wrapper']} "
             f"steps {r['steps']}/{r['steps_planned']} loss {r['final_loss']}"
             + (f" ({r['skipped_lines']} damaged metrics line(s) skipped)" if r["skipped_lines"] else "")
             for r in rows]
    emit(args, {"runs": rows}, "\n".join(lines) or "no runs yet: start one with `commlab run`")
    return 0


def register(sub) -> None:
    p = sub.add_parser("runs", help="list every run with its status")
    p.add_argument("--runs-dir")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_runs)
