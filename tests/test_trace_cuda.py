"""A traced step's device times on CUDA: the arithmetic that turns CUDA events into times on the
host's clock (with a stand-in event that has ``synchronize`` and ``elapsed_time``, as
``torch.cuda.Event`` does), and, where a GPU is present, a real NCCL run's timeline."""
import pytest
import torch

from commlab.api import RunConfig, run
from commlab.hooks.instrument import DeviceClock, StepRecord


class _Device:
    """The device's own clock (seconds, any origin): an event recorded on it holds where it is."""

    def __init__(self, now: float):
        self.now = now

    def record(self) -> "_Event":
        return _Event(self.now)


class _Event:
    def __init__(self, t: float):
        self.t = t

    def synchronize(self):
        pass

    def elapsed_time(self, end: "_Event") -> float:  # milliseconds, as torch.cuda.Event's
        return (end.t - self.t) * 1e3


def _clock(device: _Device, anchor: float) -> DeviceClock:
    return DeviceClock(device.record(), anchor, device.record)


def test_device_times_are_the_anchor_plus_the_elapsed_time_since_the_reference():
    device = _Device(now=7000.0)  # the device's clock has an origin of its own
    clock = _clock(device, anchor=100.0)  # the host's perf_counter at the reference
    rec = StepRecord(events=[], clock=clock)
    device.now = 7000.25
    start = rec.mark()
    device.now = 7000.75
    rec.add({"kind": "backward", "start": 100.01, "end": 100.02}, start)  # the host ran ahead
    events = rec.timeline()
    assert events == [{"kind": "backward", "start": pytest.approx(100.25), "end": pytest.approx(100.75),
                       "clock": "cuda", "host_start": 100.01, "host_end": 100.02}]
    assert clock._spans == []  # resolved once


def test_an_emulated_link_holds_the_device_end_until_its_host_deadline():
    device = _Device(now=0.0)
    clock = _clock(device, anchor=10.0)
    held, late = ({"kind": "collective", "start": 10.0, "end": deadline, "link_s": link_s}
                  for deadline, link_s in ((10.5, 0.4), (10.2, 0.1)))
    for event in (held, late):
        device.now = 0.1
        issued = clock.mark()
        device.now = 0.3  # completed on the device at host time 10.3
        clock.span(event, issued)
    clock.resolve()
    # Its deadline (10.5) came after the device's completion: the link held the last 0.2 s.
    assert (held["start"], held["end"], held["link_s"]) == pytest.approx((10.1, 10.5, 0.2))
    # The device completed after the deadline (10.2): the link held nothing back.
    assert (late["start"], late["end"], late["link_s"]) == pytest.approx((10.1, 10.3, 0.0))


def test_without_a_clock_the_timeline_is_the_hosts():
    rec = StepRecord(events=[])
    assert rec.mark() is None
    rec.add({"kind": "optimizer", "start": 1.0, "end": 2.0})
    assert rec.timeline() == [{"kind": "optimizer", "start": 1.0, "end": 2.0}]
    untraced = StepRecord()
    untraced.add({"kind": "optimizer", "start": 1.0, "end": 2.0})
    assert untraced.events is None


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and NCCL")
def test_an_nccl_run_traces_its_step_on_the_device(tmp_path):
    r = run(RunConfig(hook="allreduce", backend="nccl", world_size=torch.cuda.device_count(),
                      workload="mlp", steps=3, trace_steps=[1], bucket_cap_mb=0.05,
                      runs_dir=str(tmp_path)), timeout=300)
    assert r.status() == "finished", r.status_record()
    steps = r.timeline()["steps"]
    for events in steps["1"].values():
        assert {e["kind"] for e in events} >= {"backward", "optimizer", "hook", "future", "collective"}
        assert all(e.get("clock") == "cuda" and e["start"] <= e["end"] for e in events), events
        # Inside its bucket's window on the device: issued on the stream that called the hook,
        # done before the future's callback ran (the GPU's timer ticks in microseconds).
        windows = {e["bucket"]: e for e in events if e["kind"] == "future"}
        for e in events:
            if e["kind"] == "collective" and e["category"] == "hook":
                w = windows[e["bucket"]]
                assert w["start"] <= e["start"] <= e["end"] <= w["end"] + 1e-5, (e, w)
