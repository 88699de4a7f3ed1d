"""Warm ranks (commlab/engine/pool.py): runs on a pool of ranks started once give the numbers of
the same runs started cold, bit for bit (plain allreduce and PowerSGD with several buckets, the
session's cold runs; a compressor), all under the pool's one supervisor, each in processes of its
own that the pool's ranks fork for it (tests/test_warm_like_cold.py: whatever a workload keeps in
its module); a run that fails or hangs
ends as such, named, and the pool starts again for the next; a Stop ends the run and the pool, or
takes back a run not started yet; ``launch.Batch`` gives a run of another world
size ranks of its own, one pool at a time, and a comparison's pool goes with it; nothing is left
running."""
from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from commlab.config import RunConfig
from commlab.engine import procs
from commlab.engine.commands import worker_env
from commlab.engine.launch import start
from commlab.engine.launchers.warm import Warm
from commlab.engine.pool import POOL_RANK_NAME, Pool, supervisor_of

pytestmark = pytest.mark.slow  # a pool of real ranks


def _numbers(run) -> list[tuple]:
    return [(r["step"], r["loss"], r.get("payload_bytes"), r.get("plain_bytes")) for r in run.metrics_records()]


def _pool(tmp_path, cfg: RunConfig) -> Pool:
    pool = Pool(tmp_path / "pool", cfg.world_size, "gloo")
    pool.start(worker_env(cfg))
    return pool


def _pool_processes(pool: Pool) -> list:
    """Its supervisor, torchrun and the ranks."""
    pid = supervisor_of(pool.path)["pid"]
    try:
        return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _pool_ranks(pool: Pool) -> list[int]:
    """The pool's ranks (which fork each run's processes), once all of them are up."""
    def up() -> list[int]:
        ranks = []
        for p in _pool_processes(pool):
            with contextlib.suppress(psutil.Error):
                if p.name().startswith(POOL_RANK_NAME):
                    ranks.append(p.pid)
        return ranks if len(ranks) == pool.world_size else []

    assert procs.wait_until(up, 120)
    return up()


