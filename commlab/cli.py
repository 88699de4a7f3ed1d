"""commlab (or python -m commlab): one subcommand per module in commlab.commands.

With ``--json`` the last line a command prints is one JSON object.  Exit codes: 0 success,
1 the work ran and did not succeed, 2 bad input (nothing was started).
"""
from __future__ import annotations

import argparse
import functools
import importlib
import json
import pkgutil
import sys

from commlab import commands
from commlab.commands import EXIT_BAD_INPUT
from commlab.config import ConfigError

DESCRIPTION = ("The PowerSGD communication-hook lab: runs, sweeps, exports and classroom "
               "collectives on real processes. `commlab COMMAND --help` shows a command's options.")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand; or, when ``command`` names a module of commlab.commands, that module's
    alone: a command does not wait for the others' imports (a third of ``commlab run``'s time to
    its run folder)."""
    parser = argparse.ArgumentParser(prog="commlab", description=DESCRIPTION,
                                     formatter_class=commands.HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=functools.partial(
        argparse.ArgumentParser, formatter_class=commands.HelpFormatter))
    names = sorted(m.name for m in pkgutil.iter_modules(commands.__path__))
    for name in [command] if command in names else names:
        importlib.import_module(f"{commands.__name__}.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
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
