"""User workloads (the ``module:function`` contract) that misbehave on purpose, for engine tests."""
import os
import signal
import time

import torch

from commlab.workloads import mlp


def _rank() -> int:
    return int(os.environ.get("RANK", 0))


def crashing(rank=0, seed=0):
    """Rank 1 raises while drawing the batch for step 3."""
    w = mlp(rank=rank, seed=seed)

    def batches():
        for step, batch in enumerate(w.batches()):
            if step == 3 and rank == 1:
                raise RuntimeError("rank 1 ran out of data on purpose")
            yield batch
    return w.model, batches


def stubborn(rank=0, seed=0):
    """Ignores SIGTERM, and draws batches slowly so the run is still going when it is stopped."""
    if "RANK" in os.environ:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    w = mlp(rank=rank, seed=seed)

    def batches():
        for batch in w.batches():
            time.sleep(0.2)
            yield batch
    return w.model, batches


def exploding(rank=0, seed=0):
    """Targets become infinite at step 3: the loss is not finite from there."""
    model = torch.nn.Linear(8, 1)

    def batches():
        g = torch.Generator().manual_seed(rank)
        step = 0
        while True:
            x = torch.randn(4, 8, generator=g)
            y = torch.full((4, 1), float("inf") if step >= 3 else 0.5)
            step += 1
            yield x, y
    return model, batches


def sleepy(rank=0, seed=0):
    """Rank 0 stops drawing batches after step 2, as a deadlocked hook would stop the step."""
    w = mlp(rank=rank, seed=seed)

    def batches():
        for step, batch in enumerate(w.batches()):
            if step == 3 and _rank() == 0:
                time.sleep(3600)
            yield batch
    return w.model, batches


def forks_a_daemon(rank=0, seed=0):
    """Forks a child that leaves the session (setsid) and sleeps, its PID in $COMMLAB_TEST_PID_FILE;
    only while the workload is checked (no RANK), not in the run's own workers."""
    if "RANK" not in os.environ and os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # a grandchild, whose parent exits at once: it is left to init
            with open(os.environ["COMMLAB_TEST_PID_FILE"], "w") as f:
                f.write(str(os.getpid()))
            time.sleep(600)
        os._exit(0)
    return mlp(rank=rank, seed=seed)


ESCAPED_ENV = "COMMLAB_TEST_ESCAPED"  # a file each escaped process's PID is appended to


def _note_pid(pid: int) -> None:
    with open(os.environ[ESCAPED_ENV], "a") as f:
        f.write(f"{pid}\n")


def escaping(rank=0, seed=0):
    """Starts two processes that try to outlive whoever called it: one with a clean environment in
    a session of its own, one by a double fork (its parent gone at once, so init would adopt it)."""
    import subprocess
    import sys

    w = mlp(rank=rank, seed=seed)
    clean = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env={},
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _note_pid(clean.pid)
    middle = os.fork()
    if middle == 0:
        if os.fork() == 0:
            os.setsid()
            _note_pid(os.getpid())
            time.sleep(600)
        os._exit(0)
    os.waitpid(middle, 0)
    return w.model, w.batches


LOUD_STEP, LOUD_BYTES = 3, 40 * 10**6


def loud(rank=0, seed=0):
    """Rank 0 prints 40 MB as it draws the batch of step 3 (a run of 4 steps ends right after)."""
    w = mlp(rank=rank, seed=seed)

    def batches():
        for step, batch in enumerate(w.batches()):
            if step == LOUD_STEP and _rank() == 0:
                line = "x" * 999 + "\n"
                for _ in range(LOUD_BYTES // len(line)):
                    print(line, end="")
            yield batch
    return w.model, batches
