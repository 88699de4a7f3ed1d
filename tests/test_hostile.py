"""Hostile ground (issue 40, items 3, 5, 6, 11 and 12): what a shared folder or a hand can put
where the lab reads, and the figures a second attack found wrong.

Each fault is made for real: a FIFO made with ``os.mkfifo``, a symlink to /dev/zero, a
checkpoint written by a real 3-rank run, a file nested 100,000 deep, real DiLoCo and post-local
SGD runs.  A reader that could hang runs in a subprocess with a timeout, so that a regression fails
the test instead of hanging the suite.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commlab import files
from commlab.analysis import metrics
from commlab.config import RunConfig
from commlab.engine import checkpoint, run_folder, store

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------- item 11: the ratio of whole periods
@pytest.mark.slow
@pytest.mark.parametrize("settings, ratio", [
    # DiLoCo, fp32, H=4: one parameter allreduce every 4 steps, plain allreduce every step; steps
    # 3 to 23 are steady and hold 6 averagings in 21 steps (3.50), 5 whole periods in steps 4 to 23
    ({"hook": "diloco", "sync_every": 4}, 4.0),
    # post-local SGD averaging every 4 steps from step 6: steps 6 to 23, 4 whole periods from 8
    ({"hook": "post_localsgd", "start_localSGD_iter": 6, "averager_period": 4}, 4.0),
])
def test_the_steady_ratio_of_a_hook_that_averages_the_model_keeps_to_whole_periods(tmp_path, settings, ratio):
    from commlab.api import run

    done = run(RunConfig(workload="mlp", steps=24, world_size=2, runs_dir=str(tmp_path),
                         stall_timeout_s=600, **settings), timeout=600)
    assert done.status() == "finished", done.status_record()
    records, cfg = done.metrics_records(), done.config_dict()
    assert metrics.steady_compression_ratio(records, cfg) == pytest.approx(ratio)
    assert done.summary()["steady_compression_ratio"] == pytest.approx(ratio)
    # the live view keeps its steady rows as columns: the same definition
    columns = metrics.Columns(("step", "step_s", "payload_bytes", "plain_bytes"))
    columns.extend(metrics.steady_rows(records, cfg))
    assert metrics.steady_compression_ratio(records, cfg, columns) == pytest.approx(ratio)


# ---------------------------------------------------------------------------- item 3: another run's checkpoint files
def _resume_refused(folder, capsys) -> str:
    """``commlab run --resume``: exit 2, no run folder made; the message."""
    from commlab import cli

    before = sorted(p.name for p in folder.parent.iterdir())
    assert cli.main(["run", "--resume", str(folder), "--steps", "8", "--runs-dir", str(folder.parent),
                     "--json"]) == 2
    assert sorted(p.name for p in folder.parent.iterdir()) == before
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["errors"]["resume"]


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """Real runs of 4 steps that saved their checkpoints: two of 2 ranks (seeds 0 and 1), one of 3."""
    from commlab.api import launch

    root = tmp_path_factory.mktemp("checkpointed")
    runs = {name: launch(RunConfig(workload="mlp", steps=4, world_size=n, seed=seed, eval_every=0,
                                   runs_dir=str(root / name), stall_timeout_s=600))
            for name, n, seed in (("two", 2, 0), ("three", 3, 0), ("other", 2, 1))}
    for run in runs.values():
        assert run.wait(600) == "finished", run.status_record()
    return runs


@pytest.mark.slow
def test_checkpoint_files_of_another_run_are_refused_by_name(checkpointed, tmp_path, capsys):
    """A 2-rank run's checkpoint.json with a 3-rank run's rank0/rank1.pt (same hook, model and
    step) trained on from the other run's model; so did a 2-rank run's files with another 2-rank
    run's rank1.pt."""
    runs = checkpointed
    mixed = tmp_path / "mixed" / "two"
    shutil.copytree(runs["two"].path, mixed)
    for rank in (0, 1):
        shutil.copy(runs["three"].path / "checkpoint" / f"rank{rank}.pt", mixed / "checkpoint")
    said = _resume_refused(mixed, capsys)
    assert "checkpoint/rank0.pt was saved by a run of 3 ranks, checkpoint.json says 2" in said, said

    shutil.copy(runs["two"].path / "checkpoint" / "rank0.pt", mixed / "checkpoint")
    shutil.copy(runs["other"].path / "checkpoint" / "rank1.pt", mixed / "checkpoint")
    said = _resume_refused(mixed, capsys)
    assert (f"checkpoint/rank1.pt was saved by run {runs['other'].id}, checkpoint.json by run "
            f"{runs['two'].id}") in said, said

    shutil.copy(runs["two"].path / "checkpoint" / "rank1.pt", mixed / "checkpoint")
    cfg = checkpoint.resume_config(mixed, steps=8)  # its own files again: accepted
    assert not checkpoint.resume_errors(cfg, mixed)


