from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from conftest import RECIPES, shipped

from quantlab.core.errors import RecipeError
from quantlab.recipe.file import json_schema, load_recipe, parse_recipe, recipe_hash

SHIPPED = sorted(RECIPES.glob("*.yaml"))
MINIMAL = {"name": "x", "quantization": {"method": "rtn", "scheme": "W8A16"}}


def test_every_method_family_is_shipped():
    loaded = [load_recipe(p).recipe.quantization for p in SHIPPED]
    assert {"rtn", "gptq", "awq", "smoothquant+gptq", "fp8", "raw"} <= {q.method for q in loaded}
    assert any(q.kv_cache for q in loaded)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_recipes_validate_and_round_trip(path: Path):
    loaded = load_recipe(path)
    r = loaded.recipe
    assert r.name == path.stem
    assert r.description, "every shipped recipe says what it is for"
    again = parse_recipe(r.model_dump(mode="json"))
    assert again == r
    assert recipe_hash(again) == loaded.content_hash
    for p in loaded.calibration_paths():
        assert p.is_file()


def test_extends_lays_a_recipe_over_another_and_reads_its_files_from_either_folder(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "calib.jsonl").write_text('{"text": "x"}\n')
    base = {**shipped("gptq-w4a16"), "calibration": {"datasets": [{"path": "../data/calib.jsonl"}], "num_samples": 64}}
    (tmp_path / "base" / "full.yaml").write_text(yaml.safe_dump(base))
    child = {"extends": "../base/full.yaml", "name": "small", "calibration": {"num_samples": 8},
             "quality": {"tasks": ["ql_lastword"], "limit": 20}, "performance": {"repeats": 1}}
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "small.yaml").write_text(yaml.safe_dump(child))
    loaded = load_recipe(tmp_path / "ci" / "small.yaml")
    r = loaded.recipe
    assert loaded.extends == ((tmp_path / "base" / "full.yaml").resolve(),)
    assert r.name == "small" and r.description == base["description"]  # what the child leaves is the parent's
    assert r.calibration.num_samples == 8 and loaded.calibration_paths() == [(tmp_path / "data" / "calib.jsonl")]
    # a mapping merges key by key (the gates stay), a list or a value replaces
    assert r.quality.tasks == ["ql_lastword"] and r.quality.limit == 20 and r.quality.gates.non_inferiority_margin == 0.1
    assert r.performance.repeats == 1 and len(r.performance.workloads) == len(base["performance"]["workloads"])
    assert r.quantization.method == "gptq" and r.quantization.group_size == 64
    # and a chain: a third file extending the second
    (tmp_path / "ci" / "smaller.yaml").write_text(yaml.safe_dump({"extends": "small.yaml", "name": "smaller",
                                                                   "quality": {"limit": 10}}))
    again = load_recipe(tmp_path / "ci" / "smaller.yaml")
    assert again.recipe.quality.limit == 10 and again.recipe.quality.tasks == ["ql_lastword"]
    assert [p.name for p in again.extends] == ["small.yaml", "full.yaml"]


@pytest.mark.parametrize("extends, expected", [
    ("nope.yaml", "no recipe file at"), ("me.yaml", "goes round in a circle"), (3, "must be the path")])
def test_bad_extends_names_the_file_and_field(tmp_path, extends, expected):
    f = tmp_path / "me.yaml"
    f.write_text(yaml.safe_dump({"extends": extends, "name": "me"}))
    with pytest.raises(RecipeError) as e:
        load_recipe(f)
    assert expected in str(e.value) and "me.yaml" in str(e.value) and "field 'extends'" in str(e.value)


def test_a_mistake_in_a_recipe_that_extends_names_both_files(tmp_path):
    (tmp_path / "full.yaml").write_text(yaml.safe_dump(MINIMAL))
    (tmp_path / "small.yaml").write_text(yaml.safe_dump({"extends": "full.yaml", "name": "small",
                                                         "quantization": {"group_sise": 64}}))
    with pytest.raises(RecipeError) as e:
        load_recipe(tmp_path / "small.yaml")
    assert "small.yaml (extends full.yaml)" in str(e.value) and "Did you mean 'group_size'" in str(e.value)


