"""The run folder's files: the launcher, the supervisor and rank 0 write them, the UI, the CLI and
notebooks read them (through ``commlab.engine.run_folder.RunFolder``; status.json is written by
``commlab.engine.status_file`` alone).

Layout of ``<runs_dir>/<run_id>/``:
  config.json      the resolved RunConfig, written last by the launcher: a folder is a run once
                   it has one       launch.json  backend, hook plan, the command, the launching
                   process and (once spawned) the supervisor's PID and create time
  meta.json        torch version, hook implementation (written by rank 0 once DDP is up)
  status.json      starting | running | finished | failed | diverged | stopped | stalled, with
                   the error; read as "orphaned" when the supervisor is gone but a process of
                   the run still runs, "lost" when every one is gone, "damaged" when a file is
                   not what commlab wrote (see ``run_folder.RunFolder.status_record``)
  metrics.jsonl    one line per step, appended and flushed by rank 0 (its t, the training time so
                   far, leaves out the held-out evaluations)
  errors.jsonl     approximation error every K steps      buckets.json  DDP's bucket layouts
  evals.jsonl      one line per held-out evaluation (rank 0, every eval_every steps and after
                   the last): step, loss, eval_s, and accuracy or bits_per_char
  checkpoint/      rank<k>.pt, written as a run finishes    checkpoint.json  its step, once complete
                   (``commlab.engine.checkpoint``; a resumed run's launch.json names the first
                   run's folder as resumed_from)
  layers.json      the rule's decision per parameter      grads/        saved mean gradients
  ledger.json      rank 0's communication ledger (``commlab.analysis.ledger``): every collective by
                   traffic, kind, ranks and size; rewritten about once a second and as the run ends
  pitfalls.jsonl   PowerSGD's pitfalls rank 0 caught (``commlab.hooks.pitfalls``): step, layer,
                   kind, detail, fix; absent when none
  profiler/        step<s>.rank<k>.json: each rank's torch.profiler Chrome trace of the traced
                   steps, written by that rank (setting torch_profiler); absent when off
  supervisor.json  the PIDs that own the run, written by the supervisor once it is up
  supervisor.log   the supervisor's output                launcher.log  torchrun's output
  rank<k>.error.json  a rank's traceback, written as it dies, with the ranks already gone then
  torchrun.json    torchrun's record: when its imports were done (up_at), how each failed rank
                   ended (exit code or signal)
  .reserve/        preallocated slots: with the disk full, the files that record how a run ended
                   (status, supervisor, rank errors) are written into one (``write_json``)
Small JSON files are replaced atomically; JSON-lines readers keep a byte offset and only ever
consume complete lines, so a half-written last line never breaks them.

Readers never raise on what a folder holds: a file that is not what it must be (not UTF-8, not
JSON, a list where an object belongs, a folder where a file belongs, a field of the wrong type) is
``Damaged``; ``RunFolder.damage`` names the first one, and the lenient readers return their
empty value for it.  JSON-lines readers skip the lines that are not records and count them.
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from commlab import files
from commlab.config import settings
from commlab.engine.run_state import FINAL, GOING, STOPPABLE  # noqa: F401 (read as store.X)

RESERVE = ".reserve"  # in every run folder: RESERVE_SLOTS files of SLOT_BYTES, written as it is made
RESERVE_SLOTS, SLOT_BYTES = 4, 64 * 1024
# The files a full disk must not keep from being written: they record how a run (or a sweep) ended.
ENDS_A_RUN = re.compile(r"status\.json|supervisor\.json|rank\d+\.error\.json|state\.json|result\.json")
MIN_FREE_BYTES = 16 * 1024 * 1024  # below this free in the runs folder, no run starts


def write_json(path: Path, obj: Any) -> None:
    """Replace ``path`` atomically; no temporary file is left when that fails.  With the disk
    full, a file that records a run's end goes into one of the folder's reserve slots; any other
    raises OSError(ENOSPC, "no space left on device writing <file>")."""
    path = Path(path)
    data = json.dumps(obj, indent=1, default=_jsonable).encode()
    try:
        _replace(path, data)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        if not (ENDS_A_RUN.fullmatch(path.name) and _from_reserve(path, data)):
            raise no_space(path) from None
    if path.name == "status.json" and isinstance(obj, dict) and obj.get("status") in FINAL:
        shutil.rmtree(path.parent / RESERVE, ignore_errors=True)  # an ended run needs none


def no_space(path: Path) -> OSError:
    return OSError(errno.ENOSPC, f"no space left on device writing {Path(path).name}")


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _from_reserve(path: Path, data: bytes) -> bool:
    """Write ``data`` as ``path`` into a reserve slot, claimed by renaming it (two processes never
    take the same one): overwritten in place, which needs no new block on most file systems, or
    else deleted to free its blocks for one more try."""
    for slot in sorted((path.parent / RESERVE).glob("slot*")):
        mine = slot.with_name(f"taken.{os.getpid()}.{slot.name}")
        try:
            os.rename(slot, mine)
        except OSError:
            continue  # taken by another process
        try:
            if len(data) > SLOT_BYTES:
                raise OSError(errno.ENOSPC, "larger than a reserve slot")
            with open(mine, "r+b") as f:
                f.write(data)
                f.truncate()
            os.replace(mine, path)
            return True
        except OSError:
            mine.unlink(missing_ok=True)
            try:
                _replace(path, data)
                return True
            except OSError:
                continue
    return False


def make_reserve(folder: Path) -> None:
    (folder / RESERVE).mkdir()
    for i in range(RESERVE_SLOTS):
        with open(folder / RESERVE / f"slot{i}", "wb") as f:
            f.write(b" " * SLOT_BYTES)  # real bytes: a sparse file reserves nothing


# ---------------------------------------------------------------------------- reading, never raising
class Damaged(ValueError):
    """A run-folder file that is not what it must be; str() is ``<file>: <what>``."""

    def __init__(self, name: str, what: str):
        self.name, self.what = name, what
        super().__init__(f"{name}: {what}")


NUM = (int, float)
OPT_STR, OPT_NUM, OPT_INT = (str, type(None)), (int, float, type(None)), (int, type(None))
# The shape of each file, as far as its readers rely on it: {key: kind} ("key?" optional),
# [kind] a list of such, a type or a tuple of types (bool is never taken for a number).
STATUS = {"status": str, "error?": OPT_STR, "step?": OPT_INT}
OWNER = {"pid?": OPT_INT, "create_time?": OPT_NUM, "host?": str}
SUPERVISOR = {**OWNER, "torchrun_pid?": OPT_INT, "torchrun_create_time?": OPT_NUM, "worker_pids?": [int], "worker_create_times?": dict}
LAUNCH = {"backend?": OPT_STR, "hook_impl?": OPT_STR, "hook_reason?": OPT_STR, "warning?": OPT_STR,
          "resumed_from?": OPT_STR,
          "request_id?": OPT_STR, "launcher?": OWNER, "supervisor?": OWNER, "command?": [str]}
META = {"hook_impl?": OPT_STR, "hook_reason?": OPT_STR, "backend?": OPT_STR, "loss?": OPT_STR}
# config.json: each setting of the settings table with its kind (optional: older runs lack some).
CONFIG = {f"{s.name}?": {"str": str, "int": int, "float": NUM, "bool": bool, "list[int]": [int]}[s.kind]
          for s in settings()}
PARAM = {"name": str, "shape": [int], "numel": int}
BUCKET = {"index": int, "is_last": bool, "bytes": int, "numel": int, "params": [PARAM]}
BUCKETS = {"bucket_cap_mb": NUM, "iter0?": [BUCKET], "rebuilt?": [BUCKET],
           "ddp_logging?": {"bucket_sizes?": OPT_STR, "rebuilt_bucket_sizes?": OPT_STR}}
LAYERS = [{"name": str, "shape": [int], "compressed?": bool}]
STEP = {"step": int, "loss": NUM, "step_s": NUM, "t": NUM, "compression_ratio?": OPT_NUM}
INSTRUMENTED = {"payload_bytes": NUM, "hook_s": NUM, "collectives": NUM, "plain_bytes": NUM}
EVAL = {"step": int, "loss": NUM, "eval_s": NUM, "accuracy?": NUM, "bits_per_char?": NUM}
CHECKPOINT = {"step": int, "world_size": int}
PITFALL = {"step": int, "layer": str, "kind": str, "detail": str, "fix": str}
LEDGER_ROW = {"traffic": str, "collective": str, "ranks": int, "size_bytes": int, "count": int,
              "bytes": int, "counted_bytes": int, "timed": int, "total_s": NUM, "mean_s": OPT_NUM,
              # GB/s; named algbw_gbps and busbw_gbps before (commlab.analysis.ledger.BANDWIDTHS)
              "algbw_gbytes_s?": OPT_NUM, "busbw_gbytes_s?": OPT_NUM, "algbw_gbps?": OPT_NUM,
              "busbw_gbps?": OPT_NUM, "bus_factor": NUM, "link_s": NUM,
              "link_wait_s": NUM, "link_share": OPT_NUM}
LEDGER_FILE = {"step": int, "world_size": int, "clock": str, "emulated_link": bool, "rows": [LEDGER_ROW]}
ERRORS = {"step": int, "layers?": [{"layer": str, "bucket": int, "rel_error": NUM}],
          "buckets?": [{"bucket": int, "rel_error": NUM}], "ef_residual_norm?": OPT_NUM}


def fits(value: Any, kind: Any) -> bool:
    return checker(kind)(value)


def checker(kind: Any, _made: dict = {}):  # noqa: B006 (a cache: the kinds are module constants)
    """A test of a value against ``kind``, made once per kind: readers run it on every record.
    JSON gives exact types, so ``type() in`` is the test, and True is never taken for a number."""
    if id(kind) in _made:
        return _made[id(kind)][1]
    if isinstance(kind, dict):
        fields = [(k.rstrip("?"), k.endswith("?"), checker(v)) for k, v in kind.items()]

        def check(value: Any) -> bool:
            if type(value) is not dict:
                return False
            for key, optional, ok in fields:
                if key in value:
                    if not ok(value[key]):
                        return False
                elif not optional:
                    return False
            return True
    elif isinstance(kind, list):
        item = checker(kind[0])

        def check(value: Any) -> bool:
            return type(value) is list and all(map(item, value))
    else:
        types = frozenset(kind if isinstance(kind, tuple) else (kind,))

        def check(value: Any) -> bool:
            return type(value) in types
    _made[id(kind)] = (kind, check)
    return check


SCHEMAS = {"status.json": STATUS, "supervisor.json": SUPERVISOR, "launch.json": LAUNCH,
           "meta.json": META, "config.json": CONFIG, "buckets.json": BUCKETS, "layers.json": LAYERS,
           "checkpoint.json": CHECKPOINT, "ledger.json": LEDGER_FILE}
RANK_ERROR = {"rank?": OPT_INT, "time?": NUM, "error?": OPT_STR, "traceback?": OPT_STR}


def schema(name: str) -> Any:
    """What a run-folder file must hold (an object for a name it does not know)."""
    return RANK_ERROR if re.fullmatch(r"rank\d+\.error\.json", name) else SCHEMAS.get(name, dict)


def load_json(path: Path, kind: Any = None) -> Any:
    """The file's JSON value; FileNotFoundError when absent, ``Damaged`` when it is not ``kind``
    (by default what ``schema`` says the file holds)."""
    path = Path(path)
    kind = schema(path.name) if kind is None else kind
    try:
        value = files.loads(files.read_regular(path, files.JSON_BYTES))
    except FileNotFoundError:
        raise
    except files.Refused as e:  # a FIFO, /dev/zero, a folder: named, never waited on
        raise Damaged(path.name, str(e)) from None
    except UnicodeDecodeError as e:
        raise Damaged(path.name, f"not UTF-8 text (byte {e.start})") from None
    except (ValueError, RecursionError) as e:
        raise Damaged(path.name, f"not JSON ({str(e)[:80]})") from None
    except OSError as e:
        raise Damaged(path.name, f"unreadable ({e.strerror})") from None
    if not fits(value, kind):
        raise Damaged(path.name, _mismatch(value, kind))
    return value


def _mismatch(value: Any, kind: Any) -> str:
    """What about ``value`` does not fit ``kind``: its kind, or its first field that does not."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "true/false",
             type(None): "null", int: "a number", float: "a number"}
    want = dict if isinstance(kind, dict) else list if isinstance(kind, list) else None
    if want and type(value) is not want:
        return f"{names[type(value)]} where {names[want]} belongs"
    if isinstance(kind, dict):
        for key, sub in kind.items():
            name = key.rstrip("?")
            if name not in value and not key.endswith("?"):
                return f"no {name!r} field"
            if name in value and not fits(value[name], sub):
                return f"field {name!r} is {names.get(type(value[name]), 'odd')}, not what commlab writes"
    return "not what commlab writes there"


