"""A run on a real link (``commlab.engine.launchers.reallink``): each rank in a network namespace of
its own, veths to a bridge shaped by tc's tbf.  Real runs, real namespaces: they need root or an
unprivileged user namespace, and are skipped with the reason where neither works, except under CI
(env CI), where they must run.  Nothing they make is named or lives in this machine's namespace:
each namespace goes with its last process, and the ``namespaces`` fixture ends any process of
the run's namespaces that a failing test left."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from commlab.analysis import kernel_bytes
from commlab.config import ConfigError, RunConfig, link_of
from commlab.engine import launch, procs, store
from commlab.engine.launchers import reallink
from commlab.engine.launchers.choice import chosen
from commlab.engine.launchers.warm import Batch

RUN_TIMEOUT_S = 300


# ---------------------------------------------------------------------------- no process
def test_the_bucket_holds_at_least_what_one_timer_tick_brings_at_the_rate():
    for rate in (1, 50, 100, 200, 1000, 10000):
        for hz in (100, 250, 300, 1000):
            assert reallink.burst_bytes(rate, hz) >= rate * 1e6 / 8 / hz
            assert reallink.burst_bytes(rate, hz) >= reallink.MIN_BURST
    # the 1 Gb/s link with a 64 KB bucket ran slower than 100 Mb/s: not here
    assert reallink.burst_bytes(1000, 250) >= 500_000
    tc = reallink.shaping(200, 250)
    assert tc[:3] == ["tbf", "rate", "200mbit"] and int(tc[tc.index("limit") + 1]) > int(tc[tc.index("burst") + 1])


def test_the_kernel_hz_is_read_or_the_assumption_said():
    hz, where = reallink.kernel_hz()
    assert hz in (100, 250, 300, 1000)
    assert where.startswith(("/proc/config.gz", "/boot/config-", "assumed"))


def test_the_rate_is_a_setting_whose_help_says_network_namespace_and_a_rate_out_of_range_is_refused():
    from commlab.config import settings

    s = next(s for s in settings() if s.name == "real_link_mbps")
    assert "network namespace" in s.help and s.default == 0.0
    for bad in (0.5, 20000, -1):
        assert "real_link_mbps" in RunConfig(real_link_mbps=bad).errors()
    assert "real_link_mbps" not in RunConfig(real_link_mbps=100).errors()
    with pytest.raises(ConfigError) as e:
        chosen(cfg=RunConfig(real_link_mbps=100), node=object())
    assert "network namespace" in e.value.errors["real_link_mbps"]
    assert type(chosen(cfg=RunConfig(real_link_mbps=100))).__name__ == "RealLink"
    assert link_of(RunConfig(real_link_mbps=100, emulate_latency_us=50).to_dict()) == "real 100 Mb/s, 50 µs per hop"


def test_the_run_says_which_latency_it_has():
    unknown = "Specified qdisc kind is unknown."
    assert reallink.latency_said(0, unknown) == f"none added (netem absent from this kernel: {unknown})"
    assert "emulated in the hooks" in reallink.latency_said(50, unknown)
    assert reallink.latency_said(50, None) == "50 µs per ring hop, netem's delay on each rank's link (the hooks add none)"


@pytest.mark.slow  # records() probes the kernel in throwaway namespaces
def test_where_the_kernel_has_netem_the_latency_is_its_delay_on_the_wire_and_not_in_the_hooks(tmp_path, monkeypatch):
    """This kernel has no netem (CONFIG_NET_SCH_NETEM is not set): what a kernel with it is given is
    checked here as the commands and records it would run, the kernel's answer to them never."""
    tbf = reallink.shaping(100, 250)
    assert reallink.qdiscs(tbf) == [["root", *tbf]]
    assert reallink.qdiscs(tbf, 50) == [["root", "handle", "1:", "netem", "delay", "50us"],
                                        ["parent", "1:1", "handle", "10:", *tbf]]
    cfg = RunConfig(real_link_mbps=100, emulate_latency_us=50, runs_dir=str(tmp_path))
    here = chosen(cfg=cfg).records(cfg, tmp_path)
    assert "rank_settings" not in here and here["real_link"]["delay_us"] == 0.0  # no netem: the hooks hold it
    assert "emulated in the hooks" in here["real_link"]["latency"]
    monkeypatch.setattr(reallink, "qdisc_error", lambda prefix, kind: None)
    there = chosen(cfg=cfg).records(cfg, tmp_path)
    assert there["real_link"]["delay_us"] == 50 and there["rank_settings"] == {"emulate_latency_us": 0.0}
    assert "netem's delay" in there["real_link"]["latency"]
    no_latency = RunConfig(real_link_mbps=100, runs_dir=str(tmp_path))
    assert "rank_settings" not in chosen(cfg=no_latency).records(no_latency, tmp_path)


