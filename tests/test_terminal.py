"""A long command typed in a terminal draws tqdm's progress bar: in-process on a pseudo-terminal,
and ``commlab sweep`` started under a real one (the path no piped test takes: tqdm missing from the
install ended it before its first run)."""
from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from commlab.commands import Progress

ROOT = Path(__file__).resolve().parents[1]


def _terminal() -> tuple[int, int]:
    """A pseudo-terminal the size of a terminal window (a bare one is 0 × 0, where tqdm draws
    nothing)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    return master, slave


def _read_all(fd: int, until: float) -> str:
    """Everything written to a pseudo-terminal's master until its last writer closes."""
    out = b""
    while time.monotonic() < until:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: every writer is gone
            break
        if not chunk:
            break
        out += chunk
    return out.decode(errors="replace")


def test_progress_on_a_terminal_is_tqdm_s_bar():
    master, slave = _terminal()
    with os.fdopen(slave, "w") as stream:
        assert stream.isatty()
        bar = Progress(10, "step", stream=stream)
        assert not bar.piped
        for done in range(1, 11):
            bar.update(done, loss=2.5)
        bar.close()
    shown = _read_all(master, time.monotonic() + 5)
    os.close(master)
    assert "10/10" in shown and "%|" in shown and "loss 2.5" in shown, shown


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_commlab_sweep_in_a_terminal_draws_its_bar_and_ends_with_its_table(tmp_path):
    master, slave = _terminal()
    argv = [sys.executable, "-m", "commlab", "sweep", "--workload", "mlp", "--steps", "6",
            "--world-size", "2", "--matrix-approximation-rank", "1", "--no-baseline", "--repeats", "1",
            "--runs-dir", str(tmp_path)]
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT,
                            env={**os.environ, "TERM": "xterm"})
    os.close(slave)
    try:
        shown = _read_all(master, time.monotonic() + 800)
        proc.wait(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, shown[-3000:]
    assert "ModuleNotFoundError" not in shown and "6/6" in shown and "%|" in shown, shown[-3000:]
    assert "recommendation:" in shown, shown[-3000:]