# ---------------------------------------------------------------------------- item 5: FIFOs and /dev/zero
def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def _commlab(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    """The command in a child with a timeout: a reader that blocks fails the test, never hangs it."""
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "commlab", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"commlab {' '.join(args)} hung: no answer in {timeout} s")
    return done, time.monotonic() - start


SPECIAL = {
    "config.json a FIFO": ("config.json", _fifo, "a named pipe (FIFO) where a file belongs"),
    "status.json a FIFO": ("status.json", _fifo, "a named pipe (FIFO) where a file belongs"),
    "metrics.jsonl a FIFO": ("metrics.jsonl", _fifo, "a named pipe (FIFO) where a file belongs"),
    "metrics.jsonl to /dev/zero": ("metrics.jsonl", _dev_zero, "a character device where a file belongs"),
    "evals.jsonl to /dev/zero": ("evals.jsonl", _dev_zero, "a character device where a file belongs"),
    "meta.json to /dev/zero": ("meta.json", _dev_zero, "a character device where a file belongs"),
}


@pytest.mark.slow
def test_the_listing_names_fifos_and_devices_and_lists_the_rest(tmp_path):
    """`commlab runs` (what the Runs page lists) over a folder whose runs hold a FIFO or a symlink
    to /dev/zero where a file belongs: each named as damaged, the good run listed, at once."""
    from tests.test_damaged import GOOD, make_good_run

    make_good_run(tmp_path)
    for i, (name, harm, _) in enumerate(SPECIAL.values()):
        harm(make_good_run(tmp_path, f"20240101-000000-special-{i:04d}") / name)
    done, took = _commlab("runs", "--runs-dir", str(tmp_path), "--json", timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["run_id"]: r for r in json.loads(done.stdout)["runs"]}
    assert rows[GOOD]["status"] == "finished" and rows[GOOD]["steps"] == 12
    for i, (case, (name, _, what)) in enumerate(SPECIAL.items()):
        row = rows[f"20240101-000000-special-{i:04d}"]
        assert (row["status"], row["error"]) == ("damaged", f"damaged: {name}: {what}"), case
    print(f"{len(SPECIAL)} hostile runs listed damaged in {took:.1f} s")
    # The readers behind the pages read past them: nothing waits, nothing raises.
    for i in range(len(SPECIAL)):
        run = run_folder.RunFolder(tmp_path / f"20240101-000000-special-{i:04d}")
        run.metrics_records(), run.evals(), run.meta(), run.status_record(), run.config_dict()


