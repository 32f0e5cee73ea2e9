"""The package's shape, checked: which modules may import the engines, which are pure,
that imports point one way and form no cycle, and that importing quantlab loads no
engine. The tables below are the ones docs/design.md shows; a new module must be placed
in them (or be pure)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "quantlab"

# the heavy libraries: seconds to import, GPU/CPU kernels, pinned to one environment
HEAVY = {"torch", "transformers", "llmcompressor", "lm_eval", "vllm", "compressed_tensors"}

# module -> the heavy libraries it may import (always inside functions, see the last test)
ENGINE_IMPORTS = {
    "quantlab.quantize.llmcompressor": {"torch", "transformers", "llmcompressor"},
    "quantlab.quantize.shims": {"torch", "llmcompressor"},
    "quantlab.quantize.dtype_speed": {"torch"},
    "quantlab.search.measure": {"torch", "transformers", "llmcompressor", "compressed_tensors"},
    "quantlab.models.default_model": {"torch", "transformers"},
    "quantlab.models.tokenizer": {"transformers"},
    "quantlab.quality.lmeval": {"lm_eval"},
    "quantlab.serving.vllm_probe": {"torch", "vllm"},  # run by the serving environment's Python
    "quantlab.serving.cpu_emulation.sitecustomize": {"torch"},  # ditto, at its start
}
# adapters that drive an engine without importing one: processes, HTTP, the model hub
ADAPTERS = {
    "quantlab.models.source", "quantlab.serving.vllm_server", "quantlab.serving.vllm_facts",
    "quantlab.serving.pool", "quantlab.quality.kl", "quantlab.performance.loadgen",
    "quantlab.performance.prompts", "quantlab.performance.monitor", "quantlab.performance.stream_stub",
    "quantlab.stability.probe", "quantlab.performance.placement",
}
ORCHESTRATION = {"quantlab.serving.session": 2, "quantlab.pipeline.context": 2, "quantlab.pipeline.loop": 4,
                 "quantlab.pipeline.candidates.run": 4, "quantlab.pipeline.candidates.shared_performance": 4,
                 "quantlab.pipeline.search": 4, "quantlab.cli": 5, "quantlab.__main__": 5}
# not imported as a library: run by the serving environment's Python, or `python -m quantlab`
SCRIPTS = {"quantlab.serving.cpu_emulation.sitecustomize", "quantlab.__main__"}


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def rank(module: str) -> int:
    """0 pure, 1 engine adapter, 2 run context, 3 stage, 4 pipeline, 5 CLI: a module
    imports only modules of its own rank or below."""
    if module in ORCHESTRATION:
        return ORCHESTRATION[module]
    if module.endswith(".stage") or module.endswith("_stage"):
        return 3
    if module in ENGINE_IMPORTS or module in ADAPTERS:
        return 1
    return 0


@cache
def imports(module: str) -> tuple[tuple[str, bool], ...]:
    """(imported name, at module level?) for every import in the module, lazy ones too."""
    tree = ast.parse(MODULES[module].read_text())
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):  # imports under a module-level `if`/`try` are module level too
        if isinstance(node, (ast.If, ast.Try)) and id(node) in top:
            top |= {id(n) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:  # `from quantlab.x import y`: y may be a module
                sub = f"{node.module}.{a.name}"
                out.append((sub if sub in MODULES else node.module, id(node) in top))
    return tuple(out)


def internal(module: str, *, lazy: bool = True) -> set[str]:
    return {name for name, at_top in imports(module) if name in MODULES and name != module and (lazy or at_top)}


def heavy(module: str) -> set[str]:
    return {name.split(".")[0] for name, _ in imports(module)} & HEAVY


def test_every_module_is_parsed():
    assert len(MODULES) > 40 and all(m.startswith("quantlab") for m in MODULES)
    for table in (ENGINE_IMPORTS, ADAPTERS, ORCHESTRATION):
        assert set(table) <= set(MODULES), f"the tables name modules that no longer exist: {set(table) - set(MODULES)}"


def test_heavy_libraries_are_imported_only_where_the_design_says():
    wrong = {m: sorted(heavy(m) - ENGINE_IMPORTS.get(m, set())) for m in MODULES}
    assert not {m: libs for m, libs in wrong.items() if libs}, \
        "heavy imports outside their engine modules (move them into one, or name the module in ENGINE_IMPORTS " \
        "and docs/design.md)"


def test_pure_modules_reach_no_engine_even_lazily():
    problems = {}
    for module in MODULES:
        if rank(module) != 0:
            continue
        seen, todo = set(), [module]
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            todo += internal(m)
        reached = sorted(m for m in seen if rank(m) > 0) + sorted({lib for m in seen for lib in heavy(m)})
        if reached:
            problems[module] = reached
    assert not problems, f"pure modules that reach an engine, a stage or a heavy library: {problems}"


def test_no_module_imports_upward():
    upward = [f"{m} (rank {rank(m)}) imports {i} (rank {rank(i)})"
              for m in MODULES for i in internal(m) if rank(i) > rank(m)]
    assert not upward, upward


def test_module_level_imports_form_no_cycle():
    graph = {m: internal(m, lazy=False) for m in MODULES}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path + [m, n]
            if n not in state and (cycle := visit(n, path + [m])):
                return cycle
        state[m] = 2
        return None

    for m in MODULES:
        if m not in state:
            cycle = visit(m, [])
            assert cycle is None, " -> ".join(cycle)


def test_rank_check_would_catch_an_upward_import():
    """The checks above are only as good as the graph: it sees lazy imports, aliases and
    `from package import module`."""
    assert "quantlab.quality.lmeval" in internal("quantlab.quality.stage")  # lazy, inside a function
    assert "quantlab.quality.gates" in internal("quantlab.quality.stage", lazy=False)  # `from .. import gates as`
    assert rank("quantlab.pipeline.loop") > rank("quantlab.release.stage") > rank("quantlab.serving.pool") \
        > rank("quantlab.quality.stats")
    assert heavy("quantlab.quality.lmeval") == {"lm_eval"}


def test_importing_every_module_loads_no_heavy_library():
    """The CLI starts instantly and pure code runs anywhere: engine modules import their
    libraries inside functions."""
    names = sorted(set(MODULES) - SCRIPTS)
    code = ("import importlib, json, sys\n"
            f"for m in {names!r}: importlib.import_module(m)\n"
            f"print(json.dumps(sorted(set({sorted(HEAVY)!r}) & set(sys.modules))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("module", sorted(ENGINE_IMPORTS))
def test_engine_modules_import_heavy_libraries_inside_functions(module):
    if module in SCRIPTS:
        pytest.skip("runs in the serving environment at its start; quantlab never imports it")
    top = {name.split(".")[0] for name, at_top in imports(module) if at_top} & HEAVY
    assert not top, f"{module} imports {sorted(top)} at module level"
