"""Translate a recipe's `quantization` section into llm-compressor modifiers.

`plan_modifiers` is pure: it returns (modifier class name, keyword arguments) pairs
that tests can inspect without importing llm-compressor; quantlab.quantize.llmcompressor.instantiate builds them.
"""

from __future__ import annotations

from typing import Any

import yaml

from quantlab.recipe.quantize import FP8_SCHEMES, QuantizationSpec

# Static FP8 KV cache: one calibrated scale per tensor (k and v of each layer).
KV_CACHE_FP8 = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


def weight_args(q: QuantizationSpec) -> dict[str, Any]:
    bits = 4 if q.scheme == "W4A16" else 8
    args: dict[str, Any] = {"num_bits": bits, "type": "int", "symmetric": q.symmetric}
    if q.scheme in ("W4A16", "W8A16") and q.group_size is not None:
        args.update(strategy="group", group_size=q.group_size)
    else:
        args.update(strategy="channel")
    return args


def scheme_kwargs(q: QuantizationSpec) -> dict[str, Any]:
    """Either a compressed-tensors preset name (FP8 family) or explicit config groups,
    so group size and symmetry are exactly what the recipe says."""
    if q.scheme in FP8_SCHEMES:
        kwargs: dict[str, Any] = {"scheme": q.scheme, "targets": list(q.targets)}
    else:
        group: dict[str, Any] = {"targets": list(q.targets), "weights": weight_args(q)}
        if q.scheme == "W8A8":
            # int8 activations, one dynamic scale per token: no activation calibration needed
            group["input_activations"] = {
                "num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True,
            }
        kwargs = {"config_groups": {"group_0": group}, "targets": list(q.targets)}
    kwargs["ignore"] = list(q.ignore)
    if q.kv_cache is not None:
        kwargs["kv_cache_scheme"] = dict(KV_CACHE_FP8)
    return kwargs


def plan_modifiers(q: QuantizationSpec) -> list[tuple[str, dict[str, Any]]]:
    if q.method == "raw":
        raise ValueError("method 'raw' has no modifier plan; pass raw_recipe to oneshot")
    quant = scheme_kwargs(q)
    gptq = q.gptq.model_dump() if q.gptq else {"block_size": 128, "dampening_frac": 0.01, "actorder": "static"}
    plan: list[tuple[str, dict[str, Any]]] = []
    if q.method.startswith("smoothquant+"):
        strength = q.smoothquant.smoothing_strength if q.smoothquant else 0.8
        plan.append(("SmoothQuantModifier", {"smoothing_strength": strength}))
    if q.method == "awq":
        awq = q.awq.model_dump() if q.awq else {"duo_scaling": True, "n_grid": 20}
        plan.append(("AWQModifier", awq))
    if q.method in ("gptq", "smoothquant+gptq"):
        plan.append(("GPTQModifier", {**quant, **gptq}))
    else:  # rtn, fp8, awq (AWQ only rescales; the weights are quantized here)
        plan.append(("QuantizationModifier", quant))
    return plan


def raw_recipe_text(q: QuantizationSpec) -> str:
    raw = q.raw_recipe
    return raw if isinstance(raw, str) else yaml.safe_dump(raw, sort_keys=False)