def read_json(path: Path, default: Any = None, kind: Any = None) -> Any:
    """``load_json``, but ``default`` for a file that is absent or damaged."""
    try:
        return load_json(path, kind)
    except (OSError, Damaged):
        return default


def finite(x: Any) -> Any:
    """``x`` with every number that is not finite (a diverged run's loss) as None: strict JSON has
    no NaN, and a reader in another language refuses one."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def _jsonable(x: Any) -> Any:
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"cannot write {type(x).__name__} as JSON")


def keep_tail(path: Path, limit: int, keep: int) -> int:
    """A log past ``limit`` bytes cut to its last ``keep``, headed by a line that says how much
    was cut; the bytes cut (0 when under the limit).  In place: a writer appending to it
    (O_APPEND, as every log here is opened) goes on at its new end."""
    try:
        size = os.path.getsize(path)
        if size <= limit:
            return 0
        cut = size - keep
        head = f"[commlab: the first {cut:,} bytes of this log were cut; it keeps its last {keep:,}]\n".encode()
        with open(path, "r+b") as f:
            f.seek(cut)
            tail = f.read()  # to the end as it is now
            end = cut + len(tail)
            f.seek(0)
            f.write(head + tail)
            f.seek(end)
            tail = f.read()  # what the writers appended meanwhile, moved down too
            f.seek(len(head) + end - cut)
            f.write(tail)
            f.truncate()  # a line appended between that read and this is lost: a window of microseconds
        return cut
    except OSError:
        return 0


class JsonlWriter:
    """Appends one JSON object per line, each in one write that readers see at once.  A write
    that fails (the disk full) is undone, so the file keeps only complete lines, and raises
    OSError naming the file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._f = open(path, "ab", buffering=0)
        self._end = self._f.seek(0, os.SEEK_END)

    def write(self, record: dict) -> None:
        line = (json.dumps(record, default=_jsonable, allow_nan=True) + "\n").encode()
        try:
            done = 0
            while done < len(line):
                done += self._f.write(line[done:])
        except OSError as e:
            os.ftruncate(self._f.fileno(), self._end)
            raise (no_space(self.path) if e.errno == errno.ENOSPC else e) from None
        self._end += len(line)

    def close(self) -> None:
        self._f.close()


