"""commlab.teach.classroom, commlab.teach.bench and commlab.teach.headroom: pure arithmetic checked on its own, and
every collective checked on real Gloo processes (no mock of torch.distributed).

Starting ranks costs a torch import, so the real checks are few and each does a lot: one 8-rank
job runs every op for every world size from 1 to 8 (ranks 0..n-1 of a process group).  Timings
are printed by the benchmark, never asserted here.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

from commlab import cli
from commlab.config import ConfigError
from commlab.teach import bench, classroom, headroom

REFERENCE = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min, "product": np.prod}


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commlab", *args], capture_output=True, text=True,
                          timeout=timeout)


# ============================================================================ validation
@pytest.mark.parametrize("call, field", [
    (lambda: classroom.all_reduce_job(0), "world_size"),
    (lambda: classroom.all_reduce_job(9), "world_size"),
    (lambda: classroom.all_reduce_job(2.5), "world_size"),
    (lambda: classroom.all_reduce_job(3, "mean"), "op"),
    (lambda: classroom.all_reduce_job(2, "sum", "1\n2\n3"), "values"),
    (lambda: classroom.all_reduce_job(2, "sum", "1,2\n3"), "values"),
    (lambda: classroom.all_reduce_job(2, "sum", "1\nabc"), "values"),
    (lambda: classroom.all_reduce_job(2, "sum", "1\nnan"), "values"),
    (lambda: classroom.all_reduce_job(2, "sum", "1\n1e40"), "values"),
    (lambda: classroom.broadcast_job(3, 3), "src"),
    (lambda: classroom.broadcast_job(3, -1), "src"),
    (lambda: classroom.grad_averaging(2, 0), "steps"),
    (lambda: classroom.grad_averaging(2, 5, -1.0), "lr"),
    (lambda: bench.bench_plan(2, "1KB,12XB", "gloo"), "sizes"),
    (lambda: bench.bench_plan(2, "2GB", "gloo"), "sizes"),
    (lambda: bench.bench_plan(2, "", "gloo"), "sizes"),
    (lambda: bench.bench_plan(2, "1KB", "mpi"), "backend"),
    (lambda: bench.resolve_backend("nccl", 2, gpus=0), "backend"),
    (lambda: bench.bench_plan(2, "1KB", "gloo", iters=0), "iters"),
    (lambda: headroom.measure_headroom(steps=5, skip=5), "skip"),
])
def test_bad_input_is_refused_naming_the_field(call, field):
    with pytest.raises(ConfigError) as e:
        call()
    assert isinstance(e.value, ValueError) and field in e.value.errors


def test_values_parse_every_way():
    assert classroom.parse_values(None, 3) == [[0.0], [1.0], [2.0]]
    assert classroom.parse_values("1, 2\n3 4", 2) == [[1, 2], [3, 4]]
    assert classroom.parse_values("1,2;3,4", 2) == [[1, 2], [3, 4]]
    assert classroom.parse_values([[1, 2], "3,4"], 2) == [[1, 2], [3, 4]]


@pytest.mark.parametrize("args", [
    ["allreduce", "--world-size", "9"], ["allreduce", "--op", "mean"],
    ["allreduce", "--world-size", "2", "--values", "1", "x"],
    ["broadcast", "--world-size", "2", "--src", "5"], ["bench", "--sizes", "1KB,huge"],
])
def test_cli_bad_input_exits_2_and_starts_nothing(args, capsys):
    assert cli.main([*args, "--json"]) == 2
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["error"] == "invalid settings"


# ============================================================================ ring, on paper
@pytest.mark.parametrize("n", range(1, 9))
def test_ring_and_naive_equal_numpy_for_every_op(n):
    rng = np.random.default_rng(n)
    for length in (1, n, 2 * n + 1):  # fewer, as many, and more elements than chunks
        values = rng.normal(size=(n, length)).tolist()
        for op, ref in REFERENCE.items():
            want = ref(np.array(values), axis=0)
            for trace in (classroom.ring_trace(values, op), classroom.naive_trace(values, op)):
                assert np.allclose(trace.result, [want] * n), (trace.scheme, op, length)


@pytest.mark.parametrize("n", range(1, 9))
def test_ring_steps_and_bytes(n):
    size = 4 * n * 3  # divisible by N: every chunk the same size
    trace = classroom.ring_trace(np.ones((n, size // 4)).tolist())
    assert len(trace.steps) == 2 * (n - 1)
    assert [s.phase for s in trace.steps] == ["reduce-scatter"] * (n - 1) + ["all-gather"] * (n - 1)
    for step in trace.steps:  # every rank sends once and receives once per step, to its neighbour
        assert sorted(t.src for t in step.transfers) == list(range(n))
        assert all(t.dst == (t.src + 1) % n for t in step.transfers)
    assert trace.bytes_sent == trace.bytes_received == [classroom.ring_bytes_per_rank(size, n)] * n
    if n > 1:  # after reduce-scatter rank r owns the complete chunk r+1
        done = trace.steps[n - 2].contributors
        assert all(done[r][(r + 1) % n] == tuple(range(n)) for r in range(n))


def test_ring_trace_records_what_moves():
    trace = classroom.ring_trace([[0, 1, 2], [10, 11, 12], [20, 21, 22]], "sum")
    first = trace.steps[0].transfers
    assert [(t.src, t.dst, t.chunk, t.values, t.action) for t in first] == [
        (0, 1, 0, (0.0,), "reduce"), (1, 2, 1, (11.0,), "reduce"), (2, 0, 2, (22.0,), "reduce")]
    assert trace.result == [[30.0, 33.0, 36.0]] * 3


def test_naive_against_ring_costs():
    n, size = 4, 1000
    naive = classroom.naive_trace(np.ones((n, size // 4)).tolist())
    assert len(naive.steps) == 2 * (n - 1)
    assert naive.bytes_sent == [(n - 1) * size] + [size] * (n - 1)
    ring, naive_cost = classroom.scheme_costs(size, n)
    assert (ring.steps, ring.message_bytes, ring.max_sent_bytes) == (6, 250, 1500)
    assert (naive_cost.steps, naive_cost.message_bytes) == (6, 1000)
    assert naive_cost.max_sent_bytes == 3000
    assert naive_cost.serial_bytes == n * ring.serial_bytes


# ============================================================================ bandwidth arithmetic
def test_busbw_arithmetic():
    assert bench.algbw(1 << 20, 1e-3) == pytest.approx(1048576e3)
    assert bench.busbw(1e9, 1) == 0  # one rank sends nothing
    assert bench.busbw(1e9, 2) == pytest.approx(1e9)
    assert bench.busbw(1e9, 4) == pytest.approx(1.5e9)
    assert bench.busbw(1e9, 8) == pytest.approx(1.75e9)
    for n in range(1, 9):
        assert bench.busbw(bench.algbw(800, 2.0), n) * 2.0 == pytest.approx(
            classroom.ring_bytes_per_rank(800, n))


def test_sizes_parse_as_nccl_tests_does():
    assert bench.parse_sizes("1KB,1MB,64MB") == [1024, 1 << 20, 64 << 20]
    assert bench.parse_sizes("6B, 1k, 1.5M") == [4, 1024, 3 << 19]  # whole float32s only
    assert bench.format_size(64 << 20) == "64MB" and bench.format_size(12) == "12B"
    assert bench.iterations_for(1 << 10) == 50 and bench.iterations_for(1 << 30) == 3


def test_headroom_reading():
    slow = headroom.read_headroom(step_s_allreduce=0.2, step_s_noop=0.1)
    assert slow["speedup"] == pytest.approx(1.0) and slow["comm_share"] == pytest.approx(0.5)
    assert slow["allreduce_is_bottleneck"]
    fast = headroom.read_headroom(step_s_allreduce=0.105, step_s_noop=0.1)
    assert not fast["allreduce_is_bottleneck"] and "not the bottleneck" in fast["verdict"]


# ============================================================================ real processes
@pytest.mark.slow
def test_cli_three_ranks_sum_give_three_on_every_rank():
    out = _cli("allreduce", "--world-size", "3", "--op", "sum", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert (got["op"], got["world_size"]) == ("sum", 3)
    assert [(r["rank"], r["before"], r["after"]) for r in got["ranks"]] == [
        (0, [0.0], [3.0]), (1, [1.0], [3.0]), (2, [2.0], [3.0])]
    assert sorted(got["arrival_order"]) == [0, 1, 2]


@pytest.fixture(scope="module")
def collectives():
    """One job on 8 real ranks: every op on random vectors for every world size 1..8, and a
    broadcast from each world size's last rank."""
    rng = np.random.default_rng(0)
    jobs = [classroom.all_reduce_job(n, op, rng.uniform(-2, 2, size=(n, 5)).tolist())
            for n in range(1, 9) for op in classroom.OPS]
    jobs += [classroom.broadcast_job(n, n - 1, rng.normal(size=(n, 3)).tolist())
             for n in range(1, 9)]
    return jobs, classroom.run_collectives(jobs)


