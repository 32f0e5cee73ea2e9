"""The house's figures, as tests/unit/test_import_graph.py counts them: package pairs that
import each other both ways, packages core/ imports, modules over 400 lines, private
names imported across modules, README lines. Every import is counted (lazy ones and
TYPE_CHECKING too); nodes are the top-level packages of quantlab/ plus the CLI.

    python scripts/house_figures.py [--json]
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "quantlab"
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def figures() -> dict:
    modules = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))
               if "shipped" not in p.relative_to(PACKAGE).parts}

    def node(m: str) -> str:
        return m.split(".")[1] if "." in m else "quantlab"

    edges: dict[str, set[str]] = defaultdict(set)
    private = []
    for m, path in modules.items():
        for n in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").startswith("quantlab"):
                for a in n.names:
                    sub = f"{n.module}.{a.name}"
                    targets.append(sub if sub in modules else n.module)
                    if a.name.startswith("_") and not a.name.startswith("__") and sub not in modules:
                        private.append(f"{m}: from {n.module} import {a.name}")
            elif isinstance(n, ast.Import):
                targets = [a.name for a in n.names if a.name.startswith("quantlab")]
            for t in targets:
                if t in modules and node(t) != node(m):
                    edges[node(m)].add(node(t))
    pairs = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges.get(b, ())})
    long = {m: n for m, p in modules.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    return {"modules": len(modules), "lines": sum(len(p.read_text().splitlines()) for p in modules.values()),
            "two_way_pairs": pairs, "core_imports": sorted(edges.get("core", ())),
            "arrows": sum(len(v) for v in edges.values()), "modules_over_400_lines": long,
            "private_imports": private, "readme_lines": len((REPO / "README.md").read_text().splitlines())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    f = figures()
    if ap.parse_args().json:
        print(json.dumps(f, indent=1))
        return
    print(f"modules {f['modules']}, {f['lines']} lines; package arrows {f['arrows']}")
    print(f"two-way package pairs: {len(f['two_way_pairs'])} {f['two_way_pairs']}")
    print(f"packages core/ imports: {len(f['core_imports'])} {f['core_imports']}")
    print(f"modules over {MAX_LINES} lines: {len(f['modules_over_400_lines'])} {f['modules_over_400_lines']}")
    print(f"private names imported across modules: {len(f['private_imports'])}")
    print(f"README lines: {f['readme_lines']}")


if __name__ == "__main__":
    main()
