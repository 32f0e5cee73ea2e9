from __future__ import annotations

import pytest

from quantlab.core.errors import RecipeError
from quantlab.quantize.preflight import (
    ModelLayout,
    ModuleInfo,
    matches,
    run_preflight,
    working_group_sizes,
)
from quantlab.recipe.file import parse_recipe

LINEAR = ("Linear", "Module")


def smollm_like_layout(layers: int = 2) -> ModelLayout:
    """The shape of SmolLM2-135M: hidden 576, intermediate 1536."""
    mods = [ModuleInfo("", ("LlamaForCausalLM", "Module")), ModuleInfo("model.embed_tokens", ("Embedding", "Module"))]
    for i in range(layers):
        p = f"model.layers.{i}"
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            mods.append(ModuleInfo(f"{p}.self_attn.{n}", LINEAR, 576, 576))
        mods.append(ModuleInfo(f"{p}.mlp.gate_proj", LINEAR, 576, 1536))
        mods.append(ModuleInfo(f"{p}.mlp.up_proj", LINEAR, 576, 1536))
        mods.append(ModuleInfo(f"{p}.mlp.down_proj", LINEAR, 1536, 576))
    mods.append(ModuleInfo("lm_head", LINEAR, 576, 49152))
    return ModelLayout("LlamaForCausalLM", mods, max_position_embeddings=8192,
                       extra={"awq_architectures": ["LlamaForCausalLM"]})


def recipe(**quant):
    q = {"method": "rtn", "scheme": "W4A16", **quant}
    return parse_recipe({"name": "t", "quantization": q})


def test_group_size_128_names_layers_and_suggests_sizes():
    with pytest.raises(RecipeError) as e:
        run_preflight(recipe(group_size=128), smollm_like_layout())
    msg = str(e.value)
    assert "group_size: 128 does not divide" in msg
    assert "input width 576" in msg
    assert "model.layers.*.self_attn.q_proj (x2)" in msg
    assert "model.layers.*.mlp.down_proj" not in msg  # 1536 divides by 128
    assert "[32, 64]" in msg


def test_group_size_64_passes_and_returns_targeted_layers():
    targeted = run_preflight(recipe(group_size=64), smollm_like_layout())
    names = {m.name for m in targeted}
    assert "lm_head" not in names and len(names) == 14


def test_ignoring_the_bad_layers_is_a_fix():
    r = recipe(group_size=128, ignore=["lm_head", "re:.*self_attn.*", "re:.*mlp\\.(gate|up)_proj"])
    assert {m.name.rsplit(".", 1)[-1] for m in run_preflight(r, smollm_like_layout())} == {"down_proj"}


def test_ignore_pattern_that_matches_nothing():
    with pytest.raises(RecipeError) as e:
        run_preflight(recipe(group_size=64, ignore=["lm_haed"]), smollm_like_layout())
    assert "quantization.ignore.0: 'lm_haed' matches no module" in str(e.value)
    assert "lm_head" in str(e.value)


def test_bad_regex_is_reported():
    with pytest.raises(RecipeError, match="not a valid regex"):
        run_preflight(recipe(group_size=64, ignore=["re:(unclosed"]), smollm_like_layout())


def test_nothing_left_to_quantize():
    with pytest.raises(RecipeError, match="no module .* is left to quantize"):
        run_preflight(recipe(group_size=64, ignore=["Linear"]), smollm_like_layout())


def test_awq_unknown_architecture():
    layout = smollm_like_layout()
    layout.architecture = "MysteryForCausalLM"
    r = parse_recipe({"name": "t", "quantization": {"method": "awq", "scheme": "W4A16", "group_size": 64},
                      "calibration": {"datasets": [{"path": "x"}]}})
    with pytest.raises(RecipeError, match="no AWQ layer mappings for MysteryForCausalLM"):
        run_preflight(r, layout)


def test_calibration_longer_than_the_model():
    r = parse_recipe({"name": "t", "quantization": {"method": "gptq", "scheme": "W8A16"},
                      "calibration": {"datasets": [{"path": "x"}], "max_seq_length": 16384}})
    with pytest.raises(RecipeError, match="above the model's max_position_embeddings"):
        run_preflight(r, smollm_like_layout())


def test_working_group_sizes():
    assert working_group_sizes({576, 1536}) == [32, 64]
    assert working_group_sizes({4096, 11008}) == [32, 64, 128, 256]
    assert working_group_sizes({100}) == []


def test_matching_agrees_with_compressed_tensors(tmp_path):
    """Our pure matcher must select exactly what compressed-tensors will quantize
    (a model layout from a config alone: no weights)."""
    import torch
    from compressed_tensors.utils import is_match
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    from quantlab.quantize.llmcompressor import model_layout

    LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2).save_pretrained(tmp_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    layout = model_layout(tmp_path, trust_remote_code=False)
    by_name = {m.name: m for m in layout.modules}
    for pattern in ("Linear", "lm_head", "re:.*mlp.*", "re:.*q_proj$", "LlamaDecoderLayer", "model.layers.0.mlp"):
        ours = {n for n in by_name if n and matches(by_name[n], pattern)}
        theirs = {n for n, m in model.named_modules() if n and is_match(n, m, pattern)}
        assert ours == theirs, pattern
