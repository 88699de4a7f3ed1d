"""What listing runs costs when one run has a big metrics.jsonl: ``run_table`` (the Runs page's
rows), ``run_choices`` (every run picker) and the Runs page itself (AppTest), each in a fresh
process, reporting wall time, CPU time (steadier on a shared machine; it includes importing
torch and Streamlit) and peak resident memory.

    python benchmarks/runs_page.py [--mb 200] [--json]

The runs folder is made in a temporary folder: one finished run whose metrics.jsonl holds
instrumented step records (as rank 0 writes them) up to the size asked for, beside a small run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from commlab.config import RunConfig  # noqa: E402
from commlab.engine import store  # noqa: E402

MEASURE = {
    "run_table": "from commlab.ui import runs; runs.run_table(RUNS)",
    "run_table twice": "from commlab.ui import runs; runs.run_table(RUNS); runs.run_table(RUNS)",
    "run_choices": "from commlab.ui import runs; runs.run_choices(RUNS)",
    "Runs page": ("from streamlit.testing.v1 import AppTest; os.environ['COMMLAB_RUNS_DIR'] = RUNS; "
                  "at = AppTest.from_file(os.path.join(ROOT, 'app.py'), default_timeout=900); "
                  "at.run(); at.switch_page('pages/runs.py').run(); "
                  "assert not at.exception, at.exception"),
    # Wall time of the second look only: what every rerun of the page costs once it has read a run.
    "Runs page rerun": ("from streamlit.testing.v1 import AppTest; os.environ['COMMLAB_RUNS_DIR'] = RUNS; "
                        "at = AppTest.from_file(os.path.join(ROOT, 'app.py'), default_timeout=900); "
                        "at.run(); at.switch_page('pages/runs.py').run(); t0 = time.perf_counter(); "
                        "at.run(); assert not at.exception, at.exception"),
}
PROBE = """
import os, resource, sys, time
ROOT, RUNS = sys.argv[1], sys.argv[2]
sys.path.insert(0, ROOT)
t0 = time.perf_counter()
{code}
use = resource.getrusage(resource.RUSAGE_SELF)
print(time.perf_counter() - t0, use.ru_utime + use.ru_stime, use.ru_maxrss / 1024)
"""


def make_runs(root: Path, mb: float) -> None:
    for name, size in (("20250101-000000-big-0001", mb * 1e6), ("20250101-000000-small-0002", 1e4)):
        folder = root / name
        folder.mkdir()
        cfg = RunConfig(hook="powersgd", steps=10**7, start_powerSGD_iter=10, runs_dir=str(root))
        store.write_json(folder / "config.json", cfg.to_dict())
        store.write_json(folder / "launch.json", {"backend": "gloo", "hook_impl": "commlab"})
        store.write_json(folder / "status.json", {"status": "finished", "step": None})
        with open(folder / "metrics.jsonl", "w") as f:
            step = written = 0
            while written < size:
                line = json.dumps({
                    "step": step, "loss": 2.0 / (1 + step * 1e-4), "step_s": 0.01 + (step % 7) * 1e-4,
                    "t": step * 0.0101, "payload_bytes": 41234, "wire_bytes": 41234,
                    "plain_bytes": 812345, "collectives": 4, "compression_ratio": 19.7,
                    "hook_s": 0.0031 + (step % 5) * 1e-5, "measure_bytes": 0,
                    "powersgd_iter": step}) + "\n"
                f.write(line)
                written += len(line)
                step += 1


def measure(code: str, runs_dir: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE.format(code=code), str(ROOT), str(runs_dir)],
                         capture_output=True, text=True, check=True)
    seconds, cpu_s, peak_mb = map(float, out.stdout.split()[-3:])
    return {"seconds": round(seconds, 2), "cpu_s": round(cpu_s, 2), "peak_rss_mb": round(peak_mb)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=200.0, help="size of the big metrics.jsonl")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        make_runs(Path(tmp), args.mb)
        results = {name: measure(code, Path(tmp)) for name, code in MEASURE.items()}
    for name, r in results.items():
        print(f"{name:<16} {r['seconds']:>8.2f} s wall {r['cpu_s']:>8.2f} s CPU "
              f"{r['peak_rss_mb']:>7} MB peak RSS")
    if args.json:
        print(json.dumps({"mb": args.mb, **results}))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