def test_the_kernel_bytes_are_the_ledgers_and_ddps_broadcast_plus_headers_within_the_control_traffic():
    rows = [{"collective": "all_reduce", "ranks": 4, "size_bytes": 1000, "count": 10, "bytes": 10_000},
            {"collective": "all_gather", "ranks": 4, "size_bytes": 400, "count": 10, "bytes": 4_000}]
    assert kernel_bytes.ledger_sent(rows) == 10_000 * 1.5 + 4_000 * 0.75  # 2(N-1)/N, (N-1)/N
    # 300 steps of a 340 KB bucket and the lab's 4-byte loss, on 2 ranks
    rows = [{"collective": "all_reduce", "ranks": 2, "size_bytes": 340_000, "count": 300, "bytes": 102_000_000},
            {"collective": "all_reduce", "ranks": 2, "size_bytes": 4, "count": 300, "bytes": 1_200}]
    link = [{"rank": 1, "tx_bytes": 102_001_200 + 66 * 7000 + 250_000, "tx_packets": 7000},
            {"rank": 0, "tx_bytes": 102_001_200 + 85_000 * 4 + 66 * 6800 + 240_000, "tx_packets": 6800}]
    out = kernel_bytes.compare(link, rows, 2, 85_000)
    assert [r["rank"] for r in out] == [0, 1] and [r["control"] for r in out] == [240_000, 250_000]
    assert out[0]["ddp_broadcast"] == 340_000 and out[1]["ddp_broadcast"] == 0
    assert kernel_bytes.agree(out)
    # a ledger that missed one step's bucket, or counted a step twice, is caught
    short = [{**rows[0], "count": 299, "bytes": 101_660_000}, rows[1]]
    over = [{**rows[0], "count": 301, "bytes": 102_340_000}, rows[1]]
    assert not kernel_bytes.agree(kernel_bytes.compare(link, short, 2, 85_000))
    assert not kernel_bytes.agree(kernel_bytes.compare(link, over, 2, 85_000))


# ---------------------------------------------------------------------------- real namespaces
def _privileged() -> bool:
    prefix, why = reallink.privilege()
    if prefix is None and not os.environ.get("CI"):
        pytest.skip(f"no network namespaces here: {why}")
    return prefix is not None


def _ip_state() -> tuple[str, str]:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return "\n".join(sorted(line.split(":")[1].strip() for line in links.splitlines())), names


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _in(namespaces: set[str]) -> list[psutil.Process]:
    return [p for p in psutil.process_iter() if _netns(p.pid) in namespaces]


@pytest.fixture
def namespaces():
    """The network namespaces a test's run made (filled by the test); at the end, whatever
    happened, every process still in one of them is ended, which removes them."""
    made: set[str] = set()
    before = _ip_state()
    yield made, before
    procs.terminate(_in(made), grace_s=2.0)


def _run(tmp_path, steps: int, **kw) -> launch.Run:
    cfg = RunConfig(**{"workload": "mlp", "world_size": 2, "steps": steps, "real_link_mbps": 100, "eval_every": 0,
                       "runs_dir": str(tmp_path), **kw})
    return launch.start(cfg)


def _theirs(run: launch.Run) -> set[str]:
    sup = run.launch_info()["supervisor"]["pid"]
    return {n for p in procs.tree(sup) if (n := _netns(p.pid))} - {_netns(os.getpid())}


@pytest.mark.slow
def test_a_run_on_a_real_link_finishes_each_rank_in_its_own_namespace_and_leaves_nothing(tmp_path, namespaces):
    _privileged()
    made, before = namespaces
    run = _run(tmp_path, 300, hook="fp16")
    assert procs.wait_until(lambda: run.metrics_records() or not run.is_running(), RUN_TIMEOUT_S)
    made |= _theirs(run)
    assert len(made) == 3  # the hub (the supervisor's) and one per rank
    assert run.wait(RUN_TIMEOUT_S) == "finished", run.status_record()
    info = run.launch_info()["real_link"]
    assert info["rate_mbps"] == 100 and info["burst_bytes"] >= 100e6 / 8 / info["hz"]
    assert [n["address"] for n in info["nodes"]] == ["10.213.0.1", "10.213.0.2"]
    assert "network namespace" in launch.launchers.of(run.launch_info()).describe(run.config(), run.launch_info())
    # each rank talked on its veth, and the kernel counted what the ledger did (an fp16 hook: half
    # the parameters' bytes a step), with DDP's broadcast, the headers and the control traffic
    assert procs.wait_until(lambda: len(list(run.path.glob("link.rank*.json"))) == 2, 30)
    link = [store.read_json(p) for p in run.path.glob("link.rank*.json")]
    ledger = store.read_json(run.file("ledger.json"))["rows"]
    rows = kernel_bytes.compare(link, ledger, 2, store.read_json(run.file("meta.json"))["num_parameters"])
    print("kernel against ledger:", rows)
    assert kernel_bytes.ledger_sent(ledger) > 300 * 85002 * 2  # 300 steps of fp16 gradients
    assert kernel_bytes.agree(rows), rows
    assert procs.wait_until(lambda: not _in(made), 30), _in(made)
    assert _ip_state() == before