class JsonlTail:
    """Reads only the complete lines added since the last call, in blocks; keeps the records
    ``check`` accepts (objects, by default), of each only the ``keep`` fields when given, and
    counts the lines it skipped (``skipped``)."""

    BLOCK = 4 * 1024 * 1024

    def __init__(self, path: Path, check=None, keep: tuple[str, ...] | None = None):
        self.path = Path(path)
        self.offset = 0
        self.skipped = 0
        self.check = check or (lambda rec: isinstance(rec, dict))
        self.keep = keep

    def read_new(self) -> list[dict]:
        out: list[dict] = []
        try:
            with files.open_regular(self.path) as f:
                f.seek(self.offset)
                rest = b""
                while block := f.read(self.BLOCK):
                    block = rest + block
                    end = block.rfind(b"\n") + 1  # a trailing partial line waits
                    rest = block[end:]
                    self.offset += end
                    self._parse(block[:end], out)
        except (FileNotFoundError, NotADirectoryError, PermissionError, files.Refused):
            pass  # a folder, a FIFO, a device where the file belongs: ``RunFolder.damage`` names it
        return out

    def _parse(self, chunk: bytes, out: list[dict]) -> None:
        keep = self.keep
        for line in chunk.split(b"\n")[:-1]:  # the chunk ends with one; a stray \r splits nothing
            try:
                rec = files.loads(line)
            except (ValueError, RecursionError):  # junk, NUL bytes, not UTF-8, a 400-digit integer
                rec = None
            if rec is None or not self.check(rec):
                self.skipped += line.strip() != b""  # a power cut's NUL padding counts too
                continue
            out.append(rec if keep is None else {k: rec[k] for k in keep if k in rec})


