"""The structure figures issue 38 names, counted from the source (``python benchmarks/structure.py``).

- conditionals on the way of running outside the launchers: ``if``/``elif``/``x if c else y``
  whose test names a way of running (a pool, a node, Slurm, ``nnodes``), in ``commlab/``
  outside ``commlab/engine/launchers/``;
- files spelling run-state names: string literals equal to a run state's value (not as a key or
  a column's name);
- ``HookSpec``'s own fields (its optional records count one each);
- modules over 500 lines, functions over 60 lines (``commlab/``, ``pages/``, ``app.py``).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WAYS = {"pool", "node", "nodes", "slurm", "nnodes", "node_rank", "is_slurm", "warm"}
STATES = {"pending", "starting", "running", "orphaned", "finished", "failed", "diverged", "stopped", "stalled",
          "lost", "damaged"}


def sources() -> list[Path]:
    return sorted([*ROOT.glob("commlab/**/*.py"), *ROOT.glob("pages/*.py"), ROOT / "app.py",
                   ROOT / "lab_widgets.py"])


def _names(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def way_conditionals(path: Path, tree: ast.AST) -> int:
    if "engine/launchers" in path.as_posix():
        return 0
    return sum(1 for n in ast.walk(tree)
               if isinstance(n, ast.If | ast.IfExp | ast.While) and _names(n.test) & WAYS)


def state_literals(tree: ast.AST) -> int:
    """String literals that are a run state's word, less those that name a column or a key (a
    table's ``"finished"`` count, a row's ``"diverged"`` flag: the same words, not states)."""
    keys = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Dict):
            keys |= {id(k) for k in n.keys if k is not None}
        elif isinstance(n, ast.Subscript):
            keys |= {id(c) for c in ast.walk(n.slice)}
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and n.args:
            keys.add(id(n.args[0]))
        elif isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith("COLUMNS")
                                               for t in n.targets):
            keys |= {id(c) for c in ast.walk(n.value)}
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and n.value in STATES and id(n) not in keys)


def long_functions(tree: ast.AST, limit: int = 60) -> list[tuple[str, int]]:
    return [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno - n.lineno + 1 > limit]


def count() -> dict:
    conditionals, state_files, big, long = {}, {}, {}, []
    for path in sources():
        text = path.read_text()
        tree = ast.parse(text)
        rel = path.relative_to(ROOT).as_posix()
        if c := way_conditionals(path, tree):
            conditionals[rel] = c
        if s := state_literals(tree):
            state_files[rel] = s
        if (lines := len(text.splitlines())) > 500:
            big[rel] = lines
        long += [f"{rel}:{name} ({n} lines)" for name, n in long_functions(tree)]
    from commlab.hook_specs import HookSpec

    return {"way_conditionals_outside_launchers": sum(conditionals.values()),
            "way_conditionals_by_file": conditionals,
            "files_spelling_run_states": len(state_files), "run_state_literals": sum(state_files.values()),
            "run_state_literals_by_file": state_files,
            "hookspec_fields": len(dataclasses.fields(HookSpec)),
            "modules_over_500_lines": big, "functions_over_60_lines": long}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    c = count()
    if args.json:
        print(json.dumps(c, indent=1))
        return
    print(f"conditionals on the way of running outside the launchers: {c['way_conditionals_outside_launchers']} "
          f"in {len(c['way_conditionals_by_file'])} files")
    print(f"files spelling run-state names: {c['files_spelling_run_states']} ({c['run_state_literals']} literals)")
    print(f"HookSpec fields: {c['hookspec_fields']}")
    print(f"modules over 500 lines: {len(c['modules_over_500_lines'])} {c['modules_over_500_lines']}")
    print(f"functions over 60 lines: {len(c['functions_over_60_lines'])}")
    for f in c["functions_over_60_lines"]:
        print(f"  {f}")


if __name__ == "__main__":
    main()
