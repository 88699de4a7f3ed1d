"""Streamlit pieces every page shares: one error display, one run picker.

It lives beside ``app.py`` because ``commlab`` never imports Streamlit; ``streamlit run`` puts this
folder on ``sys.path`` (and the tests do the same for AppTest).
"""
from __future__ import annotations

import streamlit as st

from commlab.config import ConfigError


def show_errors(errors: ConfigError | dict[str, str], slots: dict | None = None) -> None:
    """Every problem, each under its field's name (in the field's own slot when the page has one)."""
    errors = errors.errors if isinstance(errors, ConfigError) else errors
    for name, msg in errors.items():
        target = (slots or {}).get(name)
        (target if target is not None else st).error(f"**{name}**: {msg}")