def _first_line_is_a_record(path: Path, name: str) -> None:
    """Damaged unless the file's first complete line is a record (an object; a step record for
    metrics.jsonl): read without the rest, so a listing stays cheap for the longest run.  Later
    lines that are not records are skipped and counted by the readers, as a torn write leaves."""
    try:
        with files.open_regular(path) as f:
            head = f.read(64 * 1024)
    except files.Refused as e:
        raise Damaged(name, str(e)) from None
    if b"\n" not in head:
        return  # no complete line yet
    line = head.split(b"\n", 1)[0]
    try:
        rec = files.loads(line)
    except (ValueError, RecursionError):
        rec = None
    check = step_check() if name == "metrics.jsonl" else (lambda r: isinstance(r, dict))
    if rec is None or not check(rec):
        raise Damaged(name, f"its first line is not a {'step ' if name == 'metrics.jsonl' else ''}record "
                            f"({line[:40]!r})")


def step_check():
    """A check for metrics.jsonl's records: every step's fields and, in all of them or in none
    (as the first record has them), the instrument's; the figures read every record alike."""
    instrumented = None
    step, instrument = checker(STEP), checker(INSTRUMENTED)

    def check(rec: Any) -> bool:
        nonlocal instrumented
        if not step(rec):
            return False
        has = instrument(rec)
        if instrumented is None:
            instrumented = has
        return has == instrumented

    return check


