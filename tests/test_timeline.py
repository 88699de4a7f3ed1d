"""The per-step timeline: the overlap share's arithmetic, the Chrome trace's format, and on the
session's real runs (several buckets, commlab's PowerSGD and PyTorch's allreduce) the events in
the order DDP makes them."""
import json

import pytest

from commlab.analysis import timeline
from commlab.figures.timeline import step_figure


def _ev(kind, start, end, **kw):
    return {"kind": kind, "start": start, "end": end, **kw}


def _collective(start, end, bucket=0, category="hook", link_s=0.0):
    return _ev("collective", start, end, bucket=bucket, category=category, bytes=64,
               thread="commlab-comm", link_s=link_s)


STEP = [_ev("backward", 0.0, 10.0), _ev("hook", 2.0, 2.1, bucket=0), _ev("hook", 6.0, 6.1, bucket=1),
        _collective(3.0, 5.0), _collective(4.0, 8.0, bucket=1, link_s=1.0),  # union 3..8, 3 hidden
        _collective(0.5, 9.0, bucket=None, category="other"),  # the loss: not the hook's
        _ev("future", 2.0, 8.5, bucket=0), _ev("optimizer", 10.0, 11.0)]


def test_overlap_share_is_hidden_over_all_hook_communication():
    assert timeline.backward_compute(STEP) == (0.0, 6.0)
    assert timeline.overlap_share(STEP) == pytest.approx(3.0 / 5.0)
    late = [_ev("backward", 0.0, 10.0), _ev("hook", 9.0, 9.1, bucket=0), _collective(9.2, 9.8)]
    assert timeline.overlap_share(late) == 0.0
    # A hook that waits in its body for its collective stops backward: nothing hidden meanwhile.
    waits = [_ev("backward", 0.0, 10.0), _ev("hook", 2.0, 5.0, bucket=0), _collective(2.5, 4.5),
             _ev("hook", 8.0, 8.1, bucket=1)]
    assert timeline.overlap_share(waits) == 0.0
    blocking = late
    assert timeline.overlap_share([_ev("backward", 0.0, 1.0)]) is None  # nothing communicated
    steps = {"1": {"0": STEP, "1": blocking}, "2": {"0": [_ev("backward", 0.0, 1.0)]}}
    assert timeline.run_overlap_share(steps) == pytest.approx(0.3)


def test_a_blocking_hook_hides_only_what_it_returns_unfinished():
    # commlab's blocking PowerSGD: the uncompressed and P allreduces are waited for inside the
    # hook call (backward stops), the Q allreduce's future is returned, so Q flies while backward
    # computes the next bucket: that part, and only that, is hidden.  The last bucket's Q flies
    # after the last hook call, when backward has nothing left to compute.
    blocking = [_ev("backward", 0.0, 10.0),
                _ev("hook", 2.0, 4.0, bucket=0), _collective(2.2, 2.8), _collective(3.0, 3.8),
                _collective(4.0, 5.0),
                _ev("hook", 6.0, 8.0, bucket=1), _collective(6.2, 6.8, bucket=1),
                _collective(7.0, 7.8, bucket=1), _collective(8.0, 9.0, bucket=1)]
    assert timeline.overlap_share(blocking) == pytest.approx(1.0 / 4.8)
    assert timeline.backward_compute(blocking) == (0.0, 6.0)
    assert timeline.backward_compute_s(blocking) == pytest.approx(4.0)  # less the hook's waits
    waits_for_all = [e for e in blocking if e["start"] != 4.0] + [_collective(3.85, 3.95)]
    assert timeline.overlap_share(waits_for_all) == 0.0


def test_link_share_is_what_only_the_emulated_link_held():
    assert timeline.link_share(STEP) == pytest.approx(1.0 / 6.0)  # the loss's is not the hook's
    assert timeline.link_share([_ev("backward", 0.0, 1.0)]) is None
    no_link = [_collective(0.0, 1.0)]
    assert timeline.run_link_share({"1": {"0": STEP, "1": no_link}}) == pytest.approx(1.0 / 12.0)


