"""Hostile and careless input (issue 14, items 4, 6 and 7): every bad setting is refused by name
before anything starts (exit 2 on the CLI), a user's workload runs only in a child process, and
nothing a run, a sweep, the classroom, the bench or the app starts listens beyond loopback."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from commlab import cli
from commlab.config import HOOKS, RunConfig, settings
from commlab.engine import procs, workload_probe
from commlab.ui import form

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOPBACK = {"127.0.0.1", "::1"}


def errors_of(**kw):
    return RunConfig(**kw).errors(gpu_count=0)


def run_cli(*argv: str, capsys) -> tuple[int, dict]:
    code = cli.main(["run", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


# --------------------------------------------------------------------------- item 6: bounds
@pytest.mark.parametrize("field, value", [
    ("seed", 10**20), ("stall_timeout_s", 1e300), ("bucket_cap_mb", 1e30), ("batch_size", 10**20),
    ("emulate_bandwidth_gbps", 1e-300), ("random_seed", -1), ("world_size", 10**30),
    ("steps", 10**12), ("lr", 1e300), ("matrix_approximation_rank", 10**9),
    ("orthogonalization_epsilon", 1e300), ("error_every", 10**15), ("emulate_latency_us", 1e300),
    ("start_powerSGD_iter", 10**30), ("min_compression_rate", 1e300),
])
def test_numbers_the_workers_cannot_take_are_refused_by_name_with_the_range(field, value):
    errs = errors_of(**{field: value})
    assert set(errs) == {field}, errs
    bounds = next(s.bounds for s in settings() if s.name == field)
    assert f"(allowed: {bounds.text})" in errs[field] and bounds.why in errs[field]


def test_every_number_in_the_table_has_bounds_that_admit_its_default(capsys):
    numbers = [s for s in settings() if s.kind in ("int", "float")]
    assert len(numbers) >= 15
    for s in numbers:
        assert s.bounds is not None and s.bounds.error(s.default) is None, s.name
    # the CLI's help says each range
    monkeyed = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100000"
    try:
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["run", "--help"])
    finally:
        os.environ.pop("COLUMNS") if monkeyed is None else os.environ.update(COLUMNS=monkeyed)
    text = capsys.readouterr().out
    for s in numbers:
        assert f"Allowed: {s.bounds.text}." in text, s.name


def test_random_seed_takes_what_numpy_takes():
    assert errors_of(random_seed=2**32 - 1) == {}
    assert "random_seed" in errors_of(random_seed=2**32)


def test_an_integer_too_long_to_print_is_refused_without_printing_it(tmp_path, capsys):
    assert "bits" in errors_of(seed=10**10000)["seed"]
    path = tmp_path / "big.json"
    path.write_text('{"seed": ' + "9" * 5000 + "}")
    code, payload = run_cli("--config", str(path), capsys=capsys)
    assert code == 2 and "file" in payload["errors"]


# --------------------------------------------------------------------------- item 7: bad input
def test_a_config_file_that_is_not_utf8_exits_2_naming_the_file(tmp_path, capsys):
    path = tmp_path / "latin1.json"
    path.write_bytes('{"hook": "powersgd", "workload": "caf\xe9"}'.encode("latin-1"))
    code, payload = run_cli("--config", str(path), capsys=capsys)
    assert code == 2 and "not UTF-8" in payload["errors"]["file"]


def test_a_toml_file_is_read_as_toml_whatever_the_case_of_its_suffix(tmp_path, capsys):
    path = tmp_path / "SETTINGS.TOML"
    path.write_text('hook = "powersgd"\nworld_size = 3\n')
    assert RunConfig.load(path) == RunConfig(hook="powersgd", world_size=3)
    path.write_text('world_size = 10000\n')
    code, payload = run_cli("--config", str(path), "--runs-dir", str(tmp_path / "runs"), capsys=capsys)
    assert code == 2 and set(payload["errors"]) == {"world_size"}


@pytest.mark.parametrize("case", ["a file", "/dev/null", "read-only", "under a file", "NUL"])
def test_a_runs_folder_that_cannot_hold_runs_exits_2(case, tmp_path, capsys):
    a_file = tmp_path / "not_a_folder"
    a_file.write_text("x")
    runs_dir = {"a file": str(a_file), "/dev/null": "/dev/null", "under a file": str(a_file / "runs"),
                "read-only": "/proc/sys/commlab_runs", "NUL": "runs\0x"}[case]
    code, payload = run_cli("--runs-dir", runs_dir, capsys=capsys)
    assert code == 2 and set(payload["errors"]) == {"runs_dir"}, payload
    assert a_file.read_text() == "x" and not (tmp_path / "runs").exists()


def test_an_empty_runs_dir_variable_is_refused_not_the_working_folder(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COMMLAB_RUNS_DIR", "")
    code, payload = run_cli(capsys=capsys)
    assert code == 2 and "COMMLAB_RUNS_DIR" in payload["errors"]["runs_dir"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("field", ["hook", "workload", "runs_dir", "learning_rate"])
def test_a_50_mb_value_gives_a_short_message(field, tmp_path, capsys):
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({field: "x" * 50_000_000} if field != "learning_rate"
                               else {"x" * 50_000_000: 1}))
    code, payload = run_cli("--config", str(path), capsys=capsys)
    assert code == 2 and len(json.dumps(payload)) < 2000, len(json.dumps(payload))
    assert "50,000,00" in json.dumps(payload)  # it says how long the value was


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "1e300"])
def test_classroom_and_bench_refuse_a_timeout_before_starting_ranks(timeout, capsys):
    for argv in (["allreduce", "--world-size", "2"], ["broadcast"],
                 ["bench", "--world-size", "2", "--sizes", "1KB", "--backend", "gloo"]):
        assert cli.main([*argv, "--timeout", timeout, "--json"]) == 2, argv
        assert "timeout" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["errors"]


# --------------------------------------------------------------------------- item 4c: workloads
def test_validating_a_user_workload_runs_none_of_its_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "marks_on_import.py").write_text(
        "open('imported', 'w').close()\ndef make():\n    open('called', 'w').close()\n")
    assert errors_of(workload="marks_on_import:make") == {}
    assert errors_of(workload="os:abort") == {}  # spelled right: only the probe can tell
    assert "module:function" in errors_of(workload="not a module:make")["workload"]
    assert "characters long" in errors_of(workload="m:" + "f" * 300)["workload"]
    assert list(tmp_path.iterdir()) == [tmp_path / "marks_on_import.py"]
    assert "marks_on_import" not in sys.modules


WORKLOADS = {
    "hangs_on_import.py": "import time\ntime.sleep(3600)\ndef make():\n    pass\n",
    "exits.py": "import sys\ndef make():\n    sys.exit(0)\n",
    "shapes.py": textwrap.dedent("""
        import torch
        def no_parameters():
            return torch.nn.ReLU(), lambda: iter([(torch.randn(4, 8), torch.randn(4, 8))] * 1000)
        def wrong_targets():
            def batches():
                while True:
                    yield torch.randn(16, 8), torch.randn(16, 1)
            return torch.nn.Linear(8, 4), batches
        def few_batches():
            return torch.nn.Linear(8, 1), lambda: iter([(torch.randn(4, 8), torch.randn(4, 1))] * 3)
        def class_out_of_range():
            return torch.nn.Linear(8, 4), lambda: iter([(torch.randn(4, 8), torch.full((4,), 7))] * 1000)
        def dict_without_labels():
            return torch.nn.Linear(8, 2), lambda: iter([{"input": torch.randn(4, 8)}] * 1000)
        def misspelt_loss():
            return {"model": torch.nn.Linear(8, 2), "batches": lambda: iter([]), "los": print}
        def vector_loss():
            batches = lambda: iter([{"input": torch.randn(4, 8)}] * 1000)
            return {"model": torch.nn.Linear(8, 2), "batches": batches, "loss": lambda out, b: out}
        def string_output():
            class Talks(torch.nn.Linear):
                def forward(self, x):
                    return ("logits", super().forward(x))
            return Talks(8, 2), lambda: iter([(torch.randn(4, 8), torch.zeros(4).long())] * 1000)
        def good(batch_size=4):
            def batches():
                while True:
                    yield torch.randn(batch_size, 8), torch.randn(batch_size, 1)
            return torch.nn.Linear(8, 1), batches
    """),
}


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """A folder holding misbehaving workload modules, the working folder of the test."""
    for name, text in WORKLOADS.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("spec, words", [
    ("os:abort", "killed its process with SIGABRT"),
    ("exits:make", "exit code 0"),
    ("shapes:no_parameters", "no parameter that requires a gradient"),
    ("shapes:wrong_targets", "float targets of shape (16, 1) against outputs of shape (16, 4)"),
    ("shapes:few_batches", "ended after 3 batch(es), the run takes 10 steps"),
    ("shapes:class_out_of_range", "class indices 0..3"),
    ("shapes:dict_without_labels", "a dict batch without 'labels' leaves nothing to compare"),
    ("shapes:misspelt_loss", "returned a dict with 'los': it may hold model, batches, eval_batches, loss"),
    ("shapes:vector_loss", "loss(outputs, batch) must be a floating-point scalar tensor (backward starts "
                           "from it), got a tensor of shape (4, 2)"),
    ("shapes:string_output", "got tuple of 2 (str, Tensor)"),
    ("nosuchmodule_xyz:make", "does not import"),
    ("collections:OrderedDict", "must return (model, batches)"),
    ("json:nothere", "has no function"),
])
def test_the_probe_names_what_is_wrong_with_a_workload(spec, words, user_folder):
    msg = workload_probe.error(RunConfig(workload=spec, steps=10, runs_dir=str(user_folder)))
    assert msg and words in msg, msg


@pytest.mark.slow
def test_the_probe_passes_a_good_workload_and_gives_up_on_a_hang(user_folder):
    assert workload_probe.error(RunConfig(workload="shapes:good", steps=10)) is None
    t0 = time.monotonic()
    msg = workload_probe.error(RunConfig(workload="hangs_on_import:make"), timeout_s=8)
    assert "did not finish within 8 s" in msg and time.monotonic() - t0 < 30


@pytest.mark.slow
def test_the_form_checks_a_workload_in_a_child_and_survives_os_abort(user_folder):
    cfg, errors = form.config_from_form({"workload": "os:abort", "runs_dir": str(user_folder / "r")})
    assert "SIGABRT" in errors["workload"]  # and this process, the server's stand-in, still runs
    cfg, errors = form.config_from_form({"workload": "exits:make"})
    assert "exit code 0" in errors["workload"]
    t0 = time.monotonic()  # asked again with nothing changed: the answer kept
    assert form.config_from_form({"workload": "exits:make"})[1] == errors
    assert time.monotonic() - t0 < 0.5


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["exits:make", "shapes:wrong_targets", "os:abort"])
def test_the_cli_refuses_a_bad_workload_with_exit_2_and_creates_nothing(spec, user_folder, capsys):
    runs = user_folder / "runs"
    code, payload = run_cli("--workload", spec, "--steps", "5", "--runs-dir", str(runs), capsys=capsys)
    assert code == 2 and set(payload["errors"]) == {"workload"}, payload
    assert not runs.exists() or not any(runs.iterdir())


# --------------------------------------------------------------------------- item 4b: loopback
def _listening(pids) -> list[str]:
    ips = []
    for pid in pids:
        try:
            ips += [c.laddr.ip for c in psutil.Process(pid).net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            pass
    return ips


class _Stop(Exception):
    pass


def _ranks_listen_on_loopback(start) -> None:
    """``start(look)`` runs ranks that call ``look`` at their first report, with Gloo up."""
    listening = []

    def look(_):
        listening.extend(_listening(p.pid for p in psutil.Process().children(recursive=True)))
        raise _Stop

    with pytest.raises(_Stop):
        start(look)
    assert len(listening) >= 2 and set(listening) <= LOOPBACK, listening


@pytest.mark.slow
def test_classroom_ranks_stay_on_loopback_with_eth0_in_the_environment(monkeypatch):
    from commlab.teach import averaging

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    _ranks_listen_on_loopback(lambda look: averaging.run_ranks(
        averaging._grad_rank, 2, (100_000, 0.01, 0), on_message=look))


@pytest.mark.slow
def test_bench_ranks_stay_on_loopback_with_eth0_in_the_environment(monkeypatch):
    from commlab.teach import bench

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    plan = bench.bench_plan(2, "1KB,1MB", "gloo", iters=2000, warmup=1)
    _ranks_listen_on_loopback(lambda look: bench.run_plan(plan, on_row=look))


@pytest.mark.slow
def test_a_sweep_s_runs_stay_on_loopback_with_eth0_in_the_environment(monkeypatch, tmp_path):
    from commlab.engine import store
    from commlab.tune import sweep as sw

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    base = RunConfig(workload="mlp", steps=100_000, runs_dir=str(tmp_path), stall_timeout_s=600)
    s = sw.start(sw.SweepSpec(base, baseline=True, matrix_approximation_rank=[1]))
    try:
        deadline = time.monotonic() + 240
        while True:
            runs = s.runs()
            sup = store.read_json(runs[0].file("supervisor.json"), {}) if runs else {}
            if sup.get("worker_pids") and runs[0].metrics_records():
                break
            assert s.is_running() and time.monotonic() < deadline, s.state()
            time.sleep(0.3)
        workers = sup["worker_pids"]
        assert psutil.Process(workers[0]).environ()["GLOO_SOCKET_IFNAME"] != "eth0"
        listening = _listening([sup["pid"], sup["torchrun_pid"], *workers])
        assert len(listening) >= 2 and set(listening) <= LOOPBACK, listening
    finally:
        s.request_stop()
        s.wait(timeout=120)
        for run in s.runs():
            run.stop()


# --------------------------------------------------------------------------- item 4a: the app
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_the_app_started_from_another_folder_listens_on_loopback_only(tmp_path):
    port = _free_port()
    env = {**os.environ, "HOME": str(tmp_path)}  # no global ~/.streamlit to lean on
    for key in [k for k in env if k.startswith("STREAMLIT_")]:
        del env[key]
    app = procs.spawn([sys.executable, "-m", "streamlit", "run", os.path.join(ROOT, "app.py"),
                       "--server.port", str(port)], log=tmp_path / "app.log", env=env)
    try:
        def up() -> list[str]:
            return _listening(p.pid for p in procs.tree(app.pid))

        assert procs.wait_until(up, timeout=120, interval=0.3), (tmp_path / "app.log").read_text()
        time.sleep(1)  # every listener of the server is up
        assert set(up()) <= LOOPBACK, up()
        log = (tmp_path / "app.log").read_text()
        assert "0.0.0.0" not in log and "Network URL" not in log, log
    finally:
        procs.kill_tree(app.pid)
        app.wait(10)
    assert subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True,
                          text=True).stdout.strip() == ""


# --------------------------------------------------------------------------- the CLI for reading
def test_help_shows_choices_and_defaults_without_rest_markup(capsys):
    for argv in (["--help"], ["run", "--help"], ["whatif", "--help"], ["rule", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        out = capsys.readouterr().out
        assert "``" not in out, argv
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    run_help = " ".join(capsys.readouterr().out.split())
    assert f"One of: {', '.join(HOOKS)}. (default: allreduce)" in run_help
    with pytest.raises(SystemExit):
        cli.main(["whatif", "--help"])
    whatif_help = " ".join(capsys.readouterr().out.split())
    assert "(default: 5.0)" in whatif_help and "run ids" in whatif_help


def test_numbers_are_printed_for_reading():
    from commlab.analysis.units import human_bytes, number
    from commlab.commands.run import result_text

    assert number(1.6396629810333252) == "1.640" and number(80_411_200) == "80,411,200"
    assert human_bytes(340_008) == "332.0 KiB" and human_bytes(1023) == "1,023 B"
    text = result_text({"status": "finished", "steps": 200, "final_loss": 1.6396629810333252,
                        "median_step_s": 0.0123456, "bytes_per_step": 340_008.0,
                        "steady_compression_ratio": 31.2737, "compression_ratio": 7.918,
                        "hook_impl": "commlab"})
    assert text == ("finished: 200 steps, final loss 1.640, median step 12.3 ms, 332.0 KiB per "
                    "step and rank, steady-state compression ratio 31.27x (compression ratio so "
                    "far 7.92x), hook implementation commlab")


def test_progress_piped_is_a_few_plain_lines():
    import io

    from commlab.commands import Progress

    out = io.StringIO()  # not a terminal: no bar, no carriage returns
    progress = Progress(200, stream=out)
    for done in range(1, 201):
        progress.update(done, loss=2.0 / done)
    progress.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert len(lines) == 11 and lines[0] == "step 1/200  loss 2.000" and lines[-1].startswith("step 200/200")


def test_runs_and_sweeps_are_found_by_the_id_commlab_runs_prints(tmp_path, monkeypatch):
    from commlab.commands import resolve_run, resolve_sweep
    from commlab.config import ConfigError

    run = tmp_path / "20260101-000000-allreduce-abcd"
    run.mkdir()
    (run / "config.json").write_text("{}")
    sweep = tmp_path / "sweeps" / "20260101-000000-sweep-ef01"
    sweep.mkdir(parents=True)
    (sweep / "sweep.json").write_text("{}")
    assert resolve_run(run.name, str(tmp_path)) == run
    assert resolve_run(str(run)) == run
    assert resolve_sweep(sweep.name, str(tmp_path)) == sweep
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    assert resolve_run(run.name) == run
    with pytest.raises(ConfigError, match="neither a run folder nor the id"):
        resolve_run("nope")
    assert cli.main(["whatif", "nope"]) == 2


def test_a_whole_pickled_model_is_refused_in_one_line_without_colour(tmp_path, capsys):
    import torch

    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 3)), tmp_path / "whole.pt")
    assert cli.main(["rule", "--checkpoint", str(tmp_path / "whole.pt"),
                     "--matrix-approximation-rank", "1"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and len(err.strip().splitlines()) == 2  # the heading and one line
    assert "holds a pickled Sequential (saved with torch.save(model)?)" in err
    assert "torch.save(model.state_dict(), path)" in err
