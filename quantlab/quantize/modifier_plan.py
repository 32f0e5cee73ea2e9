"""Translate a recipe's `quantization` section into llm-compressor modifiers.

`plan_modifiers` is pure: it returns (modifier class name, keyword arguments) pairs
that tests can inspect without importing llm-compressor; quantlab.quantize.llmcompressor.instantiate builds them.
"""

from __future__ import annotations

from typing import Any

import yaml

from quantlab.recipe.quantize import QuantizationSpec
from quantlab.recipe.schemes import METHODS, SCHEMES, Scheme, weight_strategy

# Static FP8 KV cache: one calibrated scale per tensor (k and v of each layer).
KV_CACHE_FP8 = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


def weight_args(q: QuantizationSpec) -> dict[str, Any]:
    """The weights' arguments of a scheme llm-compressor is given as explicit config groups."""
    scheme = SCHEMES[str(q.scheme)]
    args: dict[str, Any] = {"num_bits": scheme.weights.bits, "type": scheme.weights.type, "symmetric": q.symmetric}
    args["strategy"] = weight_strategy(scheme, q.group_size)
    if args["strategy"] == "group":
        args["group_size"] = q.group_size
    return args


def activation_args(scheme: Scheme) -> dict[str, Any] | None:
    acts = scheme.activations
    if acts is None:
        return None
    return {"num_bits": acts.bits, "type": acts.type, "symmetric": True, "strategy": acts.strategy,
            "dynamic": acts.dynamic}


def scheme_kwargs(q: QuantizationSpec) -> dict[str, Any]:
    """Either a compressed-tensors preset name (FP8 family) or explicit config groups,
    so group size and symmetry are exactly what the recipe says."""
    scheme = SCHEMES[str(q.scheme)]
    if scheme.preset:
        kwargs: dict[str, Any] = {"scheme": q.scheme, "targets": list(q.targets)}
    else:
        group: dict[str, Any] = {"targets": list(q.targets), "weights": weight_args(q)}
        acts = activation_args(scheme)
        if acts is not None:
            group["input_activations"] = acts
        kwargs = {"config_groups": {"group_0": group}, "targets": list(q.targets)}
    kwargs["ignore"] = list(q.ignore)
    if q.kv_cache is not None:
        kwargs["kv_cache_scheme"] = dict(KV_CACHE_FP8)
    return kwargs


def _modifier_kwargs(q: QuantizationSpec, modifier: str, quant: dict[str, Any]) -> dict[str, Any]:
    """A modifier's arguments: the recipe's options for it (their defaults where it gives none)."""
    if modifier == "SmoothQuantModifier":
        return {"smoothing_strength": q.smoothquant.smoothing_strength if q.smoothquant else 0.8}
    if modifier == "AWQModifier":
        return q.awq.model_dump() if q.awq else {"duo_scaling": True, "n_grid": 20}
    if modifier == "GPTQModifier":
        gptq = q.gptq.model_dump() if q.gptq else {"block_size": 128, "dampening_frac": 0.01, "actorder": "static"}
        return {**quant, **gptq}
    return quant  # QuantizationModifier


def plan_modifiers(q: QuantizationSpec) -> list[tuple[str, dict[str, Any]]]:
    """The method's modifiers in order (recipe/schemes.METHODS), each with its arguments."""
    if q.method == "raw":
        raise ValueError("method 'raw' has no modifier plan; pass raw_recipe to oneshot")
    quant = scheme_kwargs(q)
    return [(modifier, _modifier_kwargs(q, modifier, quant)) for modifier in METHODS[q.method].modifiers]


def raw_recipe_text(q: QuantizationSpec) -> str:
    raw = q.raw_recipe
    return raw if isinstance(raw, str) else yaml.safe_dump(raw, sort_keys=False)
