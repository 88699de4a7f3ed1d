"""Hostile ground (issue 40, items 3, 5, 6, 11 and 12): what a shared folder or a hand can put
where the lab reads, and the figures a second attack found wrong.

Each fault is made for real: a FIFO made with ``os.mkfifo``, a symlink to /dev/zero, a
checkpoint written by a real 3-rank run, a file nested 100,000 deep, real DiLoCo and post-local
SGD runs.  A reader that could hang runs in a subprocess with a timeout, so that a regression fails
the test instead of hanging the suite.
"""
from __future__ import annotations

import pytest

from commlab.analysis import metrics
from commlab.config import RunConfig


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
