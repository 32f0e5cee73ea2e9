"""Preflight: cheap checks of a recipe against a model's layout, before any heavy work.

Pure functions over a `ModelLayout` (module names, class names, linear widths), which
the quantize stage builds from the model's config on the meta device without loading
weights. Every failure names the layers involved and says what would work.
"""

from __future__ import annotations

import difflib
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field

from quantlab.core.errors import RecipeError
from quantlab.recipe.file import Recipe

CANDIDATE_GROUP_SIZES = (32, 64, 128, 256)


@dataclass(frozen=True)
class ModuleInfo:
    name: str
    classes: tuple[str, ...]  # the class and its bases (MRO names), as compressed-tensors matches
    in_features: int | None = None
    out_features: int | None = None


@dataclass
class ModelLayout:
    architecture: str
    modules: list[ModuleInfo]
    max_position_embeddings: int | None = None
    extra: dict = field(default_factory=dict)


def matches(module: ModuleInfo, pattern: str) -> bool:
    """Same rule as compressed-tensors: exact name, 're:' regex (re.match) on the name,
    or a class name anywhere in the module's MRO."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module.name) is not None
    return pattern == module.name or pattern in module.classes


def quantized_modules(recipe: Recipe, layout: ModelLayout) -> list[ModuleInfo]:
    q = recipe.quantization
    return [
        m for m in layout.modules
        if m.name and any(matches(m, t) for t in q.targets) and not any(matches(m, i) for i in q.ignore)
    ]


def _compress_names(names: list[str], limit: int = 6) -> str:
    """'model.layers.0.mlp.down_proj', ... -> 'model.layers.*.mlp.down_proj (30 layers)'."""
    groups: dict[str, int] = defaultdict(int)
    for n in names:
        groups[re.sub(r"\.\d+\.", ".*.", n)] += 1
    parts = [f"{k} (x{v})" if v > 1 else k for k, v in groups.items()]
    more = f", ... {len(parts) - limit} more" if len(parts) > limit else ""
    return ", ".join(parts[:limit]) + more


def check_patterns(recipe: Recipe, layout: ModelLayout) -> list[str]:
    problems = []
    q = recipe.quantization
    names = [m.name for m in layout.modules if m.name]
    for kind, patterns in (("targets", q.targets), ("ignore", q.ignore)):
        for i, pat in enumerate(patterns):
            if pat.startswith("re:"):
                try:
                    re.compile(pat[3:])
                except re.error as err:
                    problems.append(f"quantization.{kind}.{i}: '{pat}' is not a valid regex ({err})")
                    continue
            if not any(matches(m, pat) for m in layout.modules):
                close = difflib.get_close_matches(pat, names, n=3, cutoff=0.6)
                hint = f" Close names: {close}." if close else ""
                problems.append(
                    f"quantization.{kind}.{i}: '{pat}' matches no module of {layout.architecture}.{hint} "
                    "Use an exact module name, a class name such as 'Linear', or 're:<regex>'"
                )
    return problems


def working_group_sizes(widths: set[int]) -> list[int]:
    g = math.gcd(*widths) if widths else 0
    return [c for c in CANDIDATE_GROUP_SIZES if g and g % c == 0]


def check_group_size(recipe: Recipe, layout: ModelLayout, targeted: list[ModuleInfo]) -> list[str]:
    gs = recipe.quantization.group_size
    if gs is None:
        return []
    bad = [m for m in targeted if m.in_features is not None and m.in_features % gs]
    if not bad:
        return []
    widths = {m.in_features for m in targeted if m.in_features is not None}
    by_width: dict[int, list[str]] = defaultdict(list)
    for m in bad:
        by_width[m.in_features].append(m.name)
    detail = "; ".join(f"input width {w}: {_compress_names(ns)}" for w, ns in sorted(by_width.items()))
    ok = working_group_sizes(widths)
    fix = (f"group sizes that divide every targeted layer: {ok}" if ok
           else "no power-of-two group size fits every layer; use group_size: null (per channel)")
    return [
        f"quantization.group_size: {gs} does not divide the input width of {len(bad)} targeted "
        f"layer(s) of {layout.architecture} ({detail}). Fix: {fix}, or add those layers to "
        "'ignore'"
    ]


def check_sequence_length(recipe: Recipe, layout: ModelLayout) -> list[str]:
    cal = recipe.calibration
    limit = layout.max_position_embeddings
    if cal is not None and limit and cal.max_seq_length > limit:
        return [
            f"calibration.max_seq_length: {cal.max_seq_length} is above the model's "
            f"max_position_embeddings ({limit}); use at most {limit}"
        ]
    return []


def check_method_support(recipe: Recipe, layout: ModelLayout) -> list[str]:
    """Method-level support that depends on the architecture (from the layout's extra facts)."""
    q = recipe.quantization
    problems = []
    if q.method == "awq":
        known = layout.extra.get("awq_architectures")
        if known is not None and layout.architecture not in known:
            problems.append(
                f"quantization.method: llm-compressor has no AWQ layer mappings for "
                f"{layout.architecture}; use 'gptq', or method 'raw' with explicit AWQ mappings"
            )
    return problems


def run_preflight(recipe: Recipe, layout: ModelLayout, *, file: str | None = None) -> list[ModuleInfo]:
    """Raise RecipeError listing every problem found; return the layers to be quantized."""
    if recipe.quantization.method == "raw":
        return []  # a raw recipe carries its own targets; llm-compressor validates it
    problems = check_patterns(recipe, layout)
    if problems:  # the rest needs working patterns
        _raise(problems, file)
    targeted = quantized_modules(recipe, layout)
    if not targeted:
        problems.append(
            f"quantization.targets/ignore: no module of {layout.architecture} is left to quantize "
            f"(targets {recipe.quantization.targets}, ignore {recipe.quantization.ignore})"
        )
    problems += check_group_size(recipe, layout, targeted)
    problems += check_sequence_length(recipe, layout)
    problems += check_method_support(recipe, layout)
    if problems:
        _raise(problems, file)
    return targeted


def _raise(problems: list[str], file: str | None) -> None:
    raise RecipeError("preflight failed before loading weights:\n  - " + "\n  - ".join(problems), file=file)
