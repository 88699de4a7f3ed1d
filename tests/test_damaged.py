"""Damaged and hostile run folders, a full disk, big metrics files (issue 14, items 2, 5 and 8).

Every damage a power cut, a full disk or a hand edit leaves is thrown at every reader of run
folders and at every page of app.py, beside a good run: nothing raises, the good run still works,
the damaged one is named ``damaged: <file>: <what>``.  The runs are made by hand, so the fast tier
starts no process; the full-disk tests mount a small tmpfs in a user namespace of their own
(``unshare -Urm``, no root needed) and are marked slow.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

import lab_widgets
from commlab import cli
from commlab.analysis import buckets
from commlab.config import RunConfig
from commlab.engine import run_folder, store
from commlab.tune import whatif
from commlab.ui import lowrank_view, runs

ROOT = Path(__file__).resolve().parent.parent
SECTIONS_PAGES = [f for pages in __import__("ast").literal_eval(
    re.search(r"SECTIONS = (\{.*?\n\})", (ROOT / "app.py").read_text(), re.S)[1].replace(
        "\n", " ")).values() for f, _ in pages]
GOOD = "20250101-000000-good-0000"
STEPS = 12


# ---------------------------------------------------------------------------- a good run, by hand
def make_good_run(root: Path, name: str = GOOD) -> Path:
    run = root / name
    run.mkdir(parents=True)
    cfg = RunConfig(hook="powersgd", start_powerSGD_iter=2, matrix_approximation_rank=1,
                    workload="mlp", steps=STEPS, world_size=2, save_grads_at=[5, 6],
                    error_every=4, runs_dir=str(root))
    store.write_json(run / "config.json", cfg.to_dict())
    store.write_json(run / "launch.json", {"backend": "gloo", "hook_impl": "commlab",
                                           "hook_reason": "r", "warning": None})
    store.write_json(run / "meta.json", {"hook_impl": "commlab", "backend": "gloo",
                                         "hook_reason": "r"})
    store.write_json(run / "status.json", {"status": "finished", "step": STEPS - 1})
    with open(run / "metrics.jsonl", "w") as f:
        for s in range(STEPS):
            f.write(json.dumps({"step": s, "loss": 2.0 - 0.1 * s, "step_s": 0.01, "t": 0.01 * s,
                                "payload_bytes": 1000, "wire_bytes": 1000, "plain_bytes": 4000,
                                "collectives": 2, "compression_ratio": 4.0, "hook_s": 0.002,
                                "measure_bytes": 0, "powersgd_iter": s}) + "\n")
    params = [{"name": "0.weight", "shape": [8, 4], "numel": 32},
              {"name": "0.bias", "shape": [8], "numel": 8}]
    layout = [{"index": 0, "is_last": True, "bytes": 160, "numel": 40, "params": params}]
    store.write_json(run / "buckets.json", {"bucket_cap_mb": 25.0, "iter0": layout,
                                            "rebuilt": layout, "ddp_logging": {
                                                "bucket_sizes": "160", "rebuilt_bucket_sizes": "160"}})
    store.write_json(run / "layers.json", [
        {"name": "0.weight", "shape": [8, 4], "compressed": True, "applies": True},
        {"name": "0.bias", "shape": [8], "compressed": False, "applies": True}])
    with open(run / "errors.jsonl", "w") as f:
        for s in (4, 8):
            f.write(json.dumps({"step": s, "measure_bytes": 0, "ef_residual_norm": 0.5,
                                "buckets": [{"bucket": 0, "rel_error": 0.3}],
                                "layers": [{"bucket": 0, "layer": "0.weight", "rel_error": 0.2}]})
                    + "\n")
    (run / "grads").mkdir()
    for s in (5, 6):
        torch.save({"0.weight": torch.randn(8, 4), "0.bias": torch.randn(8)}, run / f"grads/step_{s}.pt")
    return run


# ---------------------------------------------------------------------------- the damage
def _write(name: str, data: bytes):
    def do(run: Path) -> None:
        target = run / name
        if target.is_dir():
            shutil.rmtree(target)
        target.write_bytes(data)
    return do


def _folder(name: str):
    def do(run: Path) -> None:
        (run / name).unlink(missing_ok=True)
        (run / name).mkdir()
    return do


def _metric_lines(*lines: bytes):
    def do(run: Path) -> None:
        with open(run / "metrics.jsonl", "ab") as f:
            f.write(b"".join(lines))
    return do


LISTED = ["config.json", "status.json", "launch.json", "supervisor.json", "meta.json"]
# name -> (what to do to a good run, the file a listing names as damaged or None: bad lines only)
DAMAGE = {
    **{f"{n} not UTF-8": (_write(n, b'{"status": "fin\xffished"}'), n) for n in LISTED},
    **{f"{n} a list": (_write(n, b"[1, 2]"), n) for n in LISTED},
    **{f"{n} a folder": (_folder(n), n) for n in LISTED + ["metrics.jsonl"]},
    "config.json truncated": (_write("config.json", b'{"hook": "powe'), "config.json"),
    "config.json wrong types": (_write("config.json", b'{"hook": 3, "steps": "many"}'), "config.json"),
    "status.json no status": (_write("status.json", b'{"step": 3}'), "status.json"),
    "supervisor.json pid a string": (_write("supervisor.json", b'{"pid": "1"}'), "supervisor.json"),
    "launch.json launcher a list": (_write("launch.json", b'{"launcher": [1]}'), "launch.json"),
    "status.json deep nesting": (_write("status.json", b"[" * 100000), "status.json"),
    "metrics.jsonl binary junk": (_metric_lines(os.urandom(3000).replace(b"\n", b"") + b"\n"), None),
    "metrics.jsonl NUL bytes": (_metric_lines(b"\x00" * 4096 + b"\n", b"\x00" * 512), None),
    "metrics.jsonl not objects": (_metric_lines(b"[1, 2]\n", b"3\n", b'"x"\n', b"null\n"), None),
    "metrics.jsonl lacks a field": (_metric_lines(b'{"step": 12, "loss": 1.0}\n',
                                                  b'{"loss": 1.0, "step_s": 0.1, "t": 1}\n'), None),
    "metrics.jsonl wrong types": (_metric_lines(b'{"step": "12", "loss": "x", "step_s": 0.1, "t": 1}\n',
                                                b'{"step": true, "loss": 1, "step_s": 0.1, "t": 1}\n'), None),
    "metrics.jsonl not instrumented midway": (_metric_lines(
        b'{"step": 12, "loss": 1.0, "step_s": 0.1, "t": 1.0}\n'), None),
    "errors.jsonl junk": (_write("errors.jsonl", b'[1]\n{"step": 1, "layers": [3]}\n\xff\xfe\n'), None),
    "errors.jsonl a folder": (_folder("errors.jsonl"), None),
    "layers.json a dict": (_write("layers.json", b'{"name": "x"}'), None),
    "layers.json bad items": (_write("layers.json", b'[{"name": 1}]'), None),
    "buckets.json a list": (_write("buckets.json", b"[]"), None),
    "buckets.json bad layout": (_write("buckets.json", b'{"bucket_cap_mb": 1, "iter0": [{"index": "a"}]}'), None),
    "buckets.json bad log": (_write("buckets.json", json.dumps({
        "bucket_cap_mb": 1.0, "ddp_logging": {"bucket_sizes": "a,b"}}).encode()), None),
    "buckets.json a folder": (_folder("buckets.json"), None),
    "ledger.json bad rows": (_write("ledger.json", json.dumps({
        "step": 1, "world_size": 2, "clock": "host", "emulated_link": False,
        "rows": [{"traffic": "hook", "count": "many"}]}).encode()), None),
    "ledger.json a folder": (_folder("ledger.json"), None),
    "grads junk": (_write("grads/step_5.pt", b"not a tensor file"), None),
    "grads a folder": (lambda run: ((run / "grads/step_6.pt").unlink(), (run / "grads/step_6.pt").mkdir()), None),
    "grads odd name": (_write("grads/step_x.pt", b"junk"), None),
    "grads not a dict": (lambda run: torch.save([torch.zeros(2)], run / "grads/step_5.pt"), None),
    "hostile strings": (_write("status.json", json.dumps({
        "status": "failed", "error": "![x](http://127.0.0.1:9/leak.png) **boom** $x$"}).encode()), None),
}


@pytest.fixture
def damaged_dir(tmp_path):
    """A runs folder: the good run, and one run per kind of damage (named after it)."""
    make_good_run(tmp_path)
    for i, (name, (harm, _)) in enumerate(DAMAGE.items()):
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower())
        harm(make_good_run(tmp_path, f"20240101-000000-{slug}-{i:04d}"))
    return tmp_path


def _run_of(root: Path, case: str) -> run_folder.RunFolder:
    slug = re.sub(r"[^a-z0-9]+", "-", case.lower())
    return next(run_folder.RunFolder(p) for p in root.iterdir() if f"-{slug}-" in p.name)


# ---------------------------------------------------------------------------- every reader
def test_store_names_each_damaged_file_and_reads_the_rest(damaged_dir):
    for case, (_, named) in DAMAGE.items():
        run = _run_of(damaged_dir, case)
        row = run.summary()
        if named:
            assert row["status"] == "damaged", case
            assert row["error"].startswith(f"damaged: {named}: "), (case, row["error"])
        else:
            assert row["status"] != "damaged", (case, row["error"])
        for read in (run.config_dict, run.launch_info, run.meta, run.status_record, run.supervisor,
                     run.metrics_records, run.error_records, run.buckets, run.layers,
                     run.grad_steps, run.metrics, run.errors):
            read()
        for step in run.grad_steps():
            try:
                assert set(run.grads(step)) == {"0.weight", "0.bias"}
            except store.Damaged as e:
                assert str(e).startswith(f"grads/step_{step}.pt: "), case


def test_bad_metrics_lines_are_skipped_and_counted(damaged_dir):
    expect = {"metrics.jsonl binary junk": 1, "metrics.jsonl NUL bytes": 1,
              "metrics.jsonl not objects": 4, "metrics.jsonl lacks a field": 2,
              "metrics.jsonl wrong types": 2, "metrics.jsonl not instrumented midway": 1}
    for case, skipped in expect.items():
        row = _run_of(damaged_dir, case).summary()
        assert (row["steps"], row["skipped_lines"]) == (STEPS, skipped), case
        assert row["final_loss"] == pytest.approx(2.0 - 0.1 * (STEPS - 1))
    assert run_folder.RunFolder(damaged_dir / GOOD).summary()["skipped_lines"] == 0


def test_ui_and_tune_readers_over_the_damaged_folder(damaged_dir):
    root = str(damaged_dir)
    table = {r["run_id"]: r for r in runs.run_table(root)}
    assert table[GOOD]["status"] == "finished" and table[GOOD]["steps"] == STEPS
    choices = {c["path"]: c for c in runs.run_choices(root)}
    for case, (_, named) in DAMAGE.items():
        run = _run_of(damaged_dir, case)
        assert (choices[str(run.path)]["status"] == "damaged") == bool(named), case
        view = runs.LiveView(run.path)
        view.poll()
        view.headline(), view.implementation(), view.frame()
        if named:
            assert view.status() == {"status": "damaged", "error": run.damage()}
        runs.overlay([str(run.path)])
        assert runs.ledger_view(run.path)["step"] is None  # none written, or not what commlab writes
        recorded = run.buckets()
        buckets.bucket_layouts(recorded), buckets.bucket_story(recorded)
        buckets.ddp_logged_sizes(recorded)
        inputs = lowrank_view.inputs(str(run.path))
        lowrank_view.measured(str(run.path))
        for step in inputs.steps:
            try:
                lowrank_view.step_errors(str(run.path), step, tuple(inputs.names))
            except store.Damaged:
                pass
    assert {c["path"] for c in lowrank_view.choices(root)} >= {str(damaged_dir / GOOD)}
    everyone = run_folder.list_runs(root)  # the damaged too: their readers return what they can
    assert GOOD in {p.run_id for p in whatif.profiles_from_runs(everyone)}
    whatif.checks(everyone)


def test_commands_over_the_damaged_folder(damaged_dir, capsys):
    assert cli.main(["runs", "--runs-dir", str(damaged_dir)]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"{GOOD}\s+finished", out)
    for case, (_, named) in DAMAGE.items():
        line = next(ln for ln in out.splitlines() if ln.startswith(_run_of(damaged_dir, case).id))
        if named:
            assert f"damaged: {named}: " in line, (case, line)
    assert cli.main(["runs", "--runs-dir", str(damaged_dir), "--json"]) == 0
    json.loads(capsys.readouterr().out)
    bad = _run_of(damaged_dir, "config.json not UTF-8")
    assert cli.main(["export", str(bad.path), "--format", "json"]) == 2
    assert "damaged: config.json: not UTF-8" in capsys.readouterr().err
    assert cli.main(["export", str(damaged_dir / GOOD), "--format", "json"]) == 0
    capsys.readouterr()
    assert cli.main(["whatif", str(damaged_dir / GOOD), str(bad.path)]) == 0
    captured = capsys.readouterr()
    assert f"left out run {bad.id}: damaged: config.json" in captured.err


# ---------------------------------------------------------------------------- every page
def _exceptions(at: AppTest) -> list:
    return [e.value for e in at.exception]


@pytest.mark.slow  # no process, but ~25 s of AppTest reruns: kept out of the quick loop
def test_every_page_survives_the_damaged_folder(damaged_dir, monkeypatch):
    """Each page of app.py's SECTIONS, with the damaged runs beside the good one; the pages with
    a run picker once with every run chosen."""
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(damaged_dir))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.run()
    for page in SECTIONS_PAGES:
        at.switch_page(page).run()
        assert not _exceptions(at), (page, _exceptions(at))
    paths = [str(_run_of(damaged_dir, c).path) for c in DAMAGE] + [str(damaged_dir / GOOD)]
    for page in ("pages/launch_and_watch.py", "pages/buckets.py", "pages/low_rank_error.py",
                 "pages/export.py"):
        at.switch_page(page)
        for path in paths:
            at.session_state["watch"] = path
            at.session_state["views"] = {}
            at.run()
            assert not _exceptions(at), (page, path, _exceptions(at))
    # The Runs page lists the good run with its figures, and each damaged one by what is damaged.
    at.switch_page("pages/runs.py").run()
    table = at.dataframe[0].value
    good = table[table["run_id"] == GOOD].iloc[0]
    assert (good["status"], good["steps"]) == ("finished", STEPS)
    for case, (_, named) in DAMAGE.items():
        row = table[table["run_id"] == _run_of(damaged_dir, case).id].iloc[0]
        if named:
            assert row["status"] == "damaged" and row["error"].startswith(f"damaged: {named}: ")


def test_run_strings_show_as_text(damaged_dir, monkeypatch):
    """An error with an image link, bold and LaTeX shows as those characters: escaped, so that
    the markdown renderer draws no image (the browser fetches nothing) and no formatting."""
    hostile = _run_of(damaged_dir, "hostile strings")
    error = store.read_json(hostile.file("status.json"))["error"]
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(damaged_dir))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.session_state["watch"] = str(hostile.path)
    at.run()
    shown = [e.value for e in at.error]
    assert lab_widgets.literal(error) in shown
    for text in shown:
        assert not re.search(r"(?<!\\)!(?<!\\)\[", text)
    assert re.sub(r"\\(.)", r"\1", lab_widgets.literal(error)) == error


# ---------------------------------------------------------------------------- a full disk
NAMESPACE = shutil.which("unshare")


def _in_small_disk(script: str, size: str = "2m") -> dict:
    """Run ``script`` in a user and mount namespace of its own with a tmpfs of ``size`` at $DISK;
    it prints one JSON line last."""
    if not NAMESPACE or subprocess.run([NAMESPACE, "-Urm", "true"], capture_output=True).returncode:
        pytest.skip("no unprivileged user namespaces here to mount a small disk in")
    body = (f"mkdir -p /tmp/commlab-disk && mount -t tmpfs -o size={size} none /tmp/commlab-disk && "
            f"DISK=/tmp/commlab-disk {sys.executable} -c \"$0\"")
    out = subprocess.run([NAMESPACE, "-Urm", "sh", "-c", body, textwrap.dedent(script)],
                         capture_output=True, text=True, timeout=900, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_full_disk_writes_keep_complete_lines_leave_no_tmp_and_use_the_reserve():
    got = _in_small_disk("""
        import errno, json, os
        from pathlib import Path
        from commlab.engine import store
        run = Path(os.environ["DISK"]) / "run"
        run.mkdir()
        store.make_reserve(run)
        w, n = store.JsonlWriter(run / "metrics.jsonl"), 0
        try:
            while True:
                w.write({"step": n, "loss": 1.0, "step_s": 0.1, "t": 0.1, "pad": "x" * 300})
                n += 1
        except OSError as e:
            metrics_error = (e.errno, str(e))
        try:
            store.write_json(run / "buckets.json", {"bucket_cap_mb": 1.0, "pad": "y" * 9000})
            other = None
        except OSError as e:
            other = (e.errno, str(e))
        store.write_json(run / "status.json", {"status": "failed", "error": "x" * 5000})
        lines = (run / "metrics.jsonl").read_bytes().split(b"\\n")
        print(json.dumps({"written": n, "metrics_error": metrics_error, "other": other,
                          "complete": lines[-1] == b"" and all(json.loads(l) for l in lines[:-1]),
                          "records": len(store.read_jsonl(run / "metrics.jsonl")),
                          "status": store.read_json(run / "status.json"),
                          "tmp": [p.name for p in run.rglob("*.tmp")],
                          "reserve_left": (run / store.RESERVE).exists()}))
    """)
    assert got["metrics_error"] == [28, "[Errno 28] no space left on device writing metrics.jsonl"]
    assert got["other"] == [28, "[Errno 28] no space left on device writing buckets.json"]
    assert got["complete"] and got["records"] == got["written"] > 1000
    assert got["status"] == {"status": "failed", "error": "x" * 5000}
    assert got["tmp"] == [] and got["reserve_left"] is False  # a final status frees the reserve


@pytest.mark.slow
def test_full_disk_before_start_is_refused_up_front():
    got = _in_small_disk("""
        import json, os
        from commlab.config import ConfigError, RunConfig
        from commlab.engine import launch
        try:
            launch.start(RunConfig(workload="mlp", steps=5, runs_dir=os.environ["DISK"] + "/runs"))
            refused = None
        except ConfigError as e:
            refused = e.errors
        print(json.dumps({"refused": refused, "left": os.listdir(os.environ["DISK"] + "/runs")}))
    """)
    assert list(got["refused"]) == ["runs_dir"] and "MiB free" in got["refused"]["runs_dir"]
    assert got["left"] == []


@pytest.mark.slow
def test_disk_full_mid_run_ends_it_failed_with_the_reason():
    """A real run whose runs folder fills up as it goes: it ends failed, saying which file could
    not be written, with every complete metrics line kept and no temporary file left."""
    got = _in_small_disk("""
        import json, os, time
        from pathlib import Path
        from commlab.api import RunConfig, launch
        from commlab.engine import store
        disk = Path(os.environ["DISK"])
        store.MIN_FREE_BYTES = 0
        run = launch(RunConfig(workload="mlp", steps=10**6, world_size=2, runs_dir=str(disk / "runs"),
                               stall_timeout_s=600))
        while not store.read_jsonl(run.file("metrics.jsonl")) and run.is_running():
            time.sleep(0.2)
        # Fill the disk, leaving room for a few hundred steps.
        with open(disk / "filler", "wb") as f:
            try:
                while os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize > 100_000:
                    f.write(b"\\0" * 16384)
            except OSError:
                pass
        t0 = time.time()
        run.wait(600)
        lines = run.file("metrics.jsonl").read_bytes().split(b"\\n")
        print(json.dumps({"status": run.status_record(), "after_s": time.time() - t0,
                          "complete": lines[-1] == b"" and all(json.loads(l) for l in lines[:-1]),
                          "steps": len(lines) - 1,
                          "tmp": [p.name for p in run.path.rglob("*.tmp")]}))
    """, size="24m")
    status = got["status"]
    assert status["status"] == "failed", status
    # Whichever of rank 0's files is written first once the disk is full is the one named: the
    # metrics as each step ends, or the ledger rank 0 rewrites as it goes.
    assert re.search(r"no space left on device writing (metrics\.jsonl|ledger\.json)$", status["error"]), status
    assert got["complete"] and got["steps"] > 0 and got["tmp"] == []
    print(f"fault to final status: {got['after_s']:.1f} s")


@pytest.mark.parametrize("plan", [b"\xff\xfe", b"[1, 2]", b'{"spec": {"base": 7}}', b'{"labels": []}'])
def test_a_damaged_sweep_is_named_and_hides_nothing(plan, tmp_path, monkeypatch, capsys):
    """A sweep folder whose sweep.json is junk: the Sweep page says what is damaged, the What-if
    page and `commlab whatif --sweep` go on without it, nothing raises."""
    from commlab.tune import sweep as sw

    folder = tmp_path / sw.SWEEPS / "20261201-000000-junk"
    folder.mkdir(parents=True)
    (folder / "sweep.json").write_bytes(plan)
    (folder / "state.json").write_text('{"status": "finished", "runs": [7]}')
    (damaged,) = sw.list_sweeps(tmp_path)
    assert damaged.damage().startswith("damaged: sweep.json: ")
    assert damaged.state() == {} and damaged.runs() == []
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    at.switch_page("pages/sweep.py").run()
    assert not _exceptions(at) and any(e.value.startswith("damaged: sweep.json") for e in at.error)
    at.switch_page("pages/what_if.py").run()
    assert not _exceptions(at)
    assert cli.main(["whatif", "--sweep", str(folder)]) == 2
    assert "damaged: sweep.json" in capsys.readouterr().err