@pytest.mark.slow
def test_every_op_against_numpy(collectives):
    for job, result in zip(*collectives):
        if job.kind != "all_reduce":
            continue
        want = REFERENCE[job.op](np.array(job.values, dtype=np.float32), axis=0)
        assert [r.rank for r in result.ranks] == list(range(job.world_size))
        assert [r.before for r in result.ranks] == [list(np.float32(v)) for v in job.values]
        for r in result.ranks:
            assert np.allclose(r.after, want, rtol=1e-5, atol=1e-6), (job.op, job.world_size)
        assert sorted(result.arrival_order) == list(range(job.world_size))


@pytest.mark.slow
def test_ring_simulation_equals_real_all_reduce_for_1_to_8_ranks(collectives):
    checked = set()
    for job, result in zip(*collectives):
        if job.kind == "all_reduce":
            trace = classroom.ring_trace(job.values, job.op)
            same, err = classroom.compare_with_real(trace, result)
            assert same, (job.op, job.world_size, err)
            checked.add(job.world_size)
    assert checked == set(range(1, 9))


@pytest.mark.slow
def test_broadcast_gives_every_rank_the_source_tensor(collectives):
    for job, result in zip(*collectives):
        if job.kind == "broadcast":
            src = np.float32(job.values[job.src]).tolist()
            assert [r.after for r in result.ranks] == [src] * job.world_size


