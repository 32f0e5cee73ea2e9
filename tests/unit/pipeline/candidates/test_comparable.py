"""Which recipes can be compared against one baseline, and the errors for those that cannot."""

from __future__ import annotations

import pytest
import yaml

from quantlab.recipe.selection import SelectionSpec
from quantlab.pipeline.candidates.members import Candidate, candidates_of, check_comparable, host_of, selection_of
from quantlab.core.errors import RecipeError
from quantlab.recipe.file import load_recipe

BASE = {
    "model": {"source": "default"},
    "quantization": {"method": "rtn", "scheme": "W4A16", "group_size": 64},
    "serve": {"engine_args": {"max_model_len": 512}, "side_by_side": True},
    "performance": {"workloads": [{"name": "short", "prompt_tokens": 32, "output_tokens": 8, "concurrency": [1],
                                   "num_requests": 4}]},
}


def recipes(tmp_path, *overrides: dict) -> list[Candidate]:
    out = []
    for i, extra in enumerate(overrides):
        data = {**BASE, "name": f"cand-{i}", **extra}
        path = tmp_path / f"r{i}.yaml"
        path.write_text(yaml.safe_dump(data))
        lr = load_recipe(path)
        out.append(Candidate(lr.recipe.name, lr))
    return out


def test_recipes_of_one_model_with_equal_serve_and_load_are_comparable(tmp_path):
    loaded = recipes(tmp_path, {}, {"quantization": {"method": "rtn", "scheme": "W8A8"}},
                     {"selection": {"rule": "least_memory"}})
    check_comparable(loaded)
    assert selection_of([c.loaded for c in loaded]) == SelectionSpec(rule="least_memory")
    assert selection_of([c.loaded for c in loaded[:2]]) == SelectionSpec()  # default: cost per successful answer


def test_one_recipe_is_not_a_comparison(tmp_path):
    with pytest.raises(RecipeError, match="two or more candidates"):
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


def test_one_server_at_a_time_is_a_comparison_in_turn(tmp_path):
    serve = {"serve": {"engine_args": {"max_model_len": 512}, "side_by_side": False}}
    check_comparable(recipes(tmp_path, serve, serve))  # each candidate is then run in turn


def test_existing_checkpoints_are_candidates_judged_by_the_recipe(tmp_path):
    [judge] = recipes(tmp_path, {})
    for name in ("vendor-awq", "vendor-gptq"):
        (tmp_path / name).mkdir()
    cands = candidates_of([judge.loaded.path], {"vendor-awq": tmp_path / "vendor-awq",
                                                "vendor-gptq": tmp_path / "vendor-gptq"})
    assert [c.name for c in cands] == ["cand-0", "vendor-awq", "vendor-gptq"]
    assert [c.checkpoint for c in cands] == [None, tmp_path / "vendor-awq", tmp_path / "vendor-gptq"]
    assert cands[1].loaded.recipe.name == "vendor-awq" and cands[1].loaded.recipe.quality == judge.loaded.recipe.quality
    check_comparable(cands)
    only = candidates_of([], {"a": tmp_path / "vendor-awq", "b": tmp_path / "vendor-gptq"}, judge_by=judge.loaded.path)
    assert [c.name for c in only] == ["a", "b"]


def test_a_checkpoint_candidate_named_like_a_recipe_is_refused_naming_both(tmp_path):
    [judge] = recipes(tmp_path, {})
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(RecipeError) as err:
        check_comparable(candidates_of([judge.loaded.path], {"cand-0": tmp_path / "ckpt"}))
    assert "r0.yaml" in str(err.value) and "checkpoint" in str(err.value) and err.value.field == "--checkpoint"


@pytest.mark.parametrize("bad, match", [("missing", "is not a folder"), ("Bad Name!", "not a valid name")])
def test_a_bad_checkpoint_candidate_is_refused(tmp_path, bad, match):
    [judge] = recipes(tmp_path, {})
    (tmp_path / "ckpt").mkdir()
    folder = tmp_path / ("nowhere" if bad == "missing" else "ckpt")
    with pytest.raises(RecipeError, match=match):
        candidates_of([judge.loaded.path], {bad: folder})


def endpoint(candidate: str) -> dict:
    return {"serve": {"mode": "endpoint", "endpoint": "http://127.0.0.1:8000", "candidate_endpoint": candidate}}


def test_candidates_at_their_own_endpoints_share_one_baseline(tmp_path):
    check_comparable(recipes(tmp_path, endpoint("http://localhost:8001"), endpoint("http://localhost:8002")))
    assert host_of("http://[::1]:80") == host_of("http://localhost:1") == "localhost"


def test_a_candidate_on_another_host_is_compared_without_performance(tmp_path):
    far = endpoint("http://gpu-b.internal:8000")
    with pytest.raises(RecipeError) as err:
        check_comparable(recipes(tmp_path, endpoint("http://localhost:8001"), far))
    assert err.value.field == "performance" and "gpu-b.internal" in str(err.value)
    check_comparable(recipes(tmp_path, endpoint("http://localhost:8001"), {**far, "performance": None}))

