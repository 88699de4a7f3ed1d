"""``commlab`` / ``python -m commlab``: one subcommand per module in ``commlab.commands``.

With ``--json`` the last line a command prints is one JSON object.  Exit codes: 0 success,
1 the work ran and did not succeed, 2 bad input (nothing was started).
"""
from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys

from commlab import commands
from commlab.config import ConfigError

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="commlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"{commands.__name__}.{info.name}").register(sub)
    return parser


def emit(args: argparse.Namespace, payload: dict, text: str) -> None:
    """Print ``text`` for people, or the payload as one JSON line with ``--json``."""
    if getattr(args, "json", False):
        print(json.dumps(payload, default=str))
    else:
        print(text)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        if getattr(args, "json", False):
            print(json.dumps({"error": "invalid settings", "errors": e.errors}))
        else:
            print("commlab: invalid settings, nothing was started:", file=sys.stderr)
            for field, msg in e.errors.items():
                print(f"  {field}: {msg}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
