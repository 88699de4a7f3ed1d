"""A run's states, their moves (``commlab.engine.run_state``), status.json's one writer
(``commlab.engine.status_file``) and the runs folder's claims (``commlab.engine.claims``)."""
from __future__ import annotations

import json
import threading

from commlab.engine import claims, status_file
from commlab.engine.run_state import FINAL, GOING, OWN_END, WRITTEN_AFTER, RunStatus, allowed


def test_the_states_are_the_words_status_json_holds():
    assert RunStatus.FINISHED == "finished" and f"{RunStatus.STALLED}" == "stalled"
    assert "finished" in FINAL and "pending" in GOING and "lost" not in GOING
    assert json.dumps({"status": RunStatus.STOPPED}) == '{"status": "stopped"}'
    # every state written has a row; the states only read never do
    assert set(WRITTEN_AFTER) - {None} == set(RunStatus) - {RunStatus.ORPHANED, RunStatus.LOST, RunStatus.DAMAGED}


def test_the_run_s_own_end_is_never_replaced_and_an_end_never_goes_back():
    for own in OWN_END:
        assert not any(allowed(own, then) for then in RunStatus if then != own)
    assert allowed("failed", "stopped") and allowed("stopped", "finished")  # a later end, or rank 0's own
    assert not allowed("running", "pending") and not allowed("stopped", "running")
    assert allowed(None, "starting") and not allowed(None, "running") and not allowed("running", "lost")


def test_the_writer_merges_and_keeps_a_finished_end(tmp_path):
    assert status_file.record(tmp_path, RunStatus.STARTING, step=None)
    assert status_file.record(tmp_path, RunStatus.RUNNING)
    assert status_file.record(tmp_path, RunStatus.FINISHED, step=9)
    assert not status_file.record(tmp_path, RunStatus.STOPPED, error="stopped by the user")
    assert status_file.record(tmp_path, slurm={"job_id": "7"})  # the same state, a field added
    assert json.loads((tmp_path / "status.json").read_text()) == {
        "status": "finished", "step": 9, "slurm": {"job_id": "7"}}


def test_an_exclusive_name_is_taken_once(tmp_path):
    assert claims.take(tmp_path / ".node") and not claims.take(tmp_path / ".node")


def test_a_request_id_gives_every_caller_the_first_caller_s_run(tmp_path):
    first, second = claims.Request(tmp_path, "tab-1"), claims.Request(tmp_path, "tab-1")
    assert first.take() is None
    got = []
    waiting = threading.Thread(target=lambda: got.append(second.take(wait_s=10)))
    waiting.start()
    first.name(tmp_path / "20260101-run")
    waiting.join()
    assert got == [tmp_path / "20260101-run"]
    first.release()
    assert claims.Request(tmp_path, "tab-1").take() is None  # released: free again


def test_a_lock_is_held_by_one_process_at_a_time(tmp_path):
    inside, most = [], []

    def hold():
        with claims.locked(tmp_path / "sub" / ".state.lock"):
            inside.append(1)
            most.append(len(inside))
            threading.Event().wait(0.05)
            inside.pop()

    # flock locks belong to open file descriptions: threads with their own open() exclude each other
    threads = [threading.Thread(target=hold) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == [1, 1, 1, 1]