@pytest.mark.slow
def test_ddp_equals_hand_averaged_gradients_and_replicas_drift_without():
    demo = classroom.grad_averaging(world_size=2, steps=12)
    assert len(demo.rows) == 13 and demo.rows[0]["distance_no_allreduce"] == 0
    assert demo.max_grad_diff <= 1e-6
    assert all(r["distance_by_hand"] == 0 and r["distance_ddp"] == 0 for r in demo.rows)
    drift = [r["distance_no_allreduce"] for r in demo.rows]
    assert drift[-1] > 1e-3 and drift[-1] > drift[1]


@pytest.mark.slow
def test_failing_rank_raises_and_leaves_nothing():
    bad = classroom.Collective("all_reduce", ((1.0,), (2.0,)), op="mean")  # not validated
    with pytest.raises(RuntimeError, match="MEAN"):
        classroom.run_collectives([bad])


@pytest.mark.slow
def test_ranks_listen_on_loopback_only_and_an_interrupted_run_leaves_nothing():
    class Stop(Exception):
        pass

    listening = []

    def look_then_stop(_):  # at the first report every rank has joined: store and Gloo are up
        for p in psutil.Process().children(recursive=True):
            try:
                listening.extend(c.laddr.ip for c in p.net_connections(kind="inet")
                                 if c.status == psutil.CONN_LISTEN)
            except psutil.NoSuchProcess:
                pass
        raise Stop  # what a page that is navigated away from does: the ranks are still training

    with pytest.raises(Stop):
        classroom.run_ranks(classroom._grad_rank, 2, (100_000, 0.01, 0), on_message=look_then_stop)
    assert listening and set(listening) <= {"127.0.0.1", "::1"}, listening


@pytest.mark.slow
def test_timeout_leaves_nothing():
    with pytest.raises(TimeoutError):
        classroom.run_ranks(classroom._grad_rank, 2, (100_000, 0.01, 0), timeout_s=0.5)