def test_defaults_are_safe():
    r = parse_recipe(MINIMAL)
    assert r.model.source == "default"
    assert r.model.trust_remote_code is False
    assert r.quantization.ignore == ["lm_head"]


def test_hash_changes_with_content_not_with_key_order():
    a = parse_recipe(MINIMAL)
    b = parse_recipe({"quantization": {"scheme": "W8A16", "method": "rtn"}, "name": "x"})
    c = parse_recipe({**MINIMAL, "quantization": {"method": "rtn", "scheme": "W4A16"}})
    assert recipe_hash(a) == recipe_hash(b) != recipe_hash(c)


def err_of(data) -> str:
    with pytest.raises(RecipeError) as e:
        parse_recipe(data, file="r.yaml")
    return str(e.value)


def test_unknown_key_names_field_and_suggests():
    msg = err_of({**MINIMAL, "quantization": {"method": "rtn", "scheme": "W8A16", "group_sise": 64}})
    assert "r.yaml" in msg
    assert "quantization.group_sise" in msg
    assert "Did you mean 'group_size'" in msg


def test_unknown_top_level_section():
    msg = err_of({**MINIMAL, "serving": {}})
    assert "field 'serving': unknown key" in msg and "quantization" in msg


def test_wrong_type_names_field_and_value():
    msg = err_of({**MINIMAL, "calibration": {"datasets": [{"path": "a"}], "num_samples": "many"}})
    assert "calibration.num_samples" in msg and "'many'" in msg


def test_missing_required_field():
    assert "field 'quantization': required but missing" in err_of({"name": "x"})


@pytest.mark.parametrize("quant, needle", [
    ({"method": "awq", "scheme": "W8A8"}, "AWQ protects"),
    ({"method": "smoothquant+gptq", "scheme": "W4A16"}, "SmoothQuant moves"),
    ({"method": "gptq", "scheme": "FP8_DYNAMIC"}, "use method 'fp8'"),
    ({"method": "fp8", "scheme": "W4A16"}, "FP8 schemes only"),
    ({"method": "rtn", "scheme": "W8A8", "group_size": 64}, "group_size applies to W4A16/W8A16 only"),
    ({"method": "rtn", "scheme": "W4A16", "group_size": 48}, "power of two"),
    ({"method": "fp8", "scheme": "FP8_DYNAMIC", "symmetric": False}, "symmetric only"),
    ({"method": "rtn", "scheme": "W8A16", "gptq": {"block_size": 64}}, "does not run gptq"),
    ({"method": "raw"}, "needs 'raw_recipe'"),
    ({"method": "raw", "raw_recipe": "x: 1", "scheme": "W8A16"}, "remove 'scheme'"),
    ({"method": "gptq"}, "needs a 'scheme'"),
])
def test_bad_method_scheme_combinations(quant, needle):
    assert needle in err_of({"name": "x", "quantization": quant, "calibration": {"datasets": [{"path": "a"}]}})


@pytest.mark.parametrize("quant", [
    {"method": "gptq", "scheme": "W4A16"},
    {"method": "awq", "scheme": "W4A16"},
    {"method": "fp8", "scheme": "FP8_DYNAMIC", "kv_cache": {"dtype": "fp8"}},
    {"method": "fp8", "scheme": "FP8"},
])
def test_methods_that_need_data_require_calibration(quant):
    assert "needs calibration data" in err_of({"name": "x", "quantization": quant})


def test_data_free_methods_need_no_calibration():
    for quant in ({"method": "rtn", "scheme": "W4A16", "group_size": 64}, {"method": "fp8", "scheme": "FP8_DYNAMIC"}):
        assert parse_recipe({"name": "x", "quantization": quant}).calibration is None


