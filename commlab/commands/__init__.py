"""CLI subcommands: each module here defines ``register(subparsers)``; ``cli`` finds them all.

What every subcommand shares lives here, below the CLI that imports them: how a result is printed,
how help shows defaults, how a run or sweep named by its id is found, and the exit code for bad
input.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

EXIT_BAD_INPUT = 2  # nothing was started


def emit(args: argparse.Namespace, payload: dict, text: str) -> None:
    """Print ``text`` for people, or the payload as one line of strict JSON with ``--json``: a
    number that is not finite (a diverged run's loss) is null, as JSON has no NaN."""
    from commlab.engine.store import finite

    if getattr(args, "json", False):
        print(json.dumps(finite(payload), default=str, allow_nan=False))
    else:
        print(text)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help with each option's default (when it has one and its help does not say it)
    and without reStructuredText's double backticks, which a terminal prints as they are."""

    def _get_help_string(self, action):
        text = re.sub(r"``([^`]*)``", r"\1", action.help or "")
        given = action.default not in (None, False, argparse.SUPPRESS) and action.option_strings
        if given and "default" not in text and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def resolve_run(given: str, runs_dir: str | None = None) -> Path:
    """A run as a person names it: its folder, or the id ``commlab runs`` prints (a folder of
    the runs folder).  ConfigError naming what was looked for otherwise."""
    from commlab.config import ConfigError, default_runs_dir
    from commlab.engine.run_folder import RunFolder

    for path in (Path(given), Path(runs_dir or default_runs_dir()) / given):
        if RunFolder(path).exists():
            return path
    raise ConfigError({"run": f"{given!r} is neither a run folder nor the id of a run in "
                              f"{runs_dir or default_runs_dir()} (`commlab runs` lists them)"})


def resolve_sweep(given: str, runs_dir: str | None = None) -> Path:
    """A sweep as a person names it: its folder, or its id (a folder of the runs folder's sweeps)."""
    from commlab.config import ConfigError, default_runs_dir
    from commlab.tune.sweep import SWEEPS, Sweep

    root = Path(runs_dir or default_runs_dir())
    for path in (Path(given), root / SWEEPS / given):
        if Sweep(path).exists():
            return path
    raise ConfigError({"sweep": f"{given!r} is neither a sweep folder (one with sweep.json) nor "
                                f"the id of a sweep in {root / SWEEPS}"})


class Progress:
    """Steps done, on stderr: tqdm's bar on a terminal; piped or redirected, a plain line every
    tenth of the way (a bar's carriage returns would run together in a log file)."""

    LINES = 10  # plain lines over a whole run

    def __init__(self, total: int, what: str = "step", stream=None, lines: int = LINES):
        """``lines``: the plain lines when piped (0: none; the caller ``write``s its own)."""
        import sys

        self.stream = stream or sys.stderr
        self.total, self.what, self.done, self.next_line, self.lines = total, what, 0, 0, lines
        self.bar = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=what, file=self.stream, dynamic_ncols=True)

    def update(self, done: int, **shown: float) -> None:
        """``done`` of ``total`` now; ``shown`` (loss=...) beside the count."""
        from commlab.analysis.units import number

        text = ", ".join(f"{k} {number(v)}" for k, v in shown.items())
        if self.bar is not None:
            self.bar.update(done - self.done)
            self.bar.set_postfix_str(text, refresh=False)
        elif self.lines and (done >= self.next_line or done == self.total):
            print(f"{self.what} {done:,}/{self.total:,}" + (f"  {text}" if text else ""),
                  file=self.stream, flush=True)
            self.next_line = done + max(self.total // self.lines, 1)
        self.done = done

    def grow(self, more: int) -> None:
        """``more`` to count beyond the total first told (a sweep that adds seeds)."""
        self.total += more
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()

    @property
    def piped(self) -> bool:
        return self.bar is None

    def describe(self, text: str) -> None:
        """What the bar is counting now (on a terminal; piped, ``write`` says it)."""
        if self.bar is not None:
            self.bar.set_description_str(text, refresh=False)

    def write(self, line: str) -> None:
        """A line of its own, above the bar on a terminal."""
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
