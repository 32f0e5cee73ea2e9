from __future__ import annotations

import pytest

from quantlab.quantize.llmcompressor import instantiate
from quantlab.quantize.modifier_plan import plan_modifiers
from quantlab.recipe.file import parse_recipe

CAL = {"datasets": [{"path": "x"}]}


def plan(**q):
    return plan_modifiers(parse_recipe({"name": "t", "quantization": q, "calibration": CAL}).quantization)


def test_gptq_w4a16_group():
    [(name, kw)] = plan(method="gptq", scheme="W4A16", group_size=64, gptq={"dampening_frac": 0.05})
    assert name == "GPTQModifier" and kw["dampening_frac"] == 0.05 and kw["actorder"] == "static"
    w = kw["config_groups"]["group_0"]["weights"]
    assert w == {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 64}
    assert "input_activations" not in kw["config_groups"]["group_0"]


def test_awq_is_a_transform_followed_by_weight_quantization():
    names = [n for n, _ in plan(method="awq", scheme="W4A16", group_size=64, symmetric=False)]
    assert names == ["AWQModifier", "QuantizationModifier"]


def test_smoothquant_gptq_w8a8_has_dynamic_token_activations():
    (sq, sq_kw), (gq, gq_kw) = plan(method="smoothquant+gptq", scheme="W8A8", smoothquant={"smoothing_strength": 0.7})
    assert (sq, gq) == ("SmoothQuantModifier", "GPTQModifier") and sq_kw == {"smoothing_strength": 0.7}
    act = gq_kw["config_groups"]["group_0"]["input_activations"]
    assert act["strategy"] == "token" and act["dynamic"] is True and act["num_bits"] == 8
    assert gq_kw["config_groups"]["group_0"]["weights"]["strategy"] == "channel"


def test_fp8_uses_presets_and_kv_cache_scheme():
    [(name, kw)] = plan(method="fp8", scheme="FP8_DYNAMIC", kv_cache={"dtype": "fp8"})
    assert name == "QuantizationModifier" and kw["scheme"] == "FP8_DYNAMIC"
    assert kw["kv_cache_scheme"]["type"] == "float" and kw["kv_cache_scheme"]["dynamic"] is False


@pytest.mark.parametrize("q", [
    {"method": "rtn", "scheme": "W8A16"},
    {"method": "gptq", "scheme": "W4A16", "group_size": 32, "gptq": {"actorder": None}},
    {"method": "awq", "scheme": "W4A16", "group_size": 64, "awq": {"duo_scaling": "both"}},
    {"method": "smoothquant+rtn", "scheme": "W8A8"},
    {"method": "fp8", "scheme": "FP8_BLOCK"},
])
def test_plans_are_accepted_by_llmcompressor(q):
    """Every plan instantiates into the library's own (pydantic) modifiers."""
    mods = instantiate(plan(**q))
    assert [type(m).__name__ for m in mods] == [n for n, _ in plan(**q)]
