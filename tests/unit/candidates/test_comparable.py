"""Which recipes can be compared against one baseline, and the errors for those that cannot."""

from __future__ import annotations

import pytest
import yaml

from quantlab.candidates.spec import SelectionSpec
from quantlab.core.compare import check_comparable, selection_of
from quantlab.core.errors import RecipeError
from quantlab.core.recipe import load_recipe

BASE = {
    "model": {"source": "default"},
    "quantization": {"method": "rtn", "scheme": "W4A16", "group_size": 64},
    "serve": {"engine_args": {"max_model_len": 512}, "side_by_side": True},
    "performance": {"workloads": [{"name": "short", "prompt_tokens": 32, "output_tokens": 8, "concurrency": [1],
                                   "num_requests": 4}]},
}


def recipes(tmp_path, *overrides: dict):
    out = []
    for i, extra in enumerate(overrides):
        data = {**BASE, "name": f"cand-{i}", **extra}
        path = tmp_path / f"r{i}.yaml"
        path.write_text(yaml.safe_dump(data))
        out.append(load_recipe(path))
    return out


def test_recipes_of_one_model_with_equal_serve_and_load_are_comparable(tmp_path):
    loaded = recipes(tmp_path, {}, {"quantization": {"method": "rtn", "scheme": "W8A8"}},
                     {"selection": {"rule": "least_memory"}})
    check_comparable(loaded)
    assert selection_of(loaded) == SelectionSpec(rule="least_memory")
    assert selection_of(loaded[:2]) == SelectionSpec()  # default: cost per successful answer


def test_one_recipe_is_not_a_comparison(tmp_path):
    with pytest.raises(RecipeError, match="two or more recipes"):
        check_comparable(recipes(tmp_path, {}))


def test_two_candidates_with_one_name_are_refused_naming_both_files(tmp_path):
    loaded = recipes(tmp_path, {"name": "same"}, {"name": "same"})
    with pytest.raises(RecipeError) as err:
        check_comparable(loaded)
    assert "two candidates are named 'same'" in str(err.value)
    assert "r0.yaml" in str(err.value) and err.value.field == "name"


@pytest.mark.parametrize("section, change", [
    ("performance", {"performance": {"workloads": [{"name": "short", "prompt_tokens": 64, "output_tokens": 8,
                                                    "concurrency": [1], "num_requests": 4}]}}),
    ("serve", {"serve": {"engine_args": {"max_model_len": 1024}, "side_by_side": True}}),
    ("model", {"model": {"source": "default", "dtype": "float32"}}),
])
def test_a_different_shared_section_is_refused_naming_it(tmp_path, section, change):
    loaded = recipes(tmp_path, {}, change)
    with pytest.raises(RecipeError) as err:
        check_comparable(loaded)
    assert err.value.field == section and "cand-1" in str(err.value)


def test_different_selection_rules_are_refused(tmp_path):
    loaded = recipes(tmp_path, {"selection": {"rule": "least_memory"}}, {"selection": {"rule": "highest_throughput"}})
    with pytest.raises(RecipeError, match="different `selection`"):
        check_comparable(loaded)


def test_one_server_at_a_time_is_refused_with_the_fix(tmp_path):
    serve = {"serve": {"engine_args": {"max_model_len": 512}, "side_by_side": False}}
    with pytest.raises(RecipeError, match="side_by_side"):
        check_comparable(recipes(tmp_path, serve, serve))

