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
HEAVY = {"torch", "transformers", "llmcompressor", "lm_eval", "vllm", "compressed_tensors", "ray"}

# module -> the heavy libraries it may import (always inside functions, see the last test)
ENGINE_IMPORTS = {
    "quantlab.quantize.llmcompressor": {"torch", "transformers", "llmcompressor", "compressed_tensors"},
    "quantlab.quantize.shims": {"torch", "llmcompressor"},
    "quantlab.quantize.engine_output": {"llmcompressor"},
    "quantlab.quantize.distributed": {"torch"},  # the preflight counts the accelerators
    "quantlab.quantize.distributed_rank": {"torch", "compressed_tensors"},  # one torchrun rank
    "quantlab.executors.ray_cluster": {"ray"},  # only when --ray is given
    "quantlab.executors.ray_driver": {"ray"},
    "quantlab.executors.ray_node": {"ray"},  # a candidate's task, on its node
    "quantlab.quantize.dtype_speed": {"torch"},
    "quantlab.search.measure": {"torch", "transformers", "llmcompressor", "compressed_tensors"},
    "quantlab.models.default_model": {"torch", "transformers"},
    "quantlab.models.tokenizer": {"transformers"},
    "quantlab.quality.lmeval": {"lm_eval"},
    "quantlab.quality.lmeval_rolling": {"lm_eval"},  # in the lm-eval child, beside lmeval
    "quantlab.serving.vllm_probe": {"torch", "vllm"},  # run by the serving environment's Python
    "quantlab.serving.cpu_emulation.sitecustomize": {"torch"},  # ditto, at its start
}
# adapters that drive an engine without importing one: processes, HTTP, the model hub
ADAPTERS = {
    "quantlab.models.source", "quantlab.serving.vllm_server", "quantlab.serving.vllm_facts",
    "quantlab.serving.pool", "quantlab.quality.kl", "quantlab.performance.loadgen",
    "quantlab.performance.prompts", "quantlab.performance.monitor", "quantlab.performance.stream_stub",
    "quantlab.stability.probe", "quantlab.performance.placement", "quantlab.load_quality.shaper",
    "quantlab.performance.server_history",
}
# modules a stage calls for its own work (they reach engine adapters as the stage does)
STAGE_HELPERS = {"quantlab.quality.work", "quantlab.quality.gate_plan", "quantlab.quality.kl_run",
                 "quantlab.quality.pairing", "quantlab.quality.judging", "quantlab.performance.result", "quantlab.performance.noise_store",
                 "quantlab.performance.measure_loop",
                 "quantlab.stability.probe_run",
                 "quantlab.load_quality.evaluate", "quantlab.load_quality.work", "quantlab.load_quality.judge",
                 "quantlab.release.registration",
                 # the release's SBOMs and vulnerability audit: external tools as subprocesses, the serving Python
                 "quantlab.release.environments", "quantlab.release.vulnerabilities"}
# the engine half of a run (2); the orchestration: every module of quantlab.pipeline and
# quantlab.executors (4), the commands of `quantlab sensitivity` (4); the CLI (5)
ORCHESTRATION = {"quantlab.serving.session": 2, "quantlab.search.sensitivity": 4, "quantlab.__main__": 5}
# not imported as a library: run by the serving environment's Python, or `python -m quantlab`
SCRIPTS = {"quantlab.serving.cpu_emulation.sitecustomize", "quantlab.__main__"}


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# quantlab/shipped/ is data (an eval suite's lm-eval helpers among it), not quantlab's modules
MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "shipped" not in p.relative_to(PACKAGE).parts}


def rank(module: str) -> int:
    """0 pure, 1 engine adapter, 2 run context, 3 stage, 4 pipeline, 5 CLI: a module
    imports only modules of its own rank or below."""
    if module in ORCHESTRATION:
        return ORCHESTRATION[module]
    if module == "quantlab.cli" or module.startswith("quantlab.cli."):
        return 5
    if package(module) in ("pipeline", "executors"):
        return 4
    if module.endswith(".stage") or module.endswith("_stage") or module in STAGE_HELPERS:
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
    for table in (ENGINE_IMPORTS, ADAPTERS, ORCHESTRATION, STAGE_HELPERS):
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


# ---------------------------------------------------------------- packages: the house

