"""Adding a way of running is one module: a toy launcher, written into a copy of the project as a
module of commlab.engine.launchers and nothing else, starts a real 2-rank run, is found again from
the run folder by its supervisor and by a Stop given from another process, and is asked by that Stop."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # a copy of the project and real runs

TOY_MODULE = '''"""A toy way of running: this machine's, marked in launch.json, and told of a Stop."""
from commlab.engine import store
from commlab.engine.launchers.base import Launcher


class Toy(Launcher):
    name = "toy"

    @classmethod
    def owns(cls, info):
        return bool(info.get("toy"))

    def records(self, cfg, records):
        return {**super().records(cfg, records), "toy": True}

    def ask_to_stop(self, folder, grace_s):
        store.write_json(folder.file("toy-stop.json"), {"asked": True})

    def describe(self, cfg, info):
        return f"{cfg.world_size} rank(s) the toy's way"
'''
START = '''
import json, sys
from commlab.config import RunConfig
from commlab.engine import launch, launchers
from commlab.engine.launchers.toy import Toy

cfg = RunConfig(workload="mlp", world_size=2, steps=int(sys.argv[1]), runs_dir=sys.argv[2])
run = launch.start(cfg, Toy())
if sys.argv[1] == "3":
    run.wait()
else:  # long: wait for a step, then leave it to another process's Stop
    launch.procs.wait_until(lambda: run.metrics_records() or not run.is_running(), 300)
print(json.dumps({"run": str(run.path), "status": run.status(), "kinds": [k.name for k in launchers.kinds()],
                  "found": type(launchers.of(run.launch_info())).__name__,
                  "shown": launchers.of(run.launch_info()).describe(cfg, run.launch_info())}))
'''
STOP = '''
import json, sys
from commlab.engine import launch
print(json.dumps({"status": launch.open_run(sys.argv[1]).stop()}))
'''


def _copy(tmp_path: Path) -> Path:
    dest = tmp_path / "commlab"
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".git", ".venv", "runs", "test-artifacts", "__pycache__", "*.egg-info", "build", ".whl"))
    (dest / "commlab" / "engine" / "launchers" / "toy.py").write_text(TOY_MODULE)
    return dest


def _run(copy: Path, code: str, *argv: str) -> dict:
    # The copy's commlab, not the installed one: it comes first on the path (the supervisor's too).
    env = {**os.environ, "PYTHONPATH": str(copy)}
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_toy_launcher_module_runs_and_stops_a_run(tmp_path):
    copy = _copy(tmp_path)
    runs = str(tmp_path / "runs")
    done = _run(copy, START, "3", runs)
    assert done["status"] == "finished"
    assert done["kinds"][-1] == "local" and "toy" in done["kinds"]  # found among the ways, the fallback last
    assert done["found"] == "Toy" and done["shown"] == "2 rank(s) the toy's way"
    assert json.loads((Path(done["run"]) / "launch.json").read_text())["toy"] is True

    going = _run(copy, START, "100000", runs)
    assert going["status"] == "running"
    stopped = _run(copy, STOP, going["run"])
    assert stopped["status"] == "stopped"
    assert json.loads((Path(going["run"]) / "toy-stop.json").read_text()) == {"asked": True}