@pytest.mark.slow
def test_bench_cli_reports_nccl_tests_quantities(capsys):
    assert cli.main(["bench", "--world-size", "2", "--sizes", "1KB,64KB", "--backend", "gloo",
                     "--iters", "3", "--warmup", "1", "--json"]) == 0
    got = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (got["backend"], got["world_size"], got["bus_factor"]) == ("gloo", 2, 1.0)
    assert [r["size_bytes"] for r in got["rows"]] == [1024, 65536]
    for r in got["rows"]:
        assert r["time_us"] > 0 and r["memcpy_gbps"] > 0
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * got["bus_factor"])


@pytest.mark.slow
def test_headroom_runs_noop_and_allreduce(tmp_path):
    h = headroom.measure_headroom("mlp", steps=8, world_size=2, skip=2, runs_dir=str(tmp_path),
                                  stall_timeout_s=600)  # a busy shared machine starts slowly
    assert h.step_s_allreduce > 0 and h.step_s_noop > 0
    assert h.comm_share == pytest.approx(1 - h.step_s_noop / h.step_s_allreduce)
    assert set(h.run_ids) == {"allreduce", "noop"}
    from commlab.figures.bench import headroom_chart

    assert list(headroom_chart(h).data[0].y) == pytest.approx([h.step_s_allreduce * 1e3, h.step_s_noop * 1e3])


@pytest.mark.slow
@pytest.mark.gpu
def test_bench_on_nccl():
    from commlab.devices import gpu_count

    gpus = gpu_count()
    if not gpus:
        pytest.skip("no CUDA GPU: NCCL needs one per rank")
    result = bench.run_bench(min(gpus, 2), "1MB,16MB", "nccl", iters=5, warmup=1)
    assert result.backend == "nccl" and [r.size_bytes for r in result.rows] == [1 << 20, 16 << 20]
    assert all(r.busbw_gbps > 0 and r.memcpy_gbps > 0 for r in result.rows)


# ============================================================================ pages (no processes)
PAGES = Path(__file__).resolve().parents[1] / "pages"


def test_classroom_page_walks_the_ring_and_names_bad_input():
    app_test = pytest.importorskip("streamlit.testing.v1").AppTest
    at = app_test.from_file(str(PAGES / "classroom.py"), default_timeout=120).run()
    assert not at.exception and at.title[0].value == "Classroom: allreduce"
    next(s for s in at.slider if s.label == "Step").set_value(3).run()
    assert "Ring — step 3/4: all-gather" in [h.value for h in at.subheader]
    at.text_area[0].input("1,2\n3,x\n5,6").run()
    assert not at.exception and any("values" in e.value for e in at.error)


def test_bandwidth_page_renders_and_names_bad_input():
    app_test = pytest.importorskip("streamlit.testing.v1").AppTest
    at = app_test.from_file(str(PAGES / "bandwidth.py"), default_timeout=120).run()
    assert not at.exception and at.title[0].value == "Bandwidth"
    at.multiselect[0].set_value([]).run()
    assert any("sizes" in e.value for e in at.error)


@pytest.mark.slow
def test_pages_show_real_collectives_and_a_real_benchmark():
    """The buttons that start real processes, and the figures drawn from what they return."""
    app_test = pytest.importorskip("streamlit.testing.v1").AppTest
    at = app_test.from_file(str(PAGES / "classroom.py"), default_timeout=300).run()
    next(b for b in at.button if b.label == "Run on real processes").click().run()
    assert not at.exception, [e.value for e in at.exception]
    reduced = at.dataframe[0].value
    assert list(reduced["before"]) == ["0", "1", "2"] and list(reduced["after"]) == ["3"] * 3
    assert len(at.get("plotly_chart")) >= 3  # before/after twice, and the arrival order

    at = app_test.from_file(str(PAGES / "bandwidth.py"), default_timeout=300).run()
    at.multiselect[0].set_value(["1KB", "4KB"]).run()
    next(b for b in at.button if b.label == "Measure").click().run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value
    assert list(table["bytes"]) == [1024, 4096] and (table["busbw (GB/s)"] > 0).all()
    assert len(at.get("plotly_chart")) >= 2