def test_load_reports_missing_calibration_file(tmp_path):
    data = copy.deepcopy(shipped("gptq-w4a16"))
    data["calibration"]["datasets"][0]["path"] = "nowhere.jsonl"
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(RecipeError) as e:
        load_recipe(tmp_path / "r.yaml")
    msg = str(e.value)
    assert "calibration.datasets.0.path" in msg and "nowhere.jsonl" in msg and "relative to the recipe" in msg


def test_calibration_paths_resolve_relative_to_the_recipe(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "c.jsonl").write_text('{"text": "hello"}\n')
    data = {**MINIMAL, "calibration": {"datasets": [{"path": "data/c.jsonl"}]}}
    (tmp_path / "sub").mkdir()
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(data))
    assert load_recipe(p).calibration_paths() == [(tmp_path / "data" / "c.jsonl").resolve()]


@pytest.mark.parametrize("content, needle", [
    ("name: [unclosed", "not valid YAML"),
    ("- a\n- b\n", "expected a YAML mapping"),
])
def test_bad_yaml(tmp_path, content, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(content)
    with pytest.raises(RecipeError, match=needle):
        load_recipe(p)


def test_missing_recipe_file(tmp_path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.yaml")


def test_json_schema_describes_every_section():
    schema = json_schema()
    assert schema["additionalProperties"] is False
    assert {"name", "model", "quantization", "calibration"} <= set(schema["properties"])
    q = schema["$defs"]["QuantizationSpec"]
    assert q["additionalProperties"] is False
    assert "group_size" in q["properties"]


def test_release_policy_names_known_checks_and_gates():
    from quantlab.core.errors import RecipeError
    from quantlab.recipe.file import parse_recipe

    base = {"name": "r", "quantization": {"method": "rtn", "scheme": "W8A16"}}
    r = parse_recipe({**base, "release": {"policy": {"not_shown": "warn", "checks": {"performance": "block"},
                                                     "gates": {"quality.non_inferiority": "warn"}}}})
    assert r.release.policy.gates == {"quality.non_inferiority": "warn"}
    assert parse_recipe(base).release.policy.not_shown == "block"  # nothing released on evidence it lacks
    with pytest.raises(RecipeError, match="unknown check 'qualiti'"):
        parse_recipe({**base, "release": {"policy": {"checks": {"qualiti": "warn"}}}})
    with pytest.raises(RecipeError, match="is not 'check.gate'"):
        parse_recipe({**base, "release": {"policy": {"gates": {"non_inferiority": "warn"}}}})


def test_serve_allow_kernels_names_kernel_classes():
    base = {"name": "r", "quantization": {"method": "rtn", "scheme": "W8A16"}}
    r = parse_recipe({**base, "serve": {"allow_kernels": ["MarlinFP8ScaledMMLinearKernel"],
                                        "targets": [{"name": "gpu", "allow_kernels": ["ExllamaLinearKernel"]}]}})
    assert r.serve.allow_kernels == ["MarlinFP8ScaledMMLinearKernel"]
    # a target's list adds to the serve section's
    assert r.serve.for_target(r.serve.targets[0]).allow_kernels == ["MarlinFP8ScaledMMLinearKernel",
                                                                    "ExllamaLinearKernel"]
    with pytest.raises(RecipeError, match=r"serve\.allow_kernels': Input should be a valid list"):
        parse_recipe({**base, "serve": {"allow_kernels": "MarlinLinearKernel"}})
    with pytest.raises(RecipeError, match=r"serve\.allow_kernels\.0': 'marlin' is not a kernel class name"):
        parse_recipe({**base, "serve": {"allow_kernels": ["marlin"]}})
    # the serve check's gate is named like any other in release.policy
    assert parse_recipe({**base, "release": {"policy": {"checks": {"serve": "warn"},
                                                        "gates": {"serve.kernel_path@primary": "block"}}}})