def read_jsonl(path: Path, check=None) -> list[dict]:
    return JsonlTail(path, check).read_new()


def new_run_dir(runs_dir: str | os.PathLike, label: str, reserve: bool = True) -> Path:
    """A fresh folder with its reserve (``reserve``: a run's, freed by its final status); an
    existing one is never reused, so runs are never overwritten.  ConfigError on runs_dir, and
    no folder, when the disk has too little room."""
    root = Path(runs_dir)
    root.mkdir(parents=True, exist_ok=True)
    _enough_room(root)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-")[:40] or "run"
    while True:
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{slug}-{secrets.token_hex(2)}"
        try:
            (root / run_id).mkdir()
            break
        except FileExistsError:
            continue
    try:
        if reserve:
            make_reserve(root / run_id)
    except OSError as e:
        shutil.rmtree(root / run_id, ignore_errors=True)
        _enough_room(root, e)
        raise
    return root / run_id


def _enough_room(root: Path, failed: OSError | None = None) -> None:
    from commlab.config import ConfigError

    free = shutil.disk_usage(root).free
    if free < MIN_FREE_BYTES or (failed is not None and failed.errno == errno.ENOSPC):
        raise ConfigError({"runs_dir": f"{root} has {free / 2**20:.1f} MiB free; a run needs at "
                                       f"least {MIN_FREE_BYTES / 2**20:.0f} MiB there (free some "
                                       "space or choose another runs folder)"})


class Folder:
    """A folder named by its id whose ``MARKER`` file says it is complete; cheap to construct,
    reads lazily."""

    MARKER = ""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @property
    def id(self) -> str:
        return self.path.name

    def file(self, name: str) -> Path:
        return self.path / name

    def exists(self) -> bool:
        return self.file(self.MARKER).exists()


PITFALLS = "pitfalls.jsonl"
LEDGER = "ledger.json"
TIMELINE, TRACE = "timeline.json", "trace.json"  # the traced steps; the same as a Chrome trace
PROFILER = "profiler"  # torch.profiler's traces of the traced steps, one file per step and rank

