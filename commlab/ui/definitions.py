"""The compressors' definitions as people read them: one hook's for the Launch and Compare pages, all
of them as the table of docs/hooks.md and ``commlab hooks``.  The words are the hook table's
(``HookSpec.definition``, written in ``commlab.hook_definitions``); this module only lays them out."""
from __future__ import annotations

import textwrap

from commlab.hook_specs import SPECS

# A definition's parts, in the order they are read, with their headings.
PARTS = (("sends", "What it sends"), ("paper", "Against its paper"), ("grace", "Against GRACE"),
         ("choice", "The lab's choice"))
TABLE_HEAD = ("compressor", "definition", "paper", "GRACE", "the lab's choice and why")


def defined() -> tuple[str, ...]:
    """The hooks with a definition, in the table's order."""
    return tuple(h for h, s in SPECS.items() if s.definition is not None)


def explain(hook: str) -> str | None:
    """``hook``'s definition in markdown, a paragraph per part; None for a hook without one."""
    spec = SPECS.get(hook)
    if spec is None or spec.definition is None:
        return None
    return "\n\n".join(f"**{title}.** {getattr(spec.definition, part)}" for part, title in PARTS)


def plain(hook: str, width: int = 100) -> str:
    """``hook``'s definition for a terminal: its name, then each part wrapped and indented."""
    d = SPECS[hook].definition
    return "\n".join([hook, *(textwrap.fill(f"{title}: {getattr(d, part)}", width, initial_indent="  ",
                                            subsequent_indent="    ") for part, title in PARTS)])


def table() -> str:
    """Every definition as one markdown table (docs/hooks.md holds it as printed here)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = [f"| {' | '.join(TABLE_HEAD)} |", f"|{'---|' * len(TABLE_HEAD)}"]
    for hook in defined():
        d = SPECS[hook].definition
        rows.append(f"| {' | '.join(cell(t) for t in (hook, d.sends, d.paper, d.grace, d.choice))} |")
    return "\n".join(rows)
