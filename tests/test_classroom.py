"""commlab.teach.classroom, commlab.teach.averaging, commlab.teach.bench and commlab.teach.headroom: pure arithmetic checked on its own, and
every collective checked on real Gloo processes (no mock of torch.distributed).

Starting ranks costs a torch import, so the real checks are few and each does a lot: one 8-rank
job runs every op for every world size from 1 to 8 (ranks 0..n-1 of a process group).  Timings
are printed by the benchmark, never asserted here.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
from streamlit.testing.v1 import AppTest

from commlab import cli
from commlab.analysis import ring
from commlab.config import ConfigError
from commlab.figures import bench as bench_figs
from commlab.figures import classroom as figs
from commlab.teach import averaging, bench, classroom, headroom

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
    (lambda: classroom.reduce_job(3, "sum", 3), "dst"),
    (lambda: classroom.reduce_job(3, "mean"), "op"),
    (lambda: classroom.reduce_scatter_job(2, "sum", "1,2,3\n4,5,6"), "values"),
    (lambda: classroom.all_gather_job(2, "1\n2,3"), "values"),
    (lambda: bench.bench_plan(2, "1KB", "gloo", collectives="all_to_all"), "collectives"),
    (lambda: bench.bench_plan(2, "1KB", "gloo", collectives=""), "collectives"),
    (lambda: averaging.grad_averaging(2, 0), "steps"),
    (lambda: averaging.grad_averaging(2, 5, -1.0), "lr"),
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


def test_default_tensors_give_the_ring_a_chunk_each_and_broadcast_a_nonzero_source():
    for n in range(1, 9):
        values = classroom.default_values(n)
        assert [v[0] for v in values] == list(range(n))  # element 0: the textbook's tensor([r])
        assert all(len(v) == n for v in values)
        src = classroom.broadcast_job(n).src
        assert src == classroom.default_src(n) and (n == 1 or 0 not in values[src])
        if n > 1:  # no empty chunk, and the ring sends less than the naive scheme's rank 0
            trace, naive = classroom.ring_trace(values), classroom.naive_trace(values)
            assert all(b > a for a, b in trace.chunks)
            assert max(trace.bytes_sent) == ring.wire_bytes(4 * n, n)
            # 2(N-1)/N S against (N-1) S: equal for two ranks, and the ring is cheaper beyond
            assert max(trace.bytes_sent) * (1 if n == 2 else n / 2) <= max(naive.bytes_sent)
    assert classroom.parse_values(None, 3) == [[0, 10, 20], [1, 11, 21], [2, 12, 22]]


def test_values_parse_every_way():
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
    assert trace.bytes_sent == trace.bytes_received == [ring.wire_bytes(size, n)] * n
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


@pytest.mark.parametrize("n", [2, 3, 8])
def test_ring_diagram_draws_an_arrow_per_message_in_a_frame_per_step(n):
    values = classroom.default_values(n)
    for trace in (classroom.ring_trace(values), classroom.naive_trace(values)):
        fig = figs.ring_diagram(trace, start=1)
        assert [f.name for f in fig.frames] == [str(k) for k in range(len(trace.steps) + 1)]
        assert [s.label for s in fig.layout.sliders[0].steps] == [f.name for f in fig.frames]
        assert fig.layout.sliders[0].active == 1
        assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["▶ Play", "⏸ Pause"]
        assert fig.layout.updatemenus[0].buttons[0].args[1]["frame"]["duration"] == figs.FRAME_MS
        for k, frame in enumerate(fig.frames):
            arrows = [a for a in frame.layout.annotations if a.showarrow]
            moves = trace.steps[k - 1].transfers if k else ()
            assert len(arrows) == len(moves)
            labels = [a.text for a in frame.layout.annotations if not a.showarrow]
            assert labels == [f"c{t.chunk}: {figs.fmt(t.values)}" for t in moves]
            colors = [a.arrowcolor for a in arrows]
            assert len(set(colors)) == len({t.action for t in moves})  # reduce red, copy blue
            held = trace.initial if k == 0 else trace.steps[k - 1].holdings
            assert [t.split("<br>")[1] for t in frame.data[0].text] == [
                " | ".join(figs.fmt(c) for c in rank) for rank in held]
        if n == 2 and trace.scheme == "ring":  # two ranks sending to each other: two arrows
            a, b = [x for x in fig.frames[1].layout.annotations if x.showarrow]
            assert (a.x, a.y) != (b.ax, b.ay)


def test_bars_carry_their_values_and_presentation_mode_enlarges_text():
    result = classroom.CollectiveResult("all_gather", None, None, 2, [
        classroom.RankOutcome(0, [1.0], [1.0, 2.5], 0.0),
        classroom.RankOutcome(1, [2.5], [1.0, 2.5], 0.1)], [0, 1])
    fig = figs.before_after_chart(result, "t")
    assert [list(t.text) for t in fig.data] == [["1", "2.5"], ["1", "2.5", "1", "2.5"]]
    assert list(fig.data[1].x) == ["rank 0[0]", "rank 0[1]", "rank 1[0]", "rank 1[1]"]
    values = classroom.default_values(3)
    chart = figs.bytes_chart(classroom.ring_trace(values), classroom.naive_trace(values))
    assert list(chart.data[0].text) == ["16 B"] * 3  # 2(N-1) one-element chunks of 4 B
    assert figs.present(fig, False).layout.font.size is None
    big = figs.present(figs.before_after_chart(result, "t"), True)
    assert big.layout.font.size == figs.PRESENTATION_FONT and big.layout.height > fig.layout.height


# ============================================================================ bandwidth arithmetic
def test_busbw_arithmetic():
    assert bench.algbw(1 << 20, 1e-3) == pytest.approx(1048576e3)
    assert bench.busbw(1e9, 1) == 0  # one rank sends nothing
    assert bench.busbw(1e9, 2) == pytest.approx(1e9)
    assert bench.busbw(1e9, 4) == pytest.approx(1.5e9)
    assert bench.busbw(1e9, 8) == pytest.approx(1.75e9)
    for n in range(1, 9):
        assert bench.busbw(bench.algbw(800, 2.0), n) * 2.0 == pytest.approx(ring.wire_bytes(800, n))
    # nccl-tests' PERFORMANCE.md factors, by hand for 4 ranks
    want = {"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "broadcast": 1.0,
            "reduce": 1.0}
    assert {c: ring.bus_factor(c, 4) for c in bench.COLLECTIVES} == want
    assert bench.busbw(1e9, 8, "all_gather") == pytest.approx(0.875e9)
    with pytest.raises(ValueError, match="all_to_all"):
        ring.bus_factor("all_to_all", 2)
    # all_gather and reduce_scatter send whole chunks of S/N
    assert bench.message_bytes(1024, "all_gather", 3) == 1020
    assert bench.message_bytes(1024, "all_reduce", 3) == 1024
    assert bench.message_bytes(4, "reduce_scatter", 8) == 32


def test_sizes_parse_as_nccl_tests_does():
    assert bench.parse_sizes("1KB,1MB,64MB") == [1024, 1 << 20, 64 << 20]
    assert bench.parse_sizes("6B, 1k, 1.5M") == [4, 1024, 3 << 19]  # whole float32s only
    assert bench.format_size(64 << 20) == "64MB" and bench.format_size(12) == "12B"
    assert bench.iterations_for(1 << 10) == 50 and bench.iterations_for(1 << 30) == 3


def test_headroom_reading_gives_one_figure_against_pytorchs_10_percent():
    slow = headroom.read_headroom(step_s_allreduce=0.3, step_s_noop=0.2)
    assert slow["saved"] == pytest.approx(1 / 3) and slow["allreduce_is_bottleneck"]
    assert set(slow) == {"saved", "allreduce_is_bottleneck", "verdict"}
    # The verdict holds one percentage, the same as the figure, and names the 10% line.
    assert re.findall(r"-?\d+%", slow["verdict"]) == ["33%", "10%"], slow["verdict"]
    assert "300.00 ms → 200.00 ms" in slow["verdict"]
    near = headroom.read_headroom(step_s_allreduce=0.1, step_s_noop=0.088)  # 12% saved
    assert near["allreduce_is_bottleneck"]
    fast = headroom.read_headroom(step_s_allreduce=0.1, step_s_noop=0.092)  # 8% saved
    assert not fast["allreduce_is_bottleneck"] and "not the bottleneck" in fast["verdict"]
    slower = headroom.read_headroom(step_s_allreduce=0.1, step_s_noop=0.105)
    assert slower["saved"] == pytest.approx(-0.05) and "5% longer" in slower["verdict"]
    assert headroom.THRESHOLD == 0.10 and "10%" in headroom.SAVED_HELP
    with pytest.raises(ValueError):
        headroom.read_headroom(0, 0.1)


# ============================================================================ real processes
@pytest.mark.slow
def test_cli_three_ranks_sum_give_three_on_every_rank():
    out = _cli("allreduce", "--world-size", "3", "--op", "sum", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert (got["op"], got["world_size"]) == ("sum", 3)
    # Element 0 is the textbook's example: ranks hold 0, 1 and 2, and all get 3.0.
    assert [(r["rank"], r["before"], r["after"]) for r in got["ranks"]] == [
        (0, [0, 10, 20], [3, 33, 63]), (1, [1, 11, 21], [3, 33, 63]), (2, [2, 12, 22], [3, 33, 63])]
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
    # The rest of the book's figure and of nccl-tests, for 1, 3 and 8 ranks, with every op
    for n in (1, 3, 8):
        jobs += [classroom.all_gather_job(n, rng.normal(size=(n, 2)).tolist())]
        for op in classroom.OPS:
            values = rng.uniform(-2, 2, size=(n, 2 * n)).tolist()
            jobs += [classroom.reduce_job(n, op, n // 2, values),
                     classroom.reduce_scatter_job(n, op, values)]
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
def test_reduce_all_gather_and_reduce_scatter_against_numpy(collectives):
    seen = set()
    for job, result in zip(*collectives):
        values = np.array(job.values, dtype=np.float32)
        n, after = job.world_size, [r.after for r in result.ranks]
        if job.kind == "all_gather":
            assert all(np.array_equal(a, values.ravel()) for a in after)
        elif job.kind == "reduce":
            want = REFERENCE[job.op](values, axis=0)
            assert np.allclose(after[job.dst], want, rtol=1e-5, atol=1e-6), (job.op, n)
            assert result.dst == job.dst and result.op == job.op
        elif job.kind == "reduce_scatter":
            want = REFERENCE[job.op](values, axis=0).reshape(n, -1)
            for rank in range(n):
                assert np.allclose(after[rank], want[rank], rtol=1e-5, atol=1e-6), (job.op, n)
        else:
            continue
        seen.add(job.kind)
    assert seen == {"all_gather", "reduce", "reduce_scatter"}


@pytest.mark.slow
def test_ddp_equals_hand_averaged_gradients_and_replicas_drift_without():
    demo = averaging.grad_averaging(world_size=2, steps=12)
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
        classroom.run_ranks(averaging._grad_rank, 2, (100_000, 0.01, 0), on_message=look_then_stop)
    assert listening and set(listening) <= {"127.0.0.1", "::1"}, listening


@pytest.mark.slow
def test_timeout_leaves_nothing():
    with pytest.raises(TimeoutError):
        classroom.run_ranks(averaging._grad_rank, 2, (100_000, 0.01, 0), timeout_s=0.5)


@pytest.mark.slow
def test_bench_cli_reports_nccl_tests_quantities(capsys):
    """Every collective on 3 ranks (so that the bus factors differ and S/N does not divide 1KB):
    nccl-tests' columns, out-of-place and in-place, and no wrong element."""
    assert cli.main(["bench", "--world-size", "3", "--sizes", "1KB,64KB", "--backend", "gloo",
                     "--iters", "2", "--warmup", "1", "--json"]) == 0
    got = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (got["backend"], got["world_size"]) == ("gloo", 3)
    assert got["bus_factors"] == pytest.approx({"all_reduce": 4 / 3, "all_gather": 2 / 3,
                                                "reduce_scatter": 2 / 3, "broadcast": 1.0,
                                                "reduce": 1.0})
    assert [(r["collective"], r["size_bytes"]) for r in got["rows"]] == [
        (c, bench.message_bytes(s, c, 3)) for c in bench.COLLECTIVES for s in (1024, 65536)]
    assert ("all_gather", 1020) in [(r["collective"], r["size_bytes"]) for r in got["rows"]]
    for r in got["rows"]:
        assert r["memcpy_gbytes_s"] > 0 and r["count"] == r["size_bytes"] // 4
        for mode in ("out_of_place", "in_place"):
            t = r[mode]
            assert t["time_us"] > 0 and t["wrong"] == 0, (r["collective"], mode)
            assert t["algbw_gbytes_s"] == pytest.approx(r["size_bytes"] / (t["time_us"] * 1e-6) / 1e9)
            assert t["busbw_gbytes_s"] == pytest.approx(t["algbw_gbytes_s"]
                                                    * got["bus_factors"][r["collective"]])
    # The page's table holds the same numbers, column by column, as nccl-tests names them.
    result = bench.BenchResult("gloo", 3, [
        bench.BenchRow(r["collective"], r["size_bytes"], r["iters"],
                       bench.Timing(**r["out_of_place"]), bench.Timing(**r["in_place"]),
                       r["memcpy_gbytes_s"]) for r in got["rows"]])
    table = bench_figs.bench_table(result)
    assert list(table["in-place busbw (GB/s)"]) == [r["in_place"]["busbw_gbytes_s"] for r in got["rows"]]
    assert (table[["out-of-place #wrong", "in-place #wrong"]] == 0).all().all()


