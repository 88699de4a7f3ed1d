"""Opening a file that a shared folder may hold anything at: a regular file only, of a bounded size.

A runs folder, or a settings file given on the command line, can be anything its writer made: a
FIFO where status.json belongs (a plain open for reading blocks until a writer comes, and the
listing hangs), a symlink to /dev/zero where metrics.jsonl belongs (a read never ends and memory
grows), a device.  So the lab's readers open with O_NONBLOCK (a FIFO's open returns at once) and ask
the open file itself what it is (``fstat``): nothing can be swapped in between a check and the
open, and a symlink is judged by what it reaches.  Anything but a regular file is ``Refused``, named,
and so is a file larger than its reader's bound.

What such a file holds is read with ``loads``: valid JSON may hold an integer of hundreds of digits,
which the figures' ``float()`` and NumPy's int64 columns would meet later as an OverflowError.
"""
from __future__ import annotations

import json
import os
import stat
from typing import Any, BinaryIO

# The most the lab reads of one JSON file (a run folder's, a settings file): the largest it writes,
# a big model's buckets.json or a long trace's timeline.json, is a few MiB.
JSON_BYTES = 64 * 1024 * 1024
KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
         (stat.S_ISSOCK, "a socket"))


class Refused(OSError):
    """A path the lab will not read: not a regular file, or over its reader's bound; str() says
    which, without the path (the caller names the file as its readers know it)."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what

    def __str__(self) -> str:
        return self.what


def _kind_of(mode: int) -> str:
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def open_regular(path: str | os.PathLike, limit: int | None = None) -> BinaryIO:
    """``path`` opened for binary reading when it is a regular file (a symlink to one is); else
    ``Refused``, as for a file over ``limit`` bytes.  FileNotFoundError and the other OSErrors of
    ``open`` as they come."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{_kind_of(st.st_mode)} where a file belongs")
        if limit is not None and st.st_size > limit:
            raise Refused(f"{st.st_size:,} bytes, more than the {limit:,} its reader takes")
        os.set_blocking(fd, True)  # the flag was for the open alone: a regular file's reads never wait
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them (``open_regular``); ``Refused`` also when
    it grew past ``limit`` while it was read."""
    with open_regular(path, limit) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Refused(f"more than the {limit:,} bytes its reader takes")
    return data


def path_of(f: BinaryIO) -> str:
    """A path that opens the very file ``f`` has open (Linux's /proc/self/fd), for a reader that
    takes only a path (``torch.load``'s mmap): whatever is put at the file's name after
    ``open_regular`` checked it, this reaches the file it checked."""
    return f"/proc/self/fd/{f.fileno()}"


INT_BOUND = 2**63  # no integer the lab writes reaches it; NumPy's int64 and float() take any below


def _bounded_int(text: str) -> int:
    value = int(text)
    if not -INT_BOUND <= value < INT_BOUND:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits, beyond 64 bits")
    return value


_DECODER = json.JSONDecoder(parse_int=_bounded_int)


def loads(text: str | bytes) -> Any:
    """JSON as the lab reads what it did not necessarily write: ValueError (as for text that is
    not JSON; UnicodeDecodeError for bytes not UTF-8) also for an integer beyond 64 bits."""
    return _DECODER.decode(text.decode("utf-8") if isinstance(text, bytes) else text)
