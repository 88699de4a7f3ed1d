"""CLI subcommands: each module here defines ``register(subparsers)``; ``cli`` finds them all.

What every subcommand shares lives here, below the CLI that imports them: how a result is printed
and the exit code for bad input.
"""
from __future__ import annotations

import argparse
import json

EXIT_BAD_INPUT = 2  # nothing was started


def emit(args: argparse.Namespace, payload: dict, text: str) -> None:
    """Print ``text`` for people, or the payload as one JSON line with ``--json``."""
    if getattr(args, "json", False):
        print(json.dumps(payload, default=str))
    else:
        print(text)
