"""A sweep folder is self-contained: made in one working folder, moved, and read from another, it
reads the same in ``--show``, ``commlab whatif --sweep``, the runs list and the Sweep page; an older
sweep whose state named its runs relative to the working folder it was made in reads the same too.

One real sweep (allreduce and PowerSGD r=1, one seed, 4 steps) made with a relative ``--runs-dir``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commlab import cli
from commlab.tune import sweep as sw
from commlab.ui.runs import sweep_of

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 1200  # two runs reach their ends in 30 s idle, minutes on a loaded machine


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    """The sweep made in ``made/`` with ``--runs-dir runs``, then its runs folder moved to ``elsewhere/moved``."""
    made, elsewhere = tmp_path_factory.mktemp("made"), tmp_path_factory.mktemp("elsewhere")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "commlab", "sweep", "--workload", "mlp", "--steps", "4",
                          "--world-size", "2", "--matrix-approximation-rank", "1",
                          "--start-powersgd-iter", "2", "--repeats", "1", "--runs-dir", "runs", "--json"],
                         capture_output=True, text=True, cwd=made, env=env, timeout=RUN_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    before = json.loads(out.stdout.splitlines()[-1])
    shutil.move(made / "runs", elsewhere / "moved")
    return {"runs_dir": elsewhere / "moved", "before": before, "made": made}


def _same_findings(after: dict, before: dict) -> None:
    assert after["status"] == before["status"] == "finished"
    assert [r["status"] for r in after["runs"]] == ["finished", "finished"]
    assert [s["label"] for s in after["settings"]] == [s["label"] for s in before["settings"]]
    assert [s["quality_mean"] for s in after["settings"]] == [s["quality_mean"] for s in before["settings"]]
    assert after["recommendation"]["text"] == before["recommendation"]["text"]


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_a_moved_sweep_reads_the_same_from_another_folder(moved, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # neither the folder it was made in nor the one it is in now
    runs_dir = str(moved["runs_dir"])
    (sweep,) = sw.list_sweeps(runs_dir)
    assert sweep.status() == "finished" and [r.status() for r in sweep.runs()] == ["finished"] * 2
    assert all(r.path.parent.resolve() == moved["runs_dir"].resolve() for r in sweep.runs())
    assert Path(sweep.spec().base.runs_dir).resolve() == moved["runs_dir"].resolve()  # a resume runs there

    assert cli.main(["sweep", "--show", sweep.id, "--runs-dir", runs_dir, "--json"]) == 0
    _same_findings(json.loads(capsys.readouterr().out.splitlines()[-1]), moved["before"])

    assert cli.main(["whatif", "--sweep", sweep.id, "--runs-dir", runs_dir, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out.splitlines()[-1])["profiles"]) == 2

    assert set(sweep_of(runs_dir)) == {str(r.path.resolve()) for r in sweep.runs()}

    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMMLAB_RUNS_DIR", runs_dir)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900).run()
    at.switch_page("pages/sweep.py").run()
    assert not at.exception, [e.value for e in at.exception]
    shown = " ".join(e.value for kind in ("warning", "info", "success", "error", "caption")
                     for e in at.get(kind))
    assert "Status: **finished**" in shown and "lost" not in shown
    assert moved["before"]["recommendation"]["text"] in shown
    assert f"**Next**: run 3 seeds per setting: commlab sweep --resume {sweep.id}" in shown


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_an_older_sweep_s_working_folder_paths_read_the_same(moved, tmp_path, monkeypatch):
    """Sweeps made before run paths were stored relative to the runs folder named them relative to
    the working folder they were made in: ``runs/<run>``."""
    monkeypatch.chdir(tmp_path)
    (sweep,) = sw.list_sweeps(moved["runs_dir"])
    state = json.loads(sweep.file("state.json").read_text())
    old = {**state, "runs": [{**e, "run_dir": str(Path("runs") / e["run_dir"])} for e in state["runs"]]}
    sweep.file("state.json").write_text(json.dumps(old))
    try:
        _same_findings(sweep.report(), moved["before"])
    finally:
        sweep.file("state.json").write_text(json.dumps(state))


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_the_table_explains_itself_and_its_next_step_runs(moved, tmp_path, monkeypatch, capsys):
    """Last: it adds seeds to the sweep.  One seed cannot decide: the table says so per setting and
    prints the command that would, with its time; that command, run from a third folder, runs the
    new seeds into the moved runs folder and keeps the first seed's runs."""
    monkeypatch.chdir(tmp_path)
    runs_dir = str(moved["runs_dir"])
    (sweep,) = sw.list_sweeps(runs_dir)
    first = [r.path for r in sweep.runs()]
    assert cli.main(["sweep", "--show", sweep.id, "--runs-dir", runs_dir]) == 0
    text = capsys.readouterr().out
    assert "Columns: seeds = finished / planned; loss = held-out loss" in text
    assert "within a tolerance of 5% of its loss (--tolerance-pct)" in text
    assert "verdict: too few seeds: 1 seed cannot separate these: run 3 or more" in text
    command = f"commlab sweep --resume {sweep.id} --runs-dir {runs_dir} --repeats 3"
    assert f"next: run 3 seeds per setting: {command}  (4 run(s), about " in text.replace("\n  ", " ")
    assert all(len(line) <= 100 for line in text.splitlines()
               if not line.lstrip().startswith(("rule:", "recommendation:", "sweep ", "pays here?")))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", *command.split(), "--json"], capture_output=True,
                         text=True, cwd=tmp_path, env=env, timeout=RUN_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = sweep.runs()
    assert [r.status() for r in runs] == ["finished"] * 6 and [r.path for r in runs[:2]] == first
    assert [r.config().seed for r in runs] == [0, 0, 1, 1, 2, 2]
    assert all(r.path.parent.resolve() == moved["runs_dir"].resolve() for r in runs)
    verdicts = json.loads(out.stdout.splitlines()[-1])["recommendation"]["verdicts"]
    assert [v["pairs"] for v in verdicts] == [3] and verdicts[0]["verdict"] != "too few seeds"
    # Three seeds now: the what-if answers once per setting, in lines a terminal shows whole.
    assert cli.main(["whatif", "--sweep", sweep.id, "--runs-dir", runs_dir]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("where each setting"))
    said = lines[start:lines.index("", start)] if "" in lines[start:] else lines[start:]
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    assert [line.split(":")[0] for line in said if not line.startswith(" ")][1:] == ["powersgd r=1 start=2"]
    assert "#" not in "".join(said)
    # ... and its measured table too: one line per setting with its seeds counted, no "#2" per run.
    measured = lines[2:lines.index("")]
    assert [re.split(r"\s{2,}", line)[:2] for line in measured] == [["allreduce", "3"], ["powersgd r=1 start=2", "3"]]
