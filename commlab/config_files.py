"""A configuration's file: JSON or TOML (by its suffix), read into the settings it holds, every
failure to read or parse one said as a ``ConfigError`` on "file".  ``RunConfig.load`` and
``RunConfig.from_json``/``from_toml`` then check the settings themselves."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from commlab import files
from commlab.config_fields import ConfigError

# Why a settings file nested thousands deep does not parse (Python's parsers recurse per level;
# settings are one level of keys).
NESTED = "nested deeper than the parser goes (settings are one level of keys)"


def is_toml(path: Path) -> bool:
    return path.suffix.lower() == ".toml"


def json_settings(text: str, source: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError({"file": f"{source} does not parse: {e.msg} at line {e.lineno}, "
                                   f"column {e.colno}"}) from None
    except ValueError as e:  # an integer of more digits than Python reads
        raise ConfigError({"file": f"{source} does not parse: {e}"}) from None
    except RecursionError:
        raise ConfigError({"file": f"{source} does not parse: {NESTED}"}) from None
    if not isinstance(data, dict):
        raise ConfigError({"file": f"{source} must hold one object of settings, "
                                   f"not {type(data).__name__}"})
    return data


def toml_settings(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except ValueError as e:  # TOMLDecodeError, or an integer of more digits than Python reads
        raise ConfigError({"file": f"{source} does not parse: {e}"}) from None
    except RecursionError:
        raise ConfigError({"file": f"{source} does not parse: {NESTED}"}) from None


def file_text(path: Path) -> str:
    try:
        return files.read_regular(path, files.JSON_BYTES).decode("utf-8")
    except files.Refused as e:  # a FIFO would block the command, /dev/zero fill its memory
        raise ConfigError({"file": f"cannot read {path}: {e}"}) from None
    except OSError as e:
        raise ConfigError({"file": f"cannot read {path}: {e.strerror}"}) from None
    except UnicodeDecodeError as e:
        raise ConfigError({"file": f"{path} is not UTF-8 text: byte {e.object[e.start]:#04x} at "
                                   f"offset {e.start} (JSON and TOML files are UTF-8)"}) from None


def toml_text(data: dict[str, Any]) -> str:
    import tomli_w

    return tomli_w.dumps(data)
