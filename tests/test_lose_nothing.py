"""Resume and sweeps that lose nothing, each attack reproduced first: checkpoints checked before
anything starts (a truncated file, swapped files, another model's, another world size's, another
hook's, a damaged record), a sweep whose process dies ends its run and a resume never starts a
second beside it, two sweeps created at one instant, a child the workload check leaves behind,
unbounded trace steps and logs, and a Stop after the last step."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from commlab import cli
from commlab.config import ConfigError, RunConfig
from commlab.engine import checkpoint, run_folder, store, supervisor
from commlab.engine.launch import Run
from commlab.tune import sweep as sw

ROOT = Path(__file__).resolve().parents[1]


# ============================================================================ resume checks its files
def _copy(run, tmp_path: Path, name: str) -> Path:
    dest = tmp_path / name
    shutil.copytree(run.path, dest)
    return dest


def _retag(folder: Path, **changes) -> None:
    """The copied run's config.json and launch's own settings changed, as an attacker would."""
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **changes}))


def _refused(folder: Path, capsys) -> str:
    """``commlab run --resume``: exit 2, nothing started, the source untouched; the message."""
    before = sorted(p.name for p in folder.parent.iterdir())
    stamp = {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}
    assert cli.main(["run", "--resume", str(folder), "--runs-dir", str(folder.parent), "--json"]) == 2
    assert sorted(p.name for p in folder.parent.iterdir()) == before  # no run folder was made
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} == stamp
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["errors"]["resume"]


@pytest.mark.slow
def test_a_truncated_file_is_named(powersgd_run, tmp_path, capsys):
    folder = _copy(powersgd_run, tmp_path, "truncated")
    rank0 = folder / "checkpoint" / "rank0.pt"
    rank0.write_bytes(rank0.read_bytes()[:1000])
    assert "checkpoint/rank0.pt cannot be read" in _refused(folder, capsys)


@pytest.mark.slow
def test_swapped_files_are_named(powersgd_run, tmp_path, capsys):
    folder = _copy(powersgd_run, tmp_path, "swapped")
    a, b = folder / "checkpoint" / "rank0.pt", folder / "checkpoint" / "rank1.pt"
    a.rename(folder / "x.pt"), b.rename(a), (folder / "x.pt").rename(b)
    assert "checkpoint/rank0.pt is rank 1's file, not rank 0's" in _refused(folder, capsys)


@pytest.mark.slow
def test_another_model_s_checkpoint_is_named(powersgd_run, tmp_path, capsys):
    folder = _copy(powersgd_run, tmp_path, "other_model")
    _retag(folder, workload="cnn")
    said = _refused(folder, capsys)
    assert "checkpoint/rank0.pt: its model is not cnn's: parameter" in said, said


@pytest.mark.slow
def test_another_world_size_is_named(powersgd_run, tmp_path, capsys):
    folder = _copy(powersgd_run, tmp_path, "three_ranks")
    _retag(folder, world_size=3)
    said = _refused(folder, capsys)
    assert "checkpoint.json holds 2 ranks' files, the run has 3 ranks" in said, said


@pytest.mark.slow
@pytest.mark.parametrize("hook, saved_by", [("allreduce", "powersgd"), ("powersgd", "allreduce")])
def test_a_checkpoint_of_another_hook_is_named(powersgd_run, allreduce_run, tmp_path, capsys,
                                              hook, saved_by):
    source = powersgd_run if saved_by == "powersgd" else allreduce_run
    folder = _copy(source, tmp_path, f"{saved_by}_as_{hook}")
    _retag(folder, hook=hook)
    said = _refused(folder, capsys)
    assert f"was saved by a run of {saved_by}, this run is {hook}: the hook cannot change on resume" in said


@pytest.mark.slow
def test_a_damaged_record_is_named(powersgd_run, tmp_path, capsys):
    folder = _copy(powersgd_run, tmp_path, "damaged_record")
    (folder / "checkpoint.json").write_text('{"step": "eleven"}')
    said = _refused(folder, capsys)
    assert "damaged: checkpoint.json" in said and "no complete checkpoint" not in said, said


@pytest.mark.slow
def test_a_checkpoint_that_fits_is_accepted(powersgd_run, allreduce_run):
    for run in (powersgd_run, allreduce_run):
        cfg = checkpoint.resume_config(run.path, steps=48)
        assert cfg.steps == 48 and not checkpoint.resume_errors(cfg, run.path)


# ============================================================================ the checkpoint's room
NAMESPACE = shutil.which("unshare")


def _in_small_disk(script: str, size: str) -> dict:
    """``script`` in a user and mount namespace of its own with a tmpfs of ``size`` at $DISK; it
    prints one JSON line last (as tests/test_damaged.py's full-disk tests)."""
    if not NAMESPACE or subprocess.run([NAMESPACE, "-Urm", "true"], capture_output=True).returncode:
        pytest.skip("no unprivileged user namespaces here to mount a small disk in")
    body = (f"mkdir -p /tmp/commlab-disk && mount -t tmpfs -o size={size} none /tmp/commlab-disk && "
            f"DISK=/tmp/commlab-disk {sys.executable} -c \"$0\"")
    out = subprocess.run([NAMESPACE, "-Urm", "sh", "-c", body, script], capture_output=True,
                         text=True, timeout=900, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_disk_that_fills_while_the_checkpoint_is_written_is_named_and_left_clean():
    got = _in_small_disk("""
import json, os, time
from pathlib import Path
from commlab.api import RunConfig, launch
from commlab.engine import store
disk = Path(os.environ["DISK"])
store.MIN_FREE_BYTES = 0
run = launch(RunConfig(workload="wide", steps=120, world_size=2, runs_dir=str(disk / "runs"),
                       stall_timeout_s=600, eval_every=0))
while not store.read_jsonl(run.file("metrics.jsonl")) and run.is_running():
    time.sleep(0.1)
meta = json.loads(run.file("meta.json").read_text())
with open(disk / "filler", "wb") as f:  # room for the metrics, not for the checkpoint
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    f.write(b"x" * max(0, free - 3 * 2**20))
status = run.wait(600)
print(json.dumps({"status": status, "record": run.status_record(), "meta": meta["checkpoint"],
                  "steps": len(run.metrics_records()),
                  "left": sorted(p.name for p in run.file("checkpoint").iterdir()) if run.file("checkpoint").exists() else []}))
""", "60m")
    assert got["meta"].startswith("saved as the run finishes"), got
    assert got["status"] == "failed", got
    assert "no space left on device writing checkpoint/rank" in got["record"]["error"], got["record"]
    assert got["steps"] == 120 and not [n for n in got["left"] if n.endswith(".tmp")], got


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_checkpoint_without_room_is_said_before_the_first_step_and_the_run_finishes():
    got = _in_small_disk("""
import json, os
from pathlib import Path
from commlab.api import RunConfig, run
from commlab.engine import store
store.MIN_FREE_BYTES = 0
r = run(RunConfig(workload="wide", steps=4, world_size=2, runs_dir=str(Path(os.environ["DISK"]) / "runs"),
                  eval_every=0), timeout=600)
print(json.dumps({"status": r.status(), "record": r.status_record(),
                  "meta": json.loads(r.file("meta.json").read_text())["checkpoint"],
                  "saved": r.file("checkpoint").exists()}))
""", "30m")
    assert got["status"] == "finished" and not got["saved"], got
    assert got["meta"].startswith("not saved: it needs about"), got
    assert got["record"]["note"].startswith("checkpoint not saved: it needs about"), got


# ============================================================================ sweeps
def _sweep_cli(runs_dir: Path, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "commlab", "sweep", "--workload", "mlp", "--steps", "100000",
            "--world-size", "2", "--matrix-approximation-rank", "1", "--no-baseline", "--repeats", "1",
            "--runs-dir", str(runs_dir), *extra]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)


def _going(runs_dir: Path) -> list[Run]:
    return [Run(p) for p in runs_dir.iterdir() if (p / "config.json").exists() and Run(p).is_running()]


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout} s")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_sweep_ends_its_run_and_a_resume_never_runs_a_second_beside_it(tmp_path):
    proc = _sweep_cli(tmp_path)
    resumed = None
    try:
        first = _wait(lambda: [r for r in _going(tmp_path) if r.metrics_records()], 600, "training run")[0]
        proc.kill()  # SIGKILL: the sweep's process cannot clean anything up
        proc.wait()
        killed_at = time.monotonic()
        assert first.wait(60) == "stopped", first.status_record()
        ended_in = time.monotonic() - killed_at
        assert f"its sweep {sw.list_sweeps(tmp_path)[0].id} ended" in first.status_record()["error"]
        (sweep,) = sw.list_sweeps(tmp_path)
        assert sweep.status() == "lost"
        resumed = subprocess.Popen([sys.executable, "-m", "commlab", "sweep", "--resume", sweep.id,
                                    "--runs-dir", str(tmp_path)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, cwd=ROOT)
        second = _wait(lambda: [r for r in _going(tmp_path) if r.path != first.path], 600, "resumed run")[0]
        assert [r.path for r in _going(tmp_path)] == [second.path]  # one run at a time, always
        state = sweep.state()
        assert state["replaced"] == [{"label": "powersgd r=1 start=20", "run_dir": first.path.name,
                                      "status": "stopped"}], state
        print(f"\nkill -9 of the sweep -> its run stopped in {ended_in:.1f} s")
    finally:
        for p in (proc, resumed):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGINT)
                p.wait(120)
        for r in _going(tmp_path):
            r.stop()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sweeps_created_at_one_instant_make_one_running_sweep(tmp_path):
    at = time.time() + 20  # every process imports first, then creates at the same instant
    script = f"""
import sys, time
from commlab.config import ConfigError, RunConfig
from commlab.tune import sweep as sw
spec = sw.SweepSpec(base=RunConfig(workload="mlp", runs_dir={str(tmp_path)!r}), repeats=1)
time.sleep(max(0.0, {at} - time.time()))
try:
    sw.create(spec)
    print("created", flush=True)
except ConfigError as e:
    print("refused", flush=True)
time.sleep(4)  # the creator stays alive: its claim holds while the others look
"""
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(3)]
    said = sorted(p.communicate(timeout=300)[0].strip() for p in procs)
    assert said == ["created", "refused", "refused"], said
    assert len(sw.list_sweeps(tmp_path)) == 1


