"""The json and toml exports: config files that load back to the same ``RunConfig``."""
from __future__ import annotations

import json

from commlab.config import RunConfig
from commlab.tune.export.target import LAB_ONLY


def config_dict(cfg: RunConfig) -> dict:
    """The settings a config file carries: all but the lab's own (``LAB_ONLY``)."""
    return {k: v for k, v in cfg.to_dict().items() if k not in LAB_ONLY}


def to_json(cfg: RunConfig) -> str:
    return json.dumps(config_dict(cfg), indent=2) + "\n"


def to_toml(cfg: RunConfig) -> str:
    import tomli_w

    return tomli_w.dumps(config_dict(cfg))
