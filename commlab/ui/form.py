"""The Launch form without Streamlit: which widget each setting gets (from the settings table),
form values become a checked RunConfig with one message per field, a preview says what this
machine would run, and a launch is idempotent across browser tabs."""
from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commlab.config import GROUPS, RunConfig, Setting, applies, settings
from commlab.engine import claims, workload_probe
from commlab.engine import launch as engine
from commlab.engine.launchers.choice import chosen
from commlab.hook_specs import POWERSGD_SETTINGS
from commlab.workload_names import BUILTIN_NAMES as BUILTIN
from commlab.workload_names import DESCRIPTIONS

# The Launch form's four columns, each a stack of the table's groups.
COLUMNS = (("hook", "job", "sharding"), ("powersgd", "localsgd", "compressors", "diloco"), ("workload",), ("instrument",))
# The workload picker: one of the built-ins, or a person's own module:function.
WORKLOAD_KINDS = ("built-in", "my module:function")


@dataclass(frozen=True)
class Widget:
    """One setting's widget: a page draws it and hands what it returns, under ``name``, to
    ``config_from_form``."""

    name: str
    element: str  # selectbox, multiselect, checkbox, number_input or text_input
    label: str
    key: str
    kwargs: dict[str, Any]

    def draw(self, where) -> Any:
        """``where.<element>(label, key=key, **kwargs)``: where is ``st``, a column or a container."""
        return getattr(where, self.element)(self.label, key=self.key, **self.kwargs)


def form_settings(group: str, values: dict | None = None) -> list[Setting]:
    """The settings the Launch form shows in a group, in the table's order: with the hook chosen
    (``values["hook"]``), only those that apply to it (``shown``)."""
    return [s for s in settings() if s.form and s.group == group and shown(s, values or {})]


def shown(s: Setting, values: dict) -> bool:
    """Whether the form shows ``s`` with the values chosen so far: before the hook is chosen,
    every setting; after, those that apply to it (``config.applies``): allreduce shows no
    PowerSGD, local SGD or compressor settings, PowerSGD only its own."""
    return "hook" not in values or applies(s, values["hook"])


def heading(group: str) -> str:
    """A group's heading on the form, in markdown."""
    return f"**{GROUPS[group]}**"


def widget(s: Setting, value: Any = None, prefix: str = "f_",
           titled: bool = False, own_workload: bool = False) -> Widget:
    """The widget for one setting, showing ``value`` (default: the setting's default).  ``prefix``
    starts its key; ``titled`` capitalizes its label, for pages that label in sentence case;
    ``own_workload`` asks for the module:function box."""
    value = s.default if value is None else value
    kw: dict[str, Any] = {"help": help_text(s)}
    label, key = readable_label(s), prefix + s.name
    if s.name == "workload":
        if own_workload:
            return Widget(s.name, "text_input", "module:function", key + "_own",
                          {**kw, "placeholder": "mymodel:make"})
        names = list(BUILTIN)
        # The options are the short names (a column is narrow); the help describes each.
        described = "\n".join(f"- **{k}**: {DESCRIPTIONS[k]}" for k in names)
        return Widget(s.name, "selectbox", _title("built-in workload", titled), key + "_builtin",
                      {**kw, "help": f"{kw['help']}\n\n{described}", "options": names,
                       "index": names.index(value) if value in names else 0})
    if s.choices:
        element = "selectbox"
        kw |= {"options": s.choices, "index": s.choices.index(value)}
    elif s.kind == "bool":
        element = "checkbox"
        kw["value"] = value
    elif s.kind in ("int", "float"):
        # No min_value: the package's messages, not the browser's clamping, say what is wrong.
        element = "number_input"
        kw |= {"value": value, "step": 1 if s.kind == "int" else None,
               "format": None if s.kind == "int" else "%g"}
    else:
        element = "text_input"
        kw["value"] = ",".join(map(str, value)) if isinstance(value, list) else value
    return Widget(s.name, element, _title(label, titled), key, kw)


# A setting's name ends in its unit: the label says it in words.
UNIT_SUFFIXES = {"_s": "s", "_us": "µs", "_gbps": "Gb/s", "_mb": "MiB"}