# ============================================================================ the workload check's children
@pytest.mark.slow
def test_the_workload_check_ends_a_child_that_left_its_session(tmp_path, monkeypatch):
    from commlab.engine import workload_probe

    pid_file = tmp_path / "daemon.pid"
    monkeypatch.setenv("COMMLAB_TEST_PID_FILE", str(pid_file))
    cfg = RunConfig(workload="tests.misbehaving_workloads:forks_a_daemon", runs_dir=str(tmp_path))
    assert workload_probe.error(cfg) is None
    pid = int(_wait(lambda: pid_file.exists() and pid_file.read_text(), 30, "daemon pid"))
    assert _wait(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
                 10, "daemon's end")


# ============================================================================ bounds
def test_trace_steps_are_bounded_and_need_the_instrument():
    for bad in ([-1], [1, 99999999999999999999999], list(range(40))):
        assert "trace_steps" in RunConfig(trace_steps=bad).errors()
    assert "needs instrument on" in RunConfig(trace_steps=[3], instrument=False).errors()["trace_steps"]
    assert RunConfig(instrument=False).errors() == {}  # the default traces nothing then
    assert cli.main(["run", "--trace-steps", "1,5", "--no-instrument", "--json"]) == 2


def test_a_log_past_its_limit_keeps_its_tail_and_says_so(tmp_path):
    log = tmp_path / "launcher.log"
    log.write_bytes(b"".join(b"line %07d\n" % i for i in range(200_000)))
    size = log.stat().st_size
    with open(log, "ab") as writer:  # a writer keeps appending at the new end
        assert store.keep_tail(log, 1_000_000, 100_000) == size - 100_000
        writer.write(b"after the cut\n")
    text = log.read_text()
    assert text.startswith(f"[commlab: the first {size - 100_000:,} bytes of this log were cut")
    assert text.endswith("line 0199999\nafter the cut\n") and len(text) < 100_200
    assert store.keep_tail(log, 1_000_000, 100_000) == 0  # under the limit: untouched


