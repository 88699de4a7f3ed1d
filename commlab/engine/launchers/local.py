"""A run on this machine under a supervisor of its own (``commlab.engine.supervisor``): a cold
start, torchrun on loopback; what ``launch.start`` does when no other way is asked for."""
from __future__ import annotations

from commlab.engine.launchers.base import Launcher


class Local(Launcher):
    name = "local"
    fallback = True  # a run folder no other way owns is a local run's (every folder from before the ways)

    @classmethod
    def owns(cls, info: dict) -> bool:
        return True
