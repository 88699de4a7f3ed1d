"""Checkpoint and resume with real runs: a run of N steps equals a run of N/2 resumed for N/2, bit
for bit, with plain allreduce and with commlab's PowerSGD over several buckets on Gloo; and the
held-out evaluation every run writes.

The uninterrupted runs are the session's (``conftest.runs_dir``: mlp, 24 steps, several buckets);
the halves here take their settings.  DDP's first iteration cuts one bucket, its rebuilt layout
two: without the resumed run's rebuild pass (``commlab.engine.checkpoint``) PowerSGD's error
memory would meet a bucket of another size.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from commlab import api
from commlab.cli import main as cli_main
from commlab.config import RunConfig
from commlab.ui.runs import LiveView, run_table

pytestmark = pytest.mark.slow


def _half(whole, tmp_path) -> api.Run:
    cfg = RunConfig.from_dict({**whole.config_dict(), "steps": 12, "runs_dir": str(tmp_path)})
    return api.launch(cfg)


def _losses(*runs) -> list[float]:
    return [r["loss"] for run in runs for r in run.metrics_records()]


def test_a_resumed_run_equals_an_uninterrupted_one(powersgd_run, allreduce_run, tmp_path, capsys):
    assert powersgd_run.launch_info()["hook_impl"] == "commlab"
    layouts = powersgd_run.buckets()["ddp_logging"]
    assert layouts["bucket_sizes"].count(",") != layouts["rebuilt_bucket_sizes"].count(",")
    halves = [_half(powersgd_run, tmp_path), _half(allreduce_run, tmp_path)]  # at once
    for h in halves:
        assert h.wait(600) == "finished", h.status_record()
        assert h.checkpoint_step() == 11 and h.evals()[-1]["step"] == 11
    ps_half, ar_half = halves

    # A setting that changes the trajectory is refused, named, before anything starts.
    assert cli_main(["run", "--resume", str(ps_half.path), "--lr", "0.5", "--json"]) == 2
    refused = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(refused["errors"]) == {"lr"} and "must stay" in refused["errors"]["lr"]

    cli = subprocess.Popen([sys.executable, "-m", "commlab", "run", "--resume", str(ar_half.path),
                            "--json"], stdout=subprocess.PIPE, text=True)  # 12 more: 24 in all
    ps_rest = api.resume(ps_half.path, steps=24)
    out, _ = cli.communicate(timeout=600)
    assert ps_rest.wait(600) == "finished", ps_rest.status_record()
    payload = json.loads(out.strip().splitlines()[-1])
    assert cli.returncode == 0, payload
    ar_rest = api.open_run(payload["run_dir"])

    for whole, half, rest in ((powersgd_run, ps_half, ps_rest), (allreduce_run, ar_half, ar_rest)):
        assert rest.resumed_from() == str(half.path.resolve())
        assert [r["step"] for r in rest.metrics_records()] == list(range(12, 24))
        assert _losses(half, rest) == _losses(whole), whole.config_dict()["hook"]
        # held-out quality: after the last step of every run, on the same fixed set
        assert whole.evals()[-1]["step"] == rest.evals()[-1]["step"] == 23
        assert rest.evals()[-1]["loss"] == whole.evals()[-1]["loss"]
        assert rest.evals()[-1]["accuracy"] == whole.evals()[-1]["accuracy"]
        assert all(e["eval_s"] > 0 for e in rest.evals())
    # PowerSGD went on from its state: iteration, compression and error memory carried over
    ps_rows = ps_rest.metrics_records()
    assert ps_rows[0]["powersgd_iter"] > 12 and ps_rows[0]["compression_ratio"] > 1
    assert payload["resumed_from"] == str(ar_half.path.resolve())
    assert payload["evals"] == ar_rest.evals() and payload["heldout_loss"] == ar_rest.evals()[-1]["loss"]
    assert payload["heldout_accuracy"] == ar_rest.evals()[-1]["accuracy"]
    # the live view and the run table show the held-out figures
    view = LiveView(ps_rest.path)
    view.poll()
    assert view.evals == ps_rest.evals() and view.headline()["heldout_step"] == 23
    assert view.headline()["heldout_accuracy"] == ps_rest.evals()[-1]["accuracy"]
    table = {r["run_id"]: r for r in run_table(str(tmp_path))}
    assert table[ps_rest.id]["heldout_loss"] == ps_rest.evals()[-1]["loss"]
