"""The package's import graph in figures: modules, imports, cycles, and imports that point upward.

    python benchmarks/import_graph.py                  # the layers of pyproject.toml's contract
    python benchmarks/import_graph.py LAYERS.json      # or a {module prefix: height} map of your own

A cycle is a strongly connected group of two or more modules; an upward arrow is an import from a
module to one in a higher layer (siblings in one layer may import each other only where the
contract allows it; they are not counted here).  grimp (import-linter's graph library) builds the
graph, imports inside functions included.
"""
from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def contract_heights() -> dict[str, int]:
    """{module prefix: height} from the layers contract (top layer highest)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in cfg["contracts"] if c["type"] == "layers")
    heights = {}
    for height, layer in enumerate(reversed(layers)):
        for name in layer.replace(":", "|").split("|"):
            heights[name.strip()] = height
    return heights


def sccs(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    group.append(member)
                    if member == node:
                        break
                out.append(sorted(group))
    return out


def height(module: str, heights: dict[str, int]) -> int | None:
    best = max((p for p in heights if module == p or module.startswith(p + ".")), key=len, default=None)
    return None if best is None else heights[best]


def main(argv: list[str]) -> int:
    heights = json.loads(Path(argv[0]).read_text()) if argv else contract_heights()
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("commlab", include_external_packages=False)
    nodes = sorted(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in nodes}
    cycles = [g for g in sccs(nodes, edges) if len(g) > 1]
    up = [(a, b) for a in nodes for b in sorted(edges[a])
          if None not in (height(a, heights), height(b, heights)) and height(b, heights) > height(a, heights)]
    print(f"modules {len(nodes)}, imports {sum(map(len, edges.values()))}, cycles {len(cycles)} "
          f"({sum(map(len, cycles))} modules in them), upward arrows {len(up)}")
    for group in cycles:
        print("  cycle:", " ".join(group))
    for a, b in up:
        print(f"  upward: {a} -> {b}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
