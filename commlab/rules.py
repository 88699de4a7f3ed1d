"""Rules between settings, as data: which fields a rule reads, when it is broken, and what to say.

The settings table (``commlab.config``) checks each field on its own; a ``Rule`` checks fields
against each other ("a compress wrapper cannot wrap noop").  The general rules are the settings
table's; a hook's own rules are its spec's (``commlab.hook_specs``).  Pure: a rule reads a config
object's attributes and nothing else.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    """``field`` is wrong when ``broken(cfg)``; ``message(cfg)`` says why and what to do.

    ``reads``: every field the rule reads; it is not judged while any of them is already wrong
    (its value is then a stand-in), nor when ``field`` already has a message."""

    field: str
    reads: tuple[str, ...]
    broken: Callable[[Any], bool]
    message: Callable[[Any], str]


def check(rules: Iterable[Rule], cfg: Any, errors: dict[str, str]) -> dict[str, str]:
    """``errors`` with the message of every broken rule added, in order (the first per field)."""
    for rule in rules:
        if rule.field in errors or set(rule.reads) & errors.keys():
            continue
        if rule.broken(cfg):
            errors[rule.field] = rule.message(cfg)
    return errors