@pytest.mark.slow
def test_a_supervisor_killed_takes_its_namespaces_links_and_qdiscs_with_it(tmp_path, namespaces):
    _privileged()
    made, before = namespaces
    run = _run(tmp_path, 100000)
    assert procs.wait_until(lambda: run.metrics_records() or not run.is_running(), RUN_TIMEOUT_S)
    made |= _theirs(run)
    assert len(made) == 3 and _in(made)
    os.kill(run.launch_info()["supervisor"]["pid"], signal.SIGKILL)
    assert procs.wait_until(lambda: not _in(made), 30), [p.cmdline() for p in _in(made)]
    assert _ip_state() == before  # no bridge, veth or named namespace here, before or after
    run.wait(60)  # orphaned: stopped, recorded


@pytest.mark.slow
def test_a_rank_crashing_fails_the_run_named_and_its_namespaces_go(tmp_path, namespaces):
    _privileged()
    made, before = namespaces
    run = _run(tmp_path, 50, workload="tests.misbehaving_workloads:crashing")  # rank 1 raises at step 3
    assert procs.wait_until(lambda: len(_theirs(run)) == 3 or not run.is_running(), RUN_TIMEOUT_S)
    made |= _theirs(run)
    assert len(made) == 3
    assert run.wait(RUN_TIMEOUT_S) == "failed"
    assert run.status_record()["failed_rank"] == 1 and "on purpose" in run.status_record()["error"]
    assert procs.wait_until(lambda: not _in(made), 30)
    assert _ip_state() == before


@pytest.mark.slow
def test_a_sweeps_batch_starts_it_on_the_real_link_and_a_stop_ends_the_run_and_its_namespaces(tmp_path, namespaces):
    _privileged()
    made, before = namespaces
    cfg = RunConfig(workload="mlp", world_size=2, steps=100000, real_link_mbps=100, runs_dir=str(tmp_path))
    with Batch("test batch") as batch:  # a sweep's and a comparison's: never the pool's loopback ranks
        run = batch.start(cfg)
        assert run.launch_info()["real_link"] and run.launch_info()["owner"]["what"] == "test batch"
        assert procs.wait_until(lambda: run.metrics_records() or not run.is_running(), RUN_TIMEOUT_S)
        made |= _theirs(run)
        assert len(made) == 3
        assert launch.Run(run.path).stop() == "stopped"
    assert procs.wait_until(lambda: not _in(made), 30)
    assert _ip_state() == before


@pytest.mark.slow
def test_without_the_tools_the_run_is_refused_by_name_and_nothing_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # no unshare, ip or tc
    with pytest.raises(ConfigError) as e:
        _run(tmp_path, 3)
    assert "not on PATH" in e.value.errors["real_link_mbps"]
    assert not list(tmp_path.iterdir())
    with pytest.raises(ConfigError) as e:
        _run(tmp_path, 3, emulate_bandwidth_gbps=1.0)
    assert "emulate_bandwidth_gbps" in e.value.errors
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_qdisc_the_kernel_lacks_is_named_by_the_kernel_and_leaves_nothing():
    if not _privileged():
        return
    before = _ip_state()
    prefix, _ = reallink.privilege()
    assert reallink.qdisc_error(prefix, reallink.shaping(100, 250)) is None
    said = reallink.qdisc_error(prefix, ["no_such_qdisc"])
    assert said and "unknown" in said.lower()
    assert _ip_state() == before


# ---------------------------------------------------------------------------- the classroom's demonstration
CLASSROOM = str(Path(__file__).resolve().parents[1] / "pages" / "classroom.py")
DEMO_BUTTON = "Run allreduce and PowerSGD on a real 100 Mb/s link"