def _gone(pids, within_s: float = 30) -> bool:
    """Every one of ``pids`` ended (or a zombie): a pool's ranks die with its torchrun, a moment
    after it (the kernel's signal on their parent's death)."""
    def ended(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return procs.wait_until(lambda: all(ended(pid) for pid in pids), within_s)


@pytest.mark.timeout(900)
def test_warm_runs_give_the_numbers_of_cold_ones_bit_for_bit(powersgd_run, allreduce_run, tmp_path):
    cold = [powersgd_run, allreduce_run]
    cfgs = [RunConfig.from_dict({**r.config_dict(), "runs_dir": str(tmp_path)}) for r in cold]
    topk = RunConfig(hook="topk", workload="mlp", steps=8, bucket_cap_mb=0.001, runs_dir=str(tmp_path))
    cold.append(start(topk))
    assert cold[-1].wait(600) == "finished", cold[-1].status_record()
    pool = _pool(tmp_path, topk)
    seen = set()
    try:
        for cfg, cold_run in zip([*cfgs, topk], cold):
            ranks = set(_pool_ranks(pool))
            warm = start(cfg, Warm(pool.path))
            assert warm.wait(600) == "finished", warm.status_record()
            assert warm.launch_info()["pool"] == str(pool.path.resolve())
            assert _numbers(warm) == _numbers(cold_run), cfg.hook
            assert pool.alive() and set(_pool_ranks(pool)) == ranks  # the same ranks, run after run
            # ... which forked the run's own processes, new for each run and gone with it
            own = set(warm.supervisor()["worker_pids"])
            assert len(own) == cfg.world_size and not own & (ranks | seen) and _gone(own)
            seen |= own
            # ... and the same supervisor: the pool's, no process of its own started for the run
            assert warm.supervisor()["pid"] == supervisor_of(pool.path)["pid"]
            assert "command" not in warm.launch_info() and not warm.file("supervisor.log").exists()
    finally:
        pool.close()
    assert not pool.alive() and not _pool_processes(pool)


@pytest.mark.timeout(900)
def test_a_failing_run_ends_named_and_the_pool_starts_again_for_the_next(tmp_path):
    crashing = RunConfig(workload="tests.misbehaving_workloads:crashing", steps=50, runs_dir=str(tmp_path))
    fine = RunConfig(workload="mlp", steps=3, runs_dir=str(tmp_path))
    pool = _pool(tmp_path, fine)
    try:
        failed = start(crashing, Warm(pool.path))
        assert failed.wait(600) == "failed"
        rec = failed.status_record()
        assert rec["failed_rank"] == 1 and "ran out of data on purpose" in rec["error"], rec
        assert not pool.alive()  # a rank failed inside the run: the pool ended with it
        pool.start(worker_env(fine))
        nxt = start(fine, Warm(pool.path))
        assert nxt.wait(600) == "finished", nxt.status_record()
    finally:
        pool.close()
    assert not _pool_processes(pool)


@pytest.mark.timeout(900)
def test_a_run_that_hangs_is_stalled_and_the_next_gets_fresh_ranks(tmp_path):
    hangs = RunConfig(workload="tests.misbehaving_workloads:sleepy", steps=50, stall_timeout_s=4,
                      runs_dir=str(tmp_path))
    fine = RunConfig(workload="mlp", steps=3, runs_dir=str(tmp_path))
    pool = _pool(tmp_path, fine)
    try:
        stalled = start(hangs, Warm(pool.path))
        assert stalled.wait(600) == "stalled", stalled.status_record()
        assert "after step 2" in stalled.status_record()["error"]
        old_ranks = set(stalled.supervisor()["worker_pids"])
        assert not pool.alive() and _gone(old_ranks)  # the hung ranks went with it
        pool.start(worker_env(fine))
        nxt = start(fine, Warm(pool.path))
        assert nxt.wait(600) == "finished", nxt.status_record()
        assert not set(nxt.supervisor()["worker_pids"]) & old_ranks
    finally:
        pool.close()
    assert not _pool_processes(pool)


@pytest.mark.timeout(900)
def test_a_stop_ends_the_run_and_the_pool(tmp_path):
    long = RunConfig(workload="mlp", steps=100_000, runs_dir=str(tmp_path))
    pool = _pool(tmp_path, long)
    try:
        run = start(long, Warm(pool.path))
        assert procs.wait_until(lambda: len(run.metrics_records()) > 3, 600), run.status_record()
        ranks = {p.pid for p in _pool_processes(pool)[2:]}  # after its supervisor and torchrun
        # Its supervisor knows the run's processes (forked by the pool's ranks), for a Stop (and a
        # person) to see.
        own = set(run.supervisor()["worker_pids"])
        assert own == ranks - set(_pool_ranks(pool)) and len(own) == long.world_size
        assert run.stop() == "stopped"
        assert procs.wait_until(lambda: not pool.alive(), 30)
        assert _gone(ranks)
    finally:
        pool.close()
    assert not _pool_processes(pool)


@pytest.mark.timeout(900)
def test_a_run_stopped_before_its_turn_never_runs_and_one_the_pool_never_took_ends_named(tmp_path):
    long = RunConfig(workload="mlp", steps=100_000, eval_every=0, runs_dir=str(tmp_path))
    pool = _pool(tmp_path, long)
    try:
        first = start(long, Warm(pool.path))
        assert procs.wait_until(lambda: len(first.metrics_records()) > 3, 600), first.status_record()
        waiting, last = start(long, Warm(pool.path)), start(long, Warm(pool.path))
        assert waiting.status() == last.status() == "starting"  # handed, not taken: one run at a time
        # Taken back from the pool's queue: the run in hand and the pool go on.
        assert waiting.stop() == "stopped"
        steps = len(first.metrics_records())
        assert pool.alive() and first.status() == "running"
        assert procs.wait_until(lambda: len(first.metrics_records()) > steps, 60)
        assert first.stop() == "stopped"  # inside the ranks: the pool ends with it
        assert last.wait(60) == "stopped", last.status_record()
        assert last.status_record()["error"] == "its pool of warm ranks ended before the run started"
        assert not waiting.metrics_records() and not last.metrics_records()
        assert not pool.alive()
    finally:
        pool.close()
    assert not _pool_processes(pool)


@pytest.mark.timeout(300)
def test_a_pool_whose_process_is_killed_between_runs_leaves_nothing(tmp_path):
    """The pool's supervisor is detached (its own session) and watches the process that started
    it: killed with SIGKILL between two runs, that process takes the pool with it."""
    script = (f"import sys, time\nfrom commlab.config import RunConfig\n"
              f"from commlab.engine.commands import worker_env\nfrom commlab.engine.pool import Pool\n"
              f"pool = Pool({str(tmp_path / 'pool')!r}, 2, 'gloo')\n"
              f"pool.start(worker_env(RunConfig(workload='mlp')))\nprint('up', flush=True)\ntime.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parent.parent)
    try:
        assert owner.stdout.readline().strip() == "up"
        pool = Pool(tmp_path / "pool", 2, "gloo")
        assert procs.wait_until(lambda: len(_pool_processes(pool)) >= 4, 300)  # supervisor, torchrun, 2 ranks
        everyone = [p.pid for p in _pool_processes(pool)]
    finally:
        owner.kill()
        owner.wait()
    assert _gone(everyone), [p.pid for p in _pool_processes(pool)]


@pytest.mark.timeout(900)
def test_a_comparison_runs_its_hooks_on_one_pool_and_leaves_nothing(tmp_path, capsys):
    from commlab.cli import main
    from commlab.engine.launch import list_runs
    from commlab.engine.launchers.warm import POOLS

    assert main(["compare", "--hooks", "allreduce,noop", "--workload", "mlp", "--steps", "3",
                 "--eval-every", "0", "--runs-dir", str(tmp_path), "--json"]) == 0
    runs = list_runs(tmp_path)
    assert sorted(r.config().hook for r in runs) == ["allreduce", "noop"]
    assert all(r.status() == "finished" for r in runs), [r.status_record() for r in runs]
    assert len({r.launch_info()["pool"] for r in runs} - {None}) == 1  # both on the same ranks
    assert {r.launch_info()["owner"]["what"] for r in runs} == {"comparison"}
    ranks = {pid for r in runs for pid in r.supervisor()["worker_pids"]}
    assert len(ranks) == 4 and _gone(ranks)  # two processes for each run
    assert not list((tmp_path / POOLS).iterdir())  # its pool's folder went with it


@pytest.mark.timeout(900)
def test_a_run_of_another_world_size_gets_ranks_of_its_own(tmp_path):
    from commlab.engine.launchers.warm import Batch

    two, three = (RunConfig(workload="mlp", steps=2, world_size=n, eval_every=0, runs_dir=str(tmp_path))
                  for n in (2, 3))
    with Batch("test", tmp_path / "pools") as batch:
        runs = [batch.start(two)]
        assert runs[0].wait(600) == "finished", runs[0].status_record()
        first = batch.pool
        runs.append(batch.start(three))
        assert runs[1].wait(600) == "finished", runs[1].status_record()
        assert not first.alive() and batch.pool is not first  # one pool at a time
    assert [len(r.supervisor()["worker_pids"]) for r in runs] == [2, 3]
    assert [Path(r.launch_info()["pool"]).name for r in runs] == ["2-gloo", "3-gloo"]
    assert _gone({pid for r in runs for pid in r.supervisor()["worker_pids"]})