def readable_label(s: Setting) -> str:
    """A label that wraps between words: the table's own label, or the setting's name with
    spaces for underscores and its unit in brackets (``stall_timeout_s``: "stall timeout (s)").
    The name itself, PyTorch's spelling where PyTorch has one, is in the help (``help_text``)."""
    label = s.label
    if label == s.name:
        unit = next((u for suffix, u in UNIT_SUFFIXES.items() if label.endswith(suffix)), None)
        if unit:
            label = label[:label.rindex("_")] + f" ({unit})"
    head, _, tail = label.partition(" (")
    return head.replace("_", " ") + (f" ({tail}" if tail else "")


def help_text(s: Setting) -> str:
    """The table's help, then the setting's exact name: PowerSGDState's argument for PowerSGD's."""
    whose = "PowerSGDState's argument" if s.name in POWERSGD_SETTINGS else "Setting"
    return f"{s.help}\n\n{whose} `{s.name}` (CLI `{s.flag}`)."


def axis_widget(s: Setting, base: RunConfig, prefix: str = "sweep_") -> Widget:
    """A sweep axis' widget: several of its choices, or comma-separated values; it shows the
    table's sweep values, else base's one."""
    shown = list(s.sweep) or [getattr(base, s.name)]
    kw = {"help": help_text(s)}
    label = _title(readable_label(s), True)
    if s.choices:
        return Widget(s.name, "multiselect", label, prefix + s.name,
                      {**kw, "options": s.choices, "default": shown})
    return Widget(s.name, "text_input", f"{label} (comma-separated)", prefix + s.name,
                  {**kw, "value": ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in shown)})


def _title(label: str, titled: bool) -> str:
    # PyTorch's own names (start_powerSGD_iter) keep their spelling.
    if not titled or "_" in label.split()[0]:
        return label
    return label[:1].upper() + label[1:]


def config_from_form(values: dict) -> tuple[RunConfig | None, dict[str, str]]:
    """(config, errors by field): the config is None when a value has the wrong type.  A user's
    workload is checked in a child process (``commlab.engine.workload_probe``), never in the
    server; its answer is kept until the person edits their module or the settings it reads."""
    cfg, errors = RunConfig.checked(values, "the form")  # every bad field at once
    if cfg is not None and not errors:
        msg = _probed(cfg)
        if msg:
            errors["workload"] = msg
    return cfg, errors


_PROBED: dict[tuple, str | None] = {}  # what the child said, by what it was asked
PROBED_KEPT = 32


def _probed(cfg: RunConfig) -> str | None:
    if cfg.workload in BUILTIN:
        return None
    key = (cfg.workload, cfg.world_size, cfg.batch_size, cfg.seed, cfg.steps, os.getcwd(),
           workload_probe.source_stamp(cfg.workload))
    if key not in _PROBED:
        if len(_PROBED) >= PROBED_KEPT:
            _PROBED.pop(next(iter(_PROBED)))
        _PROBED[key] = workload_probe.error(cfg)
    return _PROBED[key]


def preview(cfg: RunConfig) -> dict:
    """Before launch: the backend and hook implementation this machine would use, and why."""
    from commlab.engine.launch import resolve_backend
    from commlab.hooks import registry

    backend, backend_reason = resolve_backend(cfg)
    impl, reason = registry.plan(cfg, backend)
    return {"backend": backend, "backend_reason": backend_reason, "hook_impl": impl,
            "hook_reason": reason, "warning": registry.stock_warning(cfg, backend)}


def new_draft() -> str:
    return secrets.token_hex(4)


def request_id(cfg: RunConfig, draft: str) -> str:
    """Stable for one submission of one form: the same settings from the same draft."""
    digest = hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode()).hexdigest()
    return f"{draft}-{digest[:12]}"


def launch(cfg: RunConfig, request_id: str | None = None, slurm=None) -> tuple[engine.Run, bool]:
    """Start a run, or return the one already going with exactly these settings; ``slurm``: as a
    Slurm job (``commlab.engine.launchers.slurm.SlurmJob``).

    Returns (run, started).  Browser tabs are separate sessions that share nothing but the runs
    folder, so the check and the start happen under a lock file there: two tabs that submit the
    same settings at once get one run.
    """
    with claims.locked(Path(cfg.runs_dir) / claims.LAUNCH_LOCK):
        for run in engine.list_runs(cfg.runs_dir):
            if run.is_running() and run.config_dict() == cfg.to_dict():
                return run, False
        return engine.start(cfg, chosen(slurm=slurm, cfg=cfg), request_id), True
