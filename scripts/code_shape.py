"""The package's shape: files and lines per subpackage, and the longest functions.

    .venv/bin/python scripts/code_shape.py [PACKAGE_DIR] [--top N]

Lines are physical lines of .py files; a function's length runs from its `def` to its
last line (nested functions count in their parent too).
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("package", nargs="?", default=str(Path(__file__).resolve().parents[1] / "quantlab"))
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args()
    root = Path(args.package)
    per_package: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    functions = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        package = rel.parts[0] if len(rel.parts) > 1 else "(top level)"
        text = path.read_text()
        per_package[package][0] += 1
        per_package[package][1] += len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{rel.as_posix()}:{node.name}"))
    print(f"{'package':<16}{'files':>6}{'lines':>8}")
    for package, (files, lines) in sorted(per_package.items()):
        print(f"{package:<16}{files:>6}{lines:>8}")
    total_files = sum(f for f, _ in per_package.values())
    total_lines = sum(n for _, n in per_package.values())
    print(f"{'total':<16}{total_files:>6}{total_lines:>8}")
    print(f"\nlongest {args.top} functions:")
    for length, name in sorted(functions, reverse=True)[: args.top]:
        print(f"{length:>5}  {name}")


if __name__ == "__main__":
    main()