# ============================================================================ how a run ended
def test_a_stop_after_the_last_step_leaves_a_finished_run_finished(tmp_path):
    folder = run_folder.RunFolder(tmp_path)
    store.write_json(folder.file("status.json"), {"status": "finished", "step": 9})
    supervisor._record_end(folder, {"status": "stopped", "error": "stopped by the user"}, 0)
    assert store.read_json(folder.file("status.json"))["status"] == "finished"


def test_resume_config_names_a_damaged_record(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    store.write_json(folder / "config.json", RunConfig(runs_dir=str(tmp_path)).to_dict())
    (folder / "checkpoint.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="damaged: checkpoint.json"):
        checkpoint.resume_config(folder)


@pytest.mark.slow
def test_compare_names_a_run_with_no_status_and_garbage_metrics(allreduce_run, powersgd_run, tmp_path, capsys):
    folder = _copy(allreduce_run, tmp_path, "garbage")
    (folder / "status.json").unlink()
    (folder / "metrics.jsonl").write_bytes(b"\x00\x01 not json\n" * 50)
    rc = cli.main(["compare", str(folder), str(powersgd_run.path)])
    err = capsys.readouterr().err
    assert "left out run garbage: damaged: metrics.jsonl: its first line is not a step record" in err, err
    assert rc in (0, 1)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_disk_that_fills_during_a_sweep_ends_it_failed_with_its_result():
    """The first run of a sweep fills the disk and fails; the next cannot start (too little room):
    the sweep ends failed saying why, exit 1, its state not left running, its result.json written
    (the sweep folder's reserve)."""
    got = _in_small_disk("""
import json, os, subprocess, sys, time
from pathlib import Path
from commlab.engine import store
from commlab.tune import sweep as sw
disk = Path(os.environ["DISK"])
proc = subprocess.Popen([sys.executable, "-m", "commlab", "sweep", "--workload", "mlp", "--steps", "1000000",
                         "--world-size", "2", "--matrix-approximation-rank", "1", "--start-powersgd-iter", "2",
                         "--repeats", "1", "--stall-timeout-s", "600", "--runs-dir", str(disk / "runs")],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
while not [r for r in (disk / "runs").glob("*allreduce*") if store.read_jsonl(r / "metrics.jsonl")]:
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.2)
t0 = time.time()
with open(disk / "filler", "wb") as f:  # room for a few hundred steps
    try:
        while os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize > 100_000:
            f.write(b"\\0" * 16384)
    except OSError:
        pass
out, err = proc.communicate(timeout=600)
(sweep,) = sw.list_sweeps(disk / "runs")
print(json.dumps({"rc": proc.returncode, "out": out, "err": err[-3000:], "after_s": time.time() - t0,
                  "state": sweep.state(), "status": sweep.status(), "runs": [r.status() for r in sweep.runs()],
                  "result": sweep.saved_report()}))
""", "24m")
    assert got["rc"] == 1, got
    assert got["status"] == "failed" and got["runs"] == ["failed"], got
    assert "could not start" in got["state"]["error"] and "MiB free" in got["state"]["error"], got["state"]
    assert got["result"]["status"] == "failed" and got["result"]["error"] == got["state"]["error"], got["result"]
    assert "invalid settings" not in got["err"] and got["state"]["error"] in got["out"] + got["err"], got
    print(f"\nfull disk during a sweep -> its end recorded in {got['after_s']:.1f} s")