def _classroom(monkeypatch, runs_dir):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(runs_dir))
    at = AppTest.from_file(CLASSROOM, default_timeout=RUN_TIMEOUT_S).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.slow
def test_the_classroom_runs_allreduce_beside_powersgd_on_a_real_link_and_the_kernel_counts_their_bytes(
        tmp_path, monkeypatch):
    _privileged()
    before = _ip_state()
    at = _classroom(monkeypatch, tmp_path / "runs")
    next(b for b in at.button if b.label == DEMO_BUTTON).click().run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    demo = at.session_state["real_link"]
    allreduce, powersgd = demo.sides
    assert (allreduce.hook, powersgd.hook, demo.rate_mbps) == ("allreduce", "powersgd", 100)
    for side in demo.sides:  # real runs on the real link, their whole length, listed as runs
        run = launch.open_run(tmp_path / "runs" / side.run_id)
        assert run.status() == "finished" and side.steps == run.config().steps
        assert run.launch_info()["real_link"]["rate_mbps"] == 100
        assert side.agree and [r["rank"] for r in side.kernel] == [0, 1]
    # mlp's 340 KB of gradients a step against PowerSGD's rank-2 factors: what a teacher shows
    assert allreduce.wire_bytes == 340_008 and powersgd.wire_bytes < allreduce.wire_bytes / 10
    # at 100 Mb/s allreduce's bytes take 27 ms a step: the link is its floor; PowerSGD runs faster
    assert allreduce.step_s >= 0.9 * demo.link_s(allreduce) and powersgd.step_s < allreduce.step_s
    assert [m.value for m in at.metric if m.label == "step"] == [f"{s.step_s * 1e3:.1f} ms" for s in demo.sides]
    assert sum("The kernel counted" in m.value for m in at.success) == 2
    assert at.get("plotly_chart") and "runs " + allreduce.run_id in at.caption[-1].value
    # both ended (a real-link run's namespaces go with its processes): nothing left in the kernel
    assert procs.wait_until(lambda: not any(launch.open_run(tmp_path / "runs" / s.run_id).is_running()
                                            for s in demo.sides), 30)
    assert _ip_state() == before


@pytest.mark.slow
def test_without_namespaces_the_classroom_says_why_by_name_and_starts_nothing(tmp_path, monkeypatch):
    at = _classroom(monkeypatch, tmp_path / "runs")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # no unshare, ip or tc
    next(b for b in at.button if b.label == DEMO_BUTTON).click().run()
    assert not at.exception and not at.error
    said = [w.value for w in at.warning if w.value.startswith("Not on this machine")]
    assert len(said) == 1 and "unshare, ip, tc not on PATH" in said[0], said
    assert "real_link" not in at.session_state and not (tmp_path / "runs").exists()



# ---------------------------------------------------------------------------- the models' distance, said beside them
def test_the_models_distance_from_a_real_link_is_said_beside_them_from_one_table():
    from commlab.tune import held_to_real

    hooks = {h for h, _ in held_to_real.RATIOS}
    assert hooks == {"allreduce", "fp16", "powersgd", "topk", "diloco"}  # benchmarks/real_link.py's HOOKS
    assert all(set(m) == set(held_to_real.MODELS) and all(lo <= mid <= hi for lo, mid, hi in m.values())
               for m in held_to_real.RATIOS.values())
    for (hook, rate), models in held_to_real.RATIOS.items():
        for model, (lo, _, hi) in models.items():
            said = held_to_real.beside(hook, rate, model)
            assert said.startswith("held to a real link: ") and "docs/tuning.md" in said and hook in said
            assert ("within 20% in every pass" in said) == (0.8 <= lo and hi <= 1.2), said
            assert ("outside 20%: the difference stays" in said) == (not 0.8 <= models[model][1] <= 1.2), said
    # a rate never measured: what was, at every rate; a hook never measured: which were
    far = held_to_real.beside("powersgd", 10_000, "whatif")
    assert "10 Gb/s was not measured" in far and all(r in far for r in ("at 50 Mb/s", "at 200 Mb/s", "at 1 Gb/s"))
    assert "was not held to a real link for qsgd" in held_to_real.beside("qsgd", 1000, "emulated")
    rows = held_to_real.table(["powersgd", "qsgd"])
    assert [(r["hook"], r["rate"]) for r in rows] == [("powersgd", "50 Mb/s"), ("powersgd", "200 Mb/s"),
                                                     ("powersgd", "1 Gb/s")]
    with pytest.raises(ValueError, match="model must be one of"):
        held_to_real.held("powersgd", "guess")