def _dangling(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/nonexistent/rank.pt")


@pytest.mark.slow
@pytest.mark.parametrize("name, harm, said", [
    ("rank0.pt", _fifo, "checkpoint/rank0.pt cannot be read: a named pipe (FIFO) where a file belongs"),
    ("rank0.pt", _dev_zero, "checkpoint/rank0.pt cannot be read: a character device where a file belongs"),
    ("rank1.pt", _dangling, "checkpoint/rank1.pt is missing"),
])
def test_a_resume_refuses_a_checkpoint_file_that_is_a_fifo_or_a_device(checkpointed, tmp_path, name, harm, said):
    """A FIFO as checkpoint/rank0.pt hung `commlab run --resume`; /dev/zero there raised a
    MemoryError traceback; a symlink to nothing a FileNotFoundError traceback.  Each is named and
    refused before anything starts."""
    folder = tmp_path / "special"
    shutil.copytree(checkpointed["two"].path, folder)
    harm(folder / "checkpoint" / name)
    done, took = _commlab("run", "--resume", str(folder), "--steps", "8", "--runs-dir", str(tmp_path),
                          "--json")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    refused = json.loads(done.stdout.strip().splitlines()[-1])["errors"]["resume"]
    assert said in refused, refused
    assert sorted(p.name for p in tmp_path.iterdir()) == ["special"]  # no run folder was made
    print(f"refused in {took:.1f} s: {refused}")


@pytest.mark.slow  # no process, but AppTest reruns of two pages
@pytest.mark.timeout(300)  # a page that waits on a FIFO fails here instead of hanging the suite
def test_the_runs_and_watch_pages_name_fifos_and_devices(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.test_damaged import GOOD, make_good_run

    make_good_run(tmp_path)
    for i, (name, harm, _) in enumerate(SPECIAL.values()):
        harm(make_good_run(tmp_path, f"20240101-000000-special-{i:04d}") / name)
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.run()
    at.switch_page("pages/runs.py").run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value
    assert table[table["run_id"] == GOOD].iloc[0]["status"] == "finished"
    for i, (name, _, what) in enumerate(SPECIAL.values()):
        row = table[table["run_id"] == f"20240101-000000-special-{i:04d}"].iloc[0]
        assert (row["status"], row["error"]) == ("damaged", f"damaged: {name}: {what}")
    at.switch_page("pages/launch_and_watch.py")
    for i in range(len(SPECIAL)):
        at.session_state["watch"] = str(tmp_path / f"20240101-000000-special-{i:04d}")
        at.session_state["views"] = {}
        at.run()
        assert not at.exception, (i, [e.value for e in at.exception])


@pytest.mark.timeout(30)  # a reader that waits on the FIFO fails here instead of hanging the suite
def test_store_readers_refuse_special_files_at_once(tmp_path):
    """In process, each low-level reader over a FIFO (no writer ever comes) and /dev/zero."""
    for harm, what in ((_fifo, "a named pipe (FIFO)"), (_dev_zero, "a character device")):
        for name in ("status.json", "metrics.jsonl"):
            harm(tmp_path / name)
        with pytest.raises(store.Damaged, match=f"status.json: {re.escape(what)} where a file belongs"):
            store.load_json(tmp_path / "status.json")
        assert store.read_json(tmp_path / "status.json", {}) == {}
        assert store.read_jsonl(tmp_path / "metrics.jsonl") == []
        with pytest.raises(files.Refused):
            files.read_regular(tmp_path / "status.json", 100)
    (tmp_path / "big.json").write_bytes(b" " * 101)
    with pytest.raises(files.Refused, match="101 bytes, more than the 100"):
        files.read_regular(tmp_path / "big.json", 100)


# ---------------------------------------------------------------------------- item 6: nesting and huge integers
@pytest.mark.parametrize("suffix, text", [
    (".json", '{"a":' * 100_000 + "1" + "}" * 100_000),
    (".toml", "a = " + "[" * 100_000 + "]" * 100_000 + "\n"),
])
def test_a_settings_file_nested_100000_deep_is_refused_by_name(tmp_path, capsys, suffix, text):
    from commlab import cli

    path = tmp_path / f"deep{suffix}"
    path.write_text(text)
    assert cli.main(["run", "--config", str(path), "--steps", "1", "--runs-dir", str(tmp_path)]) == 2
    assert f"file: {path} does not parse: nested deeper than the parser goes" in capsys.readouterr().err


@pytest.mark.parametrize("suffix, text", [(".json", f'{{"lr": {10**400}}}'), (".toml", f"lr = {10**400}\n")])
def test_a_settings_file_with_a_400_digit_number_is_refused_by_name(tmp_path, capsys, suffix, text):
    from commlab import cli

    path = tmp_path / f"big{suffix}"
    path.write_text(text)
    assert cli.main(["run", "--config", str(path), "--steps", "1", "--runs-dir", str(tmp_path)]) == 2
    assert "lr: must be a number, got an integer of" in capsys.readouterr().err


def test_a_400_digit_integer_in_metrics_is_a_damaged_line(tmp_path):
    """Valid JSON, beyond what a float or NumPy's int64 holds: a later line is skipped and
    counted, a first line makes the run damaged, by name; the figures never see it."""
    from tests.test_damaged import STEPS, make_good_run

    huge = 10**400
    later = make_good_run(tmp_path, "20240101-000000-later-0000")
    lines = (later / "metrics.jsonl").read_text().splitlines()
    rec = json.loads(lines[-1])
    (later / "metrics.jsonl").write_text("\n".join(lines[:-1] + [json.dumps({**rec, "loss": huge})]) + "\n")
    row = run_folder.RunFolder(later).summary()
    assert (row["status"], row["steps"], row["skipped_lines"]) == ("finished", STEPS - 1, 1)
    first = make_good_run(tmp_path, "20240101-000000-first-0000")
    (first / "metrics.jsonl").write_text(json.dumps({**rec, "step": huge}) + "\n" + "\n".join(lines) + "\n")
    row = run_folder.RunFolder(first).summary()
    assert row["status"] == "damaged" and row["error"].startswith("damaged: metrics.jsonl: its first line"), row
    (first / "status.json").write_text(f'{{"status": "finished", "step": {huge}}}')
    with pytest.raises(store.Damaged, match=r"status.json: not JSON \(an integer of 401 digits"):
        store.load_json(first / "status.json")


@pytest.mark.slow
def test_sweep_show_over_a_400_digit_integer_in_a_run_s_metrics(tmp_path):
    """A real sweep; one of its runs' last metrics line holds a step time of 10**400 (valid JSON):
    `commlab sweep --show` raised OverflowError; it shows the sweep, that run one step short."""
    done, _ = _commlab("sweep", "--hook", "fp16", "--world-size", "2", "--workload", "mlp", "--steps", "6",
                       "--seed", "0", "--runs-dir", str(tmp_path), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (sweep,) = (p for p in (tmp_path / "sweeps").iterdir() if p.is_dir())
    for run in (p for p in tmp_path.iterdir() if "-fp16-" in p.name):
        lines = (run / "metrics.jsonl").read_text().splitlines()
        rec = json.loads(lines[-1])
        (run / "metrics.jsonl").write_text("\n".join(lines[:-1] + [json.dumps({**rec, "step_s": 10**400})]) + "\n")
    shown, took = _commlab("sweep", "--show", str(sweep), timeout=120)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr[-3000:]
    assert re.search(r"^fp16 +3/3", shown.stdout, re.M), shown.stdout
    print(f"sweep --show in {took:.1f} s")


# ---------------------------------------------------------------------------- item 12: the ledger's bandwidth unit
def test_the_ledger_names_its_bandwidths_in_gigabytes_and_reads_old_files(tmp_path, capsys):
    """The ledger's algbw and busbw are GB/s (as nccl-tests prints them) while every other *_gbps
    of the lab is gigabits: their names, the page's column labels and `commlab runs --json` say
    gigabytes; a ledger.json written before, with the old names, still reads."""
    import lab_widgets
    from commlab import cli
    from commlab.analysis import ledger
    from commlab.ui import runs
    from tests.test_damaged import GOOD, make_good_run

    book = ledger.Ledger()
    book.completed(book.issued(ledger.HOOK, "all_reduce", 2, 4000, 4000), 0.001)
    (row,) = book.rows()
    assert row["algbw_gbytes_s"] == pytest.approx(4000 / 0.001 / 1e9) and "algbw_gbps" not in row
    old = {{"algbw_gbytes_s": "algbw_gbps", "busbw_gbytes_s": "busbw_gbps"}.get(k, k): v for k, v in row.items()}
    run = make_good_run(tmp_path)
    store.write_json(run / "ledger.json", {"step": 11, "world_size": 2, "clock": "host",
                                           "emulated_link": False, "rows": [old]})
    view = runs.ledger_view(run)
    assert view["rows"][0]["algbw_gbytes_s"] == row["algbw_gbytes_s"]
    assert view["rows"][0]["busbw_gbytes_s"] == row["busbw_gbytes_s"]
    shown = {k: lab_widgets.LEDGER_TABLE[k][0] for k in view["columns"] if "bw" in k}
    assert shown == {"algbw_gbytes_s": "algbw (GB/s, gigabytes)", "busbw_gbytes_s": "busbw (GB/s, gigabytes)"}
    assert cli.main(["runs", "--runs-dir", str(tmp_path), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["runs"]
    assert listed["run_id"] == GOOD and listed["ledger"]["rows"][0]["busbw_gbytes_s"] == row["busbw_gbytes_s"]
