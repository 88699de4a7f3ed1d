"""CLI subcommands: each module here defines ``register(subparsers)``; ``cli`` finds them all.

What every subcommand shares lives here, below the CLI that imports them: how a result is printed
and the exit code for bad input.
"""
from __future__ import annotations

import argparse
import json
import math
from typing import Any

EXIT_BAD_INPUT = 2  # nothing was started


def emit(args: argparse.Namespace, payload: dict, text: str) -> None:
    """Print ``text`` for people, or the payload as one line of strict JSON with ``--json``: a
    number that is not finite (a diverged run's loss) is null, as JSON has no NaN."""
    if getattr(args, "json", False):
        print(json.dumps(_finite(payload), default=str, allow_nan=False))
    else:
        print(text)


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