@pytest.mark.slow
@pytest.mark.gpu
def test_bench_on_nccl():
    from commlab.devices import gpu_count

    gpus = gpu_count()
    if not gpus:
        pytest.skip("no CUDA GPU: NCCL needs one per rank")
    result = bench.run_bench(min(gpus, 2), "1MB,16MB", "nccl", iters=5, warmup=1)
    assert result.backend == "nccl"
    assert [(r.collective, r.size_bytes) for r in result.rows] == [
        (c, s) for c in bench.COLLECTIVES for s in (1 << 20, 16 << 20)]
    for r in result.rows:
        assert r.memcpy_gbytes_s > 0
        assert all(t.busbw_gbytes_s > 0 and t.wrong == 0 for t in (r.out_of_place, r.in_place))


# ============================================================================ pages (no processes)
PAGES = Path(__file__).resolve().parents[1] / "pages"


def _figures(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def test_classroom_page_walks_the_ring_and_names_bad_input():
    at = AppTest.from_file(str(PAGES / "classroom.py"), default_timeout=120).run()
    assert not at.exception and at.title[0].value == "Classroom: allreduce"
    assert at.text_area[0].value == "0, 10, 20\n1, 11, 21\n2, 12, 22"
    assert next(n for n in at.number_input if n.label == "Broadcast from rank").value == 2
    next(s for s in at.slider if s.label == "Step").set_value(3).run()
    assert "Ring — step 3/4: all-gather" in [h.value for h in at.subheader]
    diagrams = [f for f in _figures(at) if f.get("frames")]
    assert len(diagrams) == 2 and all(d["layout"]["sliders"][0]["active"] == 3 for d in diagrams)
    assert "so 16 B per rank, where the naive scheme" in "".join(m.value for m in at.markdown)
    assert "naive scheme (everyone sends everything to rank 0, which sends the result back) " \
           "makes rank 0 send 24 B" in "".join(m.value for m in at.markdown)

    at.toggle(key="presentation").set_value(True).run()
    assert all(f["layout"]["font"]["size"] == figs.PRESENTATION_FONT for f in _figures(at))
    assert any("<style>" in m.value for m in at.markdown)

    at.text_area[0].input("1,2\n3,4\n5,6").run()  # 2 elements for 3 ranks
    assert not at.exception and not at.error
    assert any("reduce_scatter is left out" in i.value for i in at.info)
    assert any("some chunks are empty" in w.value for w in at.warning)
    at.text_area[0].input("1,2\n3,x\n5,6").run()
    assert not at.exception and any("values" in e.value for e in at.error)


def test_bandwidth_page_renders_and_names_bad_input():
    at = AppTest.from_file(str(PAGES / "bandwidth.py"), default_timeout=120).run()
    assert not at.exception and at.title[0].value == "Bandwidth"
    at.multiselect[0].set_value([]).run()
    assert any("sizes" in e.value for e in at.error)
    at.multiselect[0].set_value(["1KB"]).run()
    next(m for m in at.multiselect if m.label == "Collectives").set_value([]).run()
    assert any("collectives" in e.value for e in at.error)
    assert headroom.SAVED_LABEL in "".join(m.value for m in at.markdown)


@pytest.mark.slow
def test_pages_show_real_collectives_and_a_real_benchmark():
    """The buttons that start real processes, and the figures drawn from what they return."""
    at = AppTest.from_file(str(PAGES / "classroom.py"), default_timeout=300).run()
    next(b for b in at.button if b.label == "Run on real processes").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert [h.value for h in at.subheader][:5] == [
        "dist.all_reduce(op=SUM)", "dist.broadcast(src=2)", "dist.reduce(dst=0, op=SUM)",
        "dist.all_gather_single", "dist.reduce_scatter_single(op=SUM)"]
    tables = [d.value for d in at.dataframe[:5]]
    assert list(tables[0]["before"]) == ["0, 10, 20", "1, 11, 21", "2, 12, 22"]
    assert list(tables[0]["after"]) == ["3, 33, 63"] * 3
    assert list(tables[1]["after"]) == ["2, 12, 22"] * 3
    assert tables[2]["after"][0] == "3, 33, 63"
    assert list(tables[3]["after"]) == ["0, 10, 20, 1, 11, 21, 2, 12, 22"] * 3
    assert list(tables[4]["after"]) == ["3", "33", "63"]
    bars = [f for f in _figures(at) if f["data"] and f["data"][0].get("name") == "before"]
    assert len(bars) == 5 and all(t.get("text") for f in bars for t in f["data"])
    # The ring tab checks itself against the real all_reduce that tab 1 has just run.
    assert any("The ring simulation equals dist.all_reduce on 3 real rank(s)" in m.value
               for m in at.success)

    at = AppTest.from_file(str(PAGES / "bandwidth.py"), default_timeout=300).run()
    at.multiselect[0].set_value(["1KB", "4KB"]).run()
    at.number_input[0].set_value(2).run()
    next(b for b in at.button if b.label == "Measure").click().run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value
    assert list(table["collective"]) == [c for c in bench.COLLECTIVES[:4] for _ in (1, 2)]
    assert list(table["bytes"]) == [1024, 4096] * 4 and (table["in-place busbw (GB/s)"] > 0).all()
    assert (table["out-of-place #wrong"] == 0).all() and (table["in-place #wrong"] == 0).all()
    assert any("#wrong: 0 element(s)" in m.value for m in at.success)
    chart = next(f for f in _figures(at) if f["layout"].get("yaxis", {}).get("type") == "log"
                 and "busbw" in f["layout"]["title"]["text"])
    assert {t["name"] for t in chart["data"]} >= {"all_reduce (in-place)", "memory copy (ceiling)"}
