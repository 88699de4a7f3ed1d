"""Real torchrun runs: every hook on Gloo with several buckets, and every way a run can end; and,
without a process, the states a run folder reads as and the engine's pure parts."""
import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from commlab.api import Run, RunConfig, launch, open_run, run
from commlab.engine import procs, store
from commlab.engine.commands import torchrun_argv, worker_env
from commlab.engine.launch import prepare, torchrun_command
from commlab.hook_specs import PAGE, WRAPPERS, hooks_of

HERE = __import__("pathlib").Path(__file__).parent


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_hook_and_wrapper_trains_on_gloo_with_several_buckets(tmp_path, world_size):
    out = tmp_path / "matrix.json"
    proc = subprocess.run(torchrun_argv(world_size, [str(HERE / "hook_matrix.py"), str(out)]),
                          capture_output=True, text=True, timeout=400, cwd=HERE.parent,
                          env=worker_env(RunConfig(world_size=world_size)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    expected = {(h, w) for h in hooks_of(PAGE) for w in WRAPPERS if not (h == "noop" and w != "none")}
    assert {(r["hook"], r["wrapper"]) for r in results} == expected
    for r in results:
        assert r["buckets"] >= 2, r
        assert r["finite"], r
        if r["hook"] == "noop":
            assert r["bytes"] == 0 and not r["replicas_equal"], r  # nothing sent: replicas drift
        else:
            assert r["bytes"] > 0 and r["replicas_equal"], r
    by = {(r["hook"], r["wrapper"]): r for r in results}
    assert by[("powersgd", "none")]["impl"] == "commlab"
    assert by[("bf16", "none")]["impl"] == "commlab"
    assert by[("allreduce", "none")]["impl"] == "stock"
    # Compression is real: fp16 halves the bytes, PowerSGD sends fewer still.
    full = by[("allreduce", "none")]["bytes"]
    assert by[("fp16", "none")]["bytes"] == full // 2
    assert by[("powersgd", "none")]["bytes"] < full


def test_torchrun_command_is_loopback_and_exact(tmp_path, monkeypatch):
    from commlab import devices

    cmd = torchrun_command(RunConfig(world_size=3), tmp_path, python="py")
    # On a machine without a GPU driver the ranks are forked from torchrun, its imports done.
    fork = ["--start-method", "fork"] if devices.ranks_forkable() else []
    assert cmd == ["py", "-m", "commlab.engine.torchrun", "--nnodes", "1", "--nproc-per-node", "3",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
                   "--local-addr", "127.0.0.1", "--max-restarts",
                   "0", "--monitor-interval", "0.2", *fork, "-m", "commlab.engine.worker", str(tmp_path)]
    monkeypatch.setenv(devices.FORK_ENV, "0")  # each rank an interpreter of its own, as asked
    assert "--start-method" not in torchrun_command(RunConfig(world_size=3), tmp_path, python="py")


def test_powersgd_run_folder(powersgd_run):
    """The session's PowerSGD run: several buckets, fewer bytes once compression starts, and
    the approximation error recorded every K steps with the cost of measuring it."""
    meta, cfg = powersgd_run.meta(), powersgd_run.config()
    assert meta["hook_impl"] == "commlab" and meta["backend"] == "gloo"
    buckets = powersgd_run.buckets()
    assert len(buckets["rebuilt"]) >= 2
    assert sum(b["numel"] for b in buckets["iter0"]) == sum(b["numel"] for b in buckets["rebuilt"])
    assert sum(b["is_last"] for b in buckets["rebuilt"]) == 1
    m = powersgd_run.metrics()
    assert list(m["step"]) == list(range(cfg.steps))
    before = m[m.step < cfg.start_powerSGD_iter]
    after = m[m.step >= cfg.start_powerSGD_iter]
    assert (before.payload_bytes == before.plain_bytes).all()
    assert (after.payload_bytes < after.plain_bytes).all()
    layers = powersgd_run.layers()
    compressed = sum((4 * d["numel_after"]) for d in layers if d["compressed"])
    plain = sum((4 * d["numel_after"]) for d in layers if not d["compressed"])
    assert after.payload_bytes.iloc[-1] == compressed + plain  # bytes match the rule, exactly
    assert (m.wire_bytes == m.payload_bytes).all()  # 2(N-1)/N = 1 at N = 2
    errors = powersgd_run.error_records()
    assert [e["step"] for e in errors] == list(range(0, cfg.steps, cfg.error_every))
    assert all(e["measure_bytes"] > 0 for e in errors)
    first = errors[0]["buckets"]  # before compression starts the hook is exact
    assert max(b["rel_error"] for b in first) < 1e-6
    late = errors[-1]
    assert late["layers"] and all(0 < layer["rel_error"] for layer in late["layers"])
    assert late["ef_residual_norm"] > 0
    assert powersgd_run.grad_steps() == [8, 9, 10]
    assert set(powersgd_run.grads(8)) == {d["name"] for d in layers}


@pytest.mark.slow
def test_cli_run_json_three_ranks_batched_bf16(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "commlab", "run", "--hook", "batched_powersgd",
                           "--wrapper", "bf16", "--world-size", "3", "--workload", "mlp",
                           "--steps", "8", "--start-powersgd-iter", "2", "--bucket-cap-mb", "0.05",
                           "--runs-dir", str(tmp_path), "--json"],
                          capture_output=True, text=True, timeout=300)
    payload = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, payload
    assert set(payload) >= {"run_id", "run_dir", "status", "steps", "final_loss", "median_step_s",
                            "bytes_per_step", "compression_ratio", "hook_impl"}
    assert payload["status"] == "finished" and payload["steps"] == 8
    assert payload["hook_impl"] == "commlab" and payload["compression_ratio"] > 2
    listed = subprocess.run([sys.executable, "-m", "commlab", "runs", "--runs-dir", str(tmp_path),
                             "--json"], capture_output=True, text=True, timeout=60)
    assert json.loads(listed.stdout.strip().splitlines()[-1])["runs"][0]["status"] == "finished"


@pytest.mark.slow
def test_a_crashing_rank_ends_the_run_and_is_named(tmp_path):
    r = run(RunConfig(workload="tests.misbehaving_workloads:crashing", steps=50, runs_dir=str(tmp_path),
                      world_size=2), timeout=300)
    rec = r.status_record()
    assert rec["status"] == "failed"
    assert rec["failed_rank"] == 1
    assert "ran out of data on purpose" in rec["error"]
    assert "RuntimeError" in rec["traceback"]
    died = json.loads((r.path / "rank1.error.json").read_text())["time"]
    assert rec["ended_at"] - died < 10


@pytest.mark.slow
def test_stop_leaves_no_process_even_a_worker_ignoring_sigterm(tmp_path):
    r = launch(RunConfig(workload="tests.misbehaving_workloads:stubborn", steps=10_000,
                         runs_dir=str(tmp_path), world_size=2))
    assert r.status() == "starting" and r.is_running()  # start returns before the supervisor is up
    deadline = time.monotonic() + 240
    while len(r.metrics_records()) < 2:
        assert r.is_running() and time.monotonic() < deadline, r.status_record()
        time.sleep(0.2)
    assert r.status() == "running"
    sup = json.loads((r.path / "supervisor.json").read_text())
    pids = [sup["pid"], sup["torchrun_pid"], *sup["worker_pids"]]
    assert len(sup["worker_pids"]) >= 2
    # The supervisor is the one launch spawned, and it runs exactly the recorded command, in the
    # environment launch computed once.
    info = r.launch_info()
    assert (info["supervisor"]["pid"], info["supervisor"]["create_time"]) == (sup["pid"], sup["create_time"])
    torchrun = psutil.Process(sup["torchrun_pid"])
    assert torchrun.cmdline() == info["command"]
    path = torchrun.environ()["PYTHONPATH"].split(os.pathsep)
    assert len(path) == len(set(path)) and str(HERE.parent) in path, path
    # Training: torchrun's stores and Gloo are up, and none of them is reachable from outside.
    listening = [c.laddr.ip for pid in pids for c in psutil.Process(pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert len(listening) >= 2 and set(listening) <= {"127.0.0.1", "::1"}, listening
    assert r.stop() == "stopped"
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert len(open_run(r.path).metrics_records()) >= 2  # what it measured is kept


@pytest.mark.slow
def test_stop_while_starting_ends_the_supervisor_before_torchrun(tmp_path):
    r = launch(RunConfig(workload="mlp", steps=10_000, runs_dir=str(tmp_path), world_size=2))
    assert r.status() == "starting"
    spawned = r.launch_info()["supervisor"]
    assert r.stop() == "stopped" and r.status_record()["error"] == "stopped by the user"
    assert not procs.alive(spawned["pid"], spawned["create_time"])
    sup = store.read_json(r.file("supervisor.json"), {})
    assert not [pid for pid in [sup.get("torchrun_pid"), *sup.get("worker_pids", [])] if procs.alive(pid)]
    assert not r.metrics_records() and r.status() == "stopped"


@pytest.mark.slow
def test_a_supervisor_that_dies_before_it_is_up_leaves_a_lost_run(tmp_path):
    r = launch(RunConfig(workload="mlp", steps=10_000, runs_dir=str(tmp_path), world_size=2))
    spawned = r.launch_info()["supervisor"]
    psutil.Process(spawned["pid"]).kill()  # before it could write supervisor.json
    assert procs.wait_until(lambda: not procs.alive(spawned["pid"], spawned["create_time"]), 30)
    rec = r.status_record()
    assert rec["status"] == "lost" and "never came up" in rec["error"], rec
    assert not r.is_running() and r.stop() == "stopped"


@pytest.mark.slow
def test_nan_loss_stops_the_run_as_diverged(tmp_path):
    r = run(RunConfig(workload="tests.misbehaving_workloads:exploding", steps=50, lr=0.01,
                      runs_dir=str(tmp_path), world_size=2), timeout=300)
    rec = r.status_record()
    assert rec["status"] == "diverged" and rec["step"] == 3, rec
    assert len(r.metrics_records()) == 4


@pytest.mark.slow
def test_no_step_for_the_stall_timeout_is_stalled(tmp_path):
    r = run(RunConfig(workload="tests.misbehaving_workloads:sleepy", steps=50, stall_timeout_s=4,
                      runs_dir=str(tmp_path), world_size=2, hook="powersgd"), timeout=300)
    rec = r.status_record()
    assert rec["status"] == "stalled", rec
    assert "after step 2" in rec["error"] and "powersgd" in rec["error"]


# ---------------------------------------------------------------------------- no process
def test_a_prepared_run_is_starting_owned_by_the_process_that_prepared_it(tmp_path):
    folder = prepare(RunConfig(runs_dir=str(tmp_path), workload="mlp"))
    assert Run(folder.path).is_running()
    rec = folder.status_record()
    assert rec["status"] == "starting" and folder.launch_info()["launcher"]["pid"] == os.getpid()
    assert [f.name for f in sorted(folder.path.iterdir())] == [".reserve", "config.json", "launch.json",
                                                               "status.json"]
    assert folder.launch_info()["command"] == torchrun_command(folder.config(), folder.path.resolve())


def test_a_starting_run_whose_supervisor_is_gone_is_lost_without_a_guess(tmp_path):
    """No folder-age guess: a starting run is judged by the supervisor recorded as it was spawned."""
    folder = prepare(RunConfig(runs_dir=str(tmp_path), workload="mlp"))
    # This very PID with another create time: a process that is gone (its PID now someone else's).
    gone = {"pid": os.getpid(), "create_time": procs.identity(os.getpid())["create_time"] - 100}
    store.write_json(folder.file("launch.json"), {**folder.launch_info(), "supervisor": gone})
    rec = folder.status_record()
    assert rec["status"] == "lost" and "never came up" in rec["error"], rec
    assert not Run(folder.path).is_running()


def test_a_run_is_running_once_its_supervisor_is_up(tmp_path):
    folder = prepare(RunConfig(runs_dir=str(tmp_path), workload="mlp"))
    store.write_json(folder.file("supervisor.json"), {**procs.identity(os.getpid()), "worker_pids": []})
    assert folder.status() == "running"  # the supervisor says so next; supervisor.json is the fact
    store.write_json(folder.file("supervisor.json"), {"pid": os.getpid(), "create_time": 0.0})
    rec = folder.status_record()
    assert rec["status"] == "lost" and "never recorded an end" in rec["error"]


def test_the_worker_environment_is_loopback_and_idempotent():
    env = worker_env(RunConfig(world_size=2), {"PYTHONPATH": "/x", "GLOO_SOCKET_IFNAME": "eth0"})
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] != "eth0"  # set, never defaulted
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["PYTHONUNBUFFERED"] == "1"
    path = env["PYTHONPATH"].split(os.pathsep)
    assert path[0] == str(HERE.parent) and path[-1] == "/x"
    assert worker_env(RunConfig(world_size=2), env) == env


def test_wait_until_answers_true_at_once_or_its_last_answer_at_the_timeout():
    answers = iter([False, False, True])
    assert procs.wait_until(lambda: next(answers), timeout=5, interval=0)
    t0 = time.monotonic()
    assert not procs.wait_until(lambda: False, timeout=0.2, interval=0.05)
    assert 0.2 <= time.monotonic() - t0 < 2


# ---------------------------------------------------------------------------- the test tiers
@pytest.mark.slow
def test_the_leak_fixture_fails_an_unmarked_test_that_starts_a_process(pytester, monkeypatch):
    """tests/conftest.py's rule, on a suite of three: it is not vacuous."""
    monkeypatch.setenv("COMMLAB_TEST_LEAK_GRACE_S", "1")  # the sleeper below never ends by itself
    pytester.makeconftest((HERE / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    slow: starts processes\n")
    pytester.makepyfile(test_tiers="""
        import subprocess, sys
        import pytest

        def test_starts_one_unmarked():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        @pytest.mark.slow
        def test_starts_one_marked():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        @pytest.mark.slow
        def test_leaves_one():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=3, errors=2)  # every call passes; two teardowns fail
    out = result.stdout.str()
    assert "test_starts_one_unmarked" in out and "but is not marked slow: mark it" in out
    assert "processes left behind by this test" in out and "time.sleep(60)" in out
