"""The parts a sensitivity measurement quantizes one at a time (pure): the recipe's
quantized modules, one group each or one group per decoder layer."""

from __future__ import annotations

import re

from quantlab.recipe.sensitivity import Granularity

_LAYER = re.compile(r"^(.*?\.\d+)\.")  # 'model.layers.12.mlp.up_proj' -> 'model.layers.12'


def layer_of(module: str) -> str:
    """The decoder layer a module belongs to ('model.layers.12'), or the module itself
    where its name holds no layer index (e.g. an lm_head the recipe quantizes)."""
    m = _LAYER.match(module)
    return m.group(1) if m else module


def group_modules(modules: list[str], granularity: Granularity) -> dict[str, list[str]]:
    """Group name -> its modules, in model order."""
    if not modules:
        raise ValueError("no module to group: the recipe's targets and ignore leave nothing quantized")
    groups: dict[str, list[str]] = {}
    for name in modules:
        groups.setdefault(name if granularity == "module" else layer_of(name), []).append(name)
    return groups


def layer_index(group: str) -> int | None:
    """12 for 'model.layers.12' (or any name whose last number is its layer), else None."""
    numbers = re.findall(r"\.(\d+)(?:\.|$)", group)
    return int(numbers[-1]) if numbers else None
