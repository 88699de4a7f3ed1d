"""Text that is safe whatever a person typed: a value in a comment is escaped onto one line, a
value in Python is a ``repr`` literal, a value for a shell is quoted (``$'...'`` when it holds a
control character)."""
from __future__ import annotations

import shlex
import textwrap


def one_line(text: str) -> str:
    """``text`` with every character that is not printable (a newline, a carriage return, any
    control or line-separator character) written as its escape: a comment cannot be left."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in str(text))


def comment(lines: list[str], prefix: str = "# ") -> str:
    """Each line a comment, prose wrapped at 96 columns; a line that starts with two spaces is
    code to copy and stays whole."""
    return "".join((prefix + one_line(line) if line.startswith("  ") else
                    textwrap.fill(one_line(line), 96, initial_indent=prefix, subsequent_indent=prefix))
                   + "\n" for line in lines)


def call(func: str, first: list[str], kwargs: dict) -> str:
    """``func(first..., key=value, ...)``, one argument a line; values as ``repr`` literals."""
    args = first + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{func}(\n" + "".join(f"    {a},\n" for a in args) + ")"


def quote(word: str) -> str:
    """``word`` for bash on one line: ``shlex.quote``, or ``$'...'`` with escapes when it holds a
    character that is not printable (a newline would end a comment or split a command)."""
    if all(ch.isprintable() for ch in word):
        return shlex.quote(word)
    body = "".join(ch if ch.isprintable() and ch not in "\\'" else
                   ("\\" + ch if ch in "\\'" else _escape(ch)) for ch in word)
    return f"$'{body}'"


def _escape(ch: str) -> str:
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x80 else f"\\U{ord(ch):08x}"


def words(argv: list[str], ours: tuple[str, ...] = ()) -> str:
    """``argv`` on one line, every word quoted except those in ``ours`` (already shell)."""
    return " ".join(a if a in ours else quote(a) for a in argv)


def shell(argv: list[str], script_len: int, ours: tuple[str, ...] = ()) -> str:
    """One command line, an option and its value per line, the script and its arguments last.

    Every argument is quoted except those in ``ours``, which are already written for the shell.
    """
    quoted = [a if a in ours else quote(a) for a in argv]
    groups: list[list[str]] = []
    for word in quoted[:len(quoted) - script_len]:
        if word.startswith("--") or not groups:
            groups.append([word])
        else:
            groups[-1].append(word)
    groups.append(quoted[len(quoted) - script_len:])
    return " \\\n    ".join(" ".join(g) for g in groups)
