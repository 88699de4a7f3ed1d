"""``commlab runs``: every run with its status; with ``--json`` each run's communication ledger too."""
from __future__ import annotations


def _runs(args) -> int:
    from commlab.analysis.ledger import totals
    from commlab.analysis.units import number
    from commlab.api import RunStatus, list_runs
    from commlab.commands import emit
    from commlab.config import default_runs_dir

    runs = list_runs(args.runs_dir or default_runs_dir())
    rows = [r.summary() | {"name": r.notes()["name"], "ledger": _ledger(r, totals)} for r in runs]
    lines = [f"{r['run_id']:<60} {r['error']}" if r["status"] == RunStatus.DAMAGED else
             f"{r['run_id']:<60} {r['status']:<9} {_hook(r)} "
             f"steps {number(r['steps'])}/{number(r['steps_planned'])} loss {number(r['final_loss'])}"
             + (f"  \"{r['name']}\"" if r["name"] else "")
             + (f" ({r['skipped_lines']} damaged metrics line(s) skipped)" if r["skipped_lines"] else "")
             for r in rows]
    emit(args, {"runs": rows}, "\n".join(lines) or "no runs yet: start one with `commlab run`")
    return 0


def _hook(row: dict) -> str:
    """The hook, and the compress wrapper around it where there is one ("powersgd in fp16_wrapper")."""
    return row["hook"] if row["wrapper"] in (None, "none") else f"{row['hook']} in {row['wrapper']}_wrapper"


def _ledger(run, totals) -> dict:
    """ledger.json with its totals by traffic ({} when the run has none)."""
    written = run.ledger()
    return written and {**written, "totals": totals(written["rows"])}


def register(sub) -> None:
    p = sub.add_parser("runs", help="list every run with its status")
    p.add_argument("--runs-dir", metavar="DIR",
                   help="the folder of run folders (default: $COMMLAB_RUNS_DIR, else ./runs)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text, with "
                   "each run's communication ledger (ledger.json and its totals by traffic)")
    p.set_defaults(func=_runs)