def _check_trace(trace: dict, ranks: int) -> None:
    """The Chrome trace format: named processes (one per rank) and threads, complete events."""
    events = trace["traceEvents"]
    json.dumps(trace)  # plain JSON
    meta = [e for e in events if e["ph"] == "M"]
    assert sorted(e["args"]["name"] for e in meta if e["name"] == "process_name") == [
        f"rank {r}" for r in range(ranks)]
    assert {(e["pid"], e["tid"], e["args"]["name"]) for e in meta if e["name"] == "thread_name"} == {
        (r, t, n) for r in range(ranks) for t, n in enumerate((timeline.COMPUTE, timeline.COMM))}
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all({"name", "cat", "pid", "tid", "ts", "dur", "args"} <= e.keys() for e in spans)
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in spans)
    assert min(e["ts"] for e in spans) == 0


def test_chrome_trace_of_a_synthetic_step():
    trace = timeline.chrome_trace({"1": {"0": STEP, "1": STEP}})
    _check_trace(trace, 2)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    link = [e for e in spans if e["cat"] == "link"]
    assert len(link) == 2 and all(e["dur"] == pytest.approx(1e6) for e in link)
    assert {e["tid"] for e in spans if e["cat"] in timeline.PHASES} == {0}
    assert {e["tid"] for e in spans if e["cat"] not in timeline.PHASES} == {1}


def _check_order(events: list[dict]) -> int:
    """DDP's order: hook of bucket i before bucket i+1; each hook collective inside its bucket's
    window (hook call to future completion); backward holds every hook.  Returns the buckets."""
    hooks = sorted((e for e in events if e["kind"] == "hook"), key=lambda e: e["start"])
    assert [e["bucket"] for e in hooks] == sorted(e["bucket"] for e in hooks)
    windows = {e["bucket"]: e for e in events if e["kind"] == "future"}
    assert windows.keys() == {e["bucket"] for e in hooks}
    (backward,) = [e for e in events if e["kind"] == "backward"]
    (optimizer,) = [e for e in events if e["kind"] == "optimizer"]
    assert backward["end"] <= optimizer["start"]
    for e in events:
        if e["kind"] == "collective" and e["category"] == "hook":
            w = windows[e["bucket"]]
            assert w["start"] <= e["start"] <= e["end"] <= w["end"], (e, w)
        if e["kind"] in ("hook", "future"):
            assert backward["start"] <= e["start"] and e["end"] <= backward["end"]
    return len(hooks)


def test_commlab_powersgd_run_traces_step_one_in_ddp_order(powersgd_run):
    _check_run(powersgd_run, "commlab-comm")


def test_pytorch_allreduce_run_traces_step_one_in_ddp_order(allreduce_run):
    _check_run(allreduce_run, "MainThread")


def _check_run(run, hook_thread: str) -> None:
    recorded = run.timeline()
    assert list(recorded["steps"]) == ["1"]  # trace_steps' default: the first after the rebuild
    ranks = recorded["steps"]["1"]
    assert sorted(ranks) == ["0", "1"]
    for events in ranks.values():
        assert _check_order(events) >= 2  # bucket_cap_mb 0.05: several buckets
        threads = {e["thread"] for e in events if e["kind"] == "collective" and e["category"] == "hook"}
        assert threads == {hook_thread}
        (loss,) = [e for e in events if e["kind"] == "collective" and e["category"] == "other"]
        assert loss["start"] < min(e["start"] for e in events if e["kind"] == "backward")
    share = recorded["overlap_share"]
    assert 0.0 <= share <= 1.0 and run.summary()["overlap_share"] == share
    _check_trace(json.loads(run.trace()), 2)
    fig = step_figure(recorded, "1")
    assert {t.name for t in fig.data} >= {"backward", "hook call (gradients ready)", "hook's allreduce"}
