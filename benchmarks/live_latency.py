"""How long a metric line takes from metrics.jsonl to the live chart in a real browser, at several
points of one long run:

    python benchmarks/live_latency.py [--at 1000,10000,100000] [--workload mlp] [--window 10]

Streamlit serves the lab (``streamlit run app.py``, on loopback), a 2-rank run trains, Chromium
(Playwright) shows its live page; the measure is the browser test's own (``tests/test_browser.py``:
each step's line timed as it lands in the file, and as the loss chart first holds it).  When the
run passes each step of ``--at``, the steps written over ``--window`` seconds are measured, each
given 8 s to reach the screen: median, p90 and max, with the load beside them (the run itself
loads both cores: that is the case measured).  Needs Chromium and the test extra (playwright).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_browser import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    GRACE_S,
    OBSERVE_CHART,
    WriteTimes,
    free_port,
    start_streamlit,
    write_to_screen,
)

from commlab import api  # noqa: E402
from commlab.engine import procs  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--at", default="1000,10000,100000", help="steps to measure at, comma-separated")
    p.add_argument("--workload", default="mlp")
    p.add_argument("--window", type=float, default=10.0, help="seconds of steps measured at each")
    args = p.parse_args()
    marks = sorted(int(x) for x in args.at.split(","))
    # A kill ends the run and the server too (the ``finally`` below runs on SIGTERM as on Ctrl-C).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="commlab-live-") as tmp:
        runs_dir = Path(tmp) / "runs"
        runs_dir.mkdir()
        port = free_port()
        server = start_streamlit(runs_dir, port)
        writes = WriteTimes(runs_dir)
        run = api.launch(api.RunConfig(workload=args.workload, steps=marks[-1] + 100_000, eval_every=0,
                                       save_checkpoint=False, runs_dir=str(runs_dir)))
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 1400})
                page.set_default_timeout(900_000)
                page.goto(f"http://127.0.0.1:{port}/")
                page.evaluate(OBSERVE_CHART)
                writes.start()
                print(f"{'at step':>9} {'steps':>6} {'median s':>9} {'p90 s':>6} {'max s':>6} {'load':>5}")
                for mark in marks:
                    while max(writes.snapshot(), default=-1) < mark:
                        if not run.is_running():
                            raise SystemExit(f"the run ended before step {mark}: {run.status_record()}")
                        time.sleep(0.5)
                    since = time.time()
                    time.sleep(args.window + GRACE_S)
                    shown = {int(k): v / 1000 for k, v in page.evaluate("window.__shown").items()}
                    got = write_to_screen({s: t for s, t in writes.snapshot().items()
                                           if since < t < since + args.window}, shown, time.time())
                    print(f"{mark:>9,} {got['steps']:>6} {got['median_s']:>9.2f} {got['p90_s']:>6.2f} "
                          f"{got['max_s']:>6.2f} {os.getloadavg()[0]:>5.1f}", flush=True)
                browser.close()
        finally:
            writes.done.set()
            run.stop()
            procs.kill_tree(server.pid, grace_s=30)
            server.wait()


if __name__ == "__main__":
    main()
