"""A user's workload, checked in a child process before anything starts.

    python -m commlab.engine.workload_probe ANSWER_FILE JOB_JSON     (started by ``_ask``)

Checking a ``module:function`` means importing the person's module and calling their function,
and either may do anything: ``os.abort()``, ``sys.exit(0)``, hang on import.  Done in the Streamlit
server, one of those ends or freezes the app for every session; so the check runs here, in a
child (``commlab.workloads.check`` as rank 0 would load it), within a timeout, and whatever ends
it is reported by name.  The built-in workloads need no child.
"""
from __future__ import annotations

import importlib.machinery
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

from commlab.config import ConfigError, RunConfig
from commlab.engine import procs
from commlab.workload_names import BUILTIN_NAMES as BUILTIN

# A guard against a hang, not an expected duration: the child imports torch, which has taken
# tens of seconds on a busy 2-core machine, then the person's module.
TIMEOUT_S = 90.0
MESSAGE_CHARS = 1500  # what a message quotes of the child's output


def check(cfg: RunConfig, timeout_s: float = TIMEOUT_S) -> RunConfig:
    """``cfg``, once its workload passed the check; raises ConfigError on ``workload``."""
    msg = error(cfg, timeout_s)
    if msg:
        raise ConfigError({"workload": msg})
    return cfg


def error(cfg: RunConfig, timeout_s: float = TIMEOUT_S) -> str | None:
    """Why the run's workload cannot train, or None; a user's workload is run in a child."""
    if cfg.workload in BUILTIN:
        return None
    said = _ask({"ask": "check", "spec": cfg.workload, "world_size": cfg.world_size,
                 "batch_size": cfg.batch_size, "seed": cfg.seed, "steps": cfg.steps,
                 "sharded": cfg.sharding != "ddp"}, timeout_s)
    return said if isinstance(said, str) else said["error"]


def shapes(spec: str, timeout_s: float = TIMEOUT_S) -> list[tuple[str, tuple[int, ...]]]:
    """The parameter shapes of a user's ``module:function`` model, built in a child (a resume's
    check); ValueError says why there are none."""
    return described(spec, timeout_s)[0]


def described(spec: str, timeout_s: float = TIMEOUT_S) -> tuple[list[tuple[str, tuple[int, ...]]], dict[str, str]]:
    """The shapes and the layouts (``analysis.rule.layouts``) of a user's model, built in a child
    (the Compression rule page and ``commlab rule --module``); ValueError says why there are none."""
    said = _ask({"ask": "shapes", "spec": spec}, timeout_s)
    if isinstance(said, str) or said["error"]:
        raise ValueError(said if isinstance(said, str) else said["error"])
    return [(name, tuple(shape)) for name, shape in said["shapes"]], said.get("layouts", {})


def _ask(job: dict, timeout_s: float) -> dict | str:
    """Run ``job`` in a child: its answer, or why it gave none (a message)."""
    with tempfile.TemporaryDirectory(prefix="commlab-probe-") as tmp:
        answer, log = Path(tmp) / "answer.json", Path(tmp) / "output.log"
        env = {**procs.package_env(), "OMP_NUM_THREADS": "1"}
        child = procs.spawn([sys.executable, "-m", __name__, str(answer), json.dumps(job)],
                            log=log, env=env)
        finished = procs.wait_until(lambda: child.poll() is not None, timeout_s)
        if not finished:  # not reaped yet, so the PID is still the child's: end it and its own
            procs.kill_tree(child.pid, grace_s=1)  # what the person's code left is in its tree
        code = child.wait()
        said = json.loads(answer.read_text()) if answer.exists() else None
        output = _tail(log)
    if said is not None:  # answered, even if the person's code then kept the process from ending
        return said
    what = f"checking workload {job['spec']!r}"
    if not finished:
        return (f"{what} did not finish within {timeout_s:g} s: importing the module, calling "
                f"the function or drawing its batches hangs{output}")
    if code < 0:
        return f"{what} killed its process with {signal.Signals(-code).name}{output}"
    return (f"{what} ended its process (exit code {code}) before the check was done: does the "
            f"module call sys.exit() or os._exit()?{output}")


def source_stamp(spec: str) -> tuple:
    """The files a ``module:function`` names and their modification times, found without
    importing anything: a cached answer is asked again once the person edits their module."""
    parts = spec.partition(":")[0].split(".")
    found = importlib.machinery.PathFinder.find_spec(parts[0], [os.getcwd(), *sys.path])
    if found is None:
        return ()
    top = Path(found.origin) if found.origin else None
    root = top.parent if top and top.name == "__init__.py" else top
    if root is None and found.submodule_search_locations:  # a namespace package
        root = Path(list(found.submodule_search_locations)[0])
    files = [top] if top else []
    if root is not None and len(parts) > 1:
        below = root.joinpath(*parts[1:])
        files += [below.with_suffix(".py"), below / "__init__.py"]
    return tuple((str(f), f.stat().st_mtime_ns) for f in files if f.is_file())


def _tail(log: Path) -> str:
    text = log.read_text(errors="replace").strip() if log.exists() else ""
    if not text:
        return ""
    cut = text if len(text) <= MESSAGE_CHARS else "..." + text[-MESSAGE_CHARS:]
    return f"; its output ended:\n{cut}"


def _main(answer: str, job: str) -> None:
    j = json.loads(job)
    if j["ask"] == "shapes":
        said = _shapes_here(j["spec"])
    else:
        from commlab.workloads import check as check_here

        said = {"error": check_here(j["spec"], rank=0, world_size=j["world_size"],
                                    batch_size=j["batch_size"], seed=j["seed"], steps=j["steps"],
                                    sharded=j["sharded"])}
    if said["error"] and len(said["error"]) > MESSAGE_CHARS:
        said["error"] = said["error"][:MESSAGE_CHARS] + "..."
    Path(answer).write_text(json.dumps(said))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # answered: threads the person's code started (or the batch count) keep nothing up


def _shapes_here(spec: str) -> dict:
    from commlab.analysis.rule import layouts, named_shapes
    from commlab.workloads import load

    try:
        model = load(spec).model
    except ValueError as e:
        return {"error": str(e), "shapes": []}
    return {"error": None, "shapes": named_shapes(model), "layouts": layouts(model)}


def _reaping(answer: str, job: str) -> None:
    """The check, in a child of this process, which adopts whatever the person's code leaves
    behind (a double fork, a session of its own, a clean environment) and ends it once the check
    has ended, however it ended; this process then ends as the check did."""
    procs.adopt_orphans()
    check = os.fork()
    if check == 0:
        _main(answer, job)  # never returns
    code = os.waitstatus_to_exitcode(os.waitpid(check, 0)[1])
    procs.end_adopted()
    procs.end_as(code)


if __name__ == "__main__":
    _reaping(*sys.argv[1:3])
