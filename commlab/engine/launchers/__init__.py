"""The ways of running a run, one module each (``local``, ``warm``, ``nodes``, ``slurm``), every one a
``Launcher`` (``base``).  A module added here that defines one is a new way: ``of`` finds it from a
run folder's launch.json, with no list of the ways to extend (``tests/test_new_launcher.py``)."""
from __future__ import annotations

import importlib
import pkgutil

from commlab.engine.launchers.base import Launcher


def kinds() -> list[type[Launcher]]:
    """Every way of running: the Launcher each module of this package defines, the fallback last."""
    found = []
    for module in pkgutil.iter_modules(__path__):
        ns = vars(importlib.import_module(f"{__name__}.{module.name}"))
        found += [v for v in ns.values() if isinstance(v, type) and issubclass(v, Launcher)
                  and v is not Launcher and v.__module__ == ns["__name__"]]
    return sorted(found, key=lambda k: getattr(k, "fallback", False))


def of(info: dict) -> Launcher:
    """The way a run was started, from its launch.json (``info``)."""
    return next(k for k in kinds() if k.owns(info)).of_record(info)