# The floors, bottom to top: the pipeline's order. A package imports only packages on
# its own floor or below, counted over every import (lazy ones and TYPE_CHECKING too).
FLOORS = {
    "core": 0,  # errors, files, progress, results, verdicts, the run record, the stage contract
    "recipe": 1,  # the recipe file and every section's schema
    "models": 2,  # where the baseline's weights come from
    "quantize": 3,  # calibrate, quantize, export (llm-compressor); a checkpoint's own config
    "serving": 4,  # plan, start and watch the engines (vLLM); the engine half of a run
    "quality": 5, "performance": 5, "stability": 5, "load_quality": 5,  # the checks
    "targets": 6,  # the checks again on other serve targets (with stability's probes)
    "release": 7,  # the decision, the error budget, the signed manifest
    "reports": 8,  # report files and plots, drawn from the records
    "search": 9,  # per-layer sensitivity and the search's state
    "pipeline": 10,  # the orchestration: the run loop, the commands, several candidates, search rounds
    "executors": 11,  # where a comparison's members run: here, or as Ray tasks (pipeline/executor.py's contract)
    "cli": 12,
    "__main__": 13, "quantlab": 13,  # `python -m quantlab`; the package's face (its version)
}
# Package pairs allowed to import each other both ways, each with why (at most 4). None is
# needed today: a pair that appears is a package split in the wrong place.
TWO_WAY_ALLOWED: dict[frozenset[str], str] = {}
MAX_TWO_WAY = 4
MAX_LINES = 400


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "quantlab"


@cache
def package_edges() -> frozenset[tuple[str, str]]:
    return frozenset((package(m), package(i)) for m in MODULES for i in internal(m) if package(m) != package(i))


def test_every_package_has_a_floor():
    assert {package(m) for m in MODULES} == set(FLOORS), "place each top-level package in FLOORS (and design.md)"


def test_no_package_imports_a_floor_above_it():
    up = sorted(f"{a} (floor {FLOORS[a]}) imports {b} (floor {FLOORS[b]}): "
                + ", ".join(sorted(f"{m} -> {i}" for m in MODULES if package(m) == a for i in internal(m)
                                   if package(i) == b))
                for a, b in package_edges() if FLOORS[b] > FLOORS[a])
    assert not up, up


def test_the_floor_imports_nothing_above_it():
    assert not {b for a, b in package_edges() if a == "core"}


def test_few_package_pairs_import_each_other_both_ways():
    pairs = {frozenset((a, b)) for a, b in package_edges() if (b, a) in package_edges()}
    assert len(pairs) <= MAX_TWO_WAY and pairs <= set(TWO_WAY_ALLOWED), sorted(map(sorted, pairs))


def test_no_private_name_is_imported_across_modules():
    """`from x import _y` reaches into another module's insides: make `_y` public where it is
    shared, or keep it where it is used."""
    found = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("quantlab"):
                found += [f"{module}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")
                          and f"{node.module}.{a.name}" not in MODULES]
    assert not found, found


def test_no_module_is_over_400_lines():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by what they do: {long}"


def test_quantlab_names_are_not_imported_by_strings():
    """The graph above is only true if every import is a statement it can see."""
    hits = [f"{m}: {ast.unparse(n)[:80]}" for m, p in MODULES.items() for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, ast.Call) and ast.unparse(n.func) in ("importlib.import_module", "import_module",
                                                                    "__import__")
            and any(isinstance(a, ast.Constant) and str(a.value).startswith("quantlab") for a in n.args)]
    assert not hits, hits


def test_no_two_modules_import_each_other_even_lazily():
    both = sorted({tuple(sorted((m, i))) for m in MODULES for i in internal(m) if m in internal(i)})
    assert not both, both


def test_the_floor_check_would_catch_an_arrow_up():
    """The package graph sees lazy imports and `from package import module`."""
    assert ("quality", "serving") in package_edges()  # quality.stage: `from quantlab.serving import stage as`
    assert ("pipeline", "search") in package_edges()  # pipeline.search imports search.state at module level
    assert FLOORS["core"] < FLOORS["recipe"] < FLOORS["serving"] < FLOORS["quality"] < FLOORS["release"] \
        < FLOORS["reports"] < FLOORS["pipeline"] < FLOORS["cli"]


def test_every_name_imported_from_quantlab_exists():
    """Lazy imports run only when their function does: a name moved to another module must
    not leave a `from old import name` behind in a function no test reaches."""
    wanted = sorted({(node.module, a.name) for m, p in MODULES.items() if m not in SCRIPTS
                     for node in ast.walk(ast.parse(p.read_text()))
                     if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "") in MODULES
                     for a in node.names if f"{node.module}.{a.name}" not in MODULES})
    code = ("import importlib, json\n"
            f"wanted = {wanted!r}\n"
            "print(json.dumps([f'{m}: {n}' for m, n in wanted if not hasattr(importlib.import_module(m), n)]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
