"""The search's order and stopping (pure): bisection over how many of the most sensitive
layers to keep, a round of `width` trials at a time, the winner, and the recipe a trial is."""

from __future__ import annotations

import pytest
import yaml

from quantlab.recipe.file import rebased
from quantlab.search.state import SearchState, first_round, ignore_for, spread, trial_name


def test_points_spread_evenly_inside_the_interval():
    assert spread(0, 10, 1) == [5] and spread(0, 10, 2) == [3, 7]
    assert spread(0, 3, 5) == [1, 2] and spread(4, 5, 2) == [] and spread(-1, 0, 2) == []
    assert first_round(8, 2) == [0, 8] and first_round(8, 3) == [0, 4, 8] and first_round(1, 2) == [0, 1]


def search(threshold: int | None, max_layers: int, width: int, max_trials: int = 50):
    """Run the state machine against a monotone truth: k passes iff k >= threshold."""
    state = SearchState(max_layers=max_layers, width=width)
    rounds = []
    while (todo := state.next_points()) and len(state.trials) < max_trials:
        rounds.append(todo)
        for k in todo:
            passed = threshold is not None and k >= threshold
            state.record(k, {"decision": "release" if passed else "blocked",
                             "failed_gates": [] if passed else [f"gate{i}" for i in range(max(1, 10 - k))]})
    return state, rounds


@pytest.mark.parametrize("threshold", range(0, 17))
@pytest.mark.parametrize("width", [1, 2, 3])
def test_bisection_finds_the_smallest_passing_number(threshold, width):
    state, rounds = search(threshold, 16, width)
    assert state.best() == threshold and state.hi == threshold
    assert state.lo == (threshold - 1 if threshold > 0 else None)
    assert state.monotonic_note() is None
    # a round cuts the interval by width + 1: log base (width + 1) of 16 rounds after the first, at most
    import math

    assert len(rounds) <= 2 + math.ceil(math.log(17, width + 1))
    assert all(len(r) <= max(width, 2) for r in rounds)


def test_two_trials_a_round_take_fewer_rounds_than_one():
    assert len(search(11, 30, 2)[1]) < len(search(11, 30, 1)[1])


def test_when_even_the_most_kept_fails_the_search_stops_with_the_closest():
    state, rounds = search(None, 8, 2)
    assert rounds == [[0, 8]] and state.hi is None
    assert state.best() == 8  # fewest failed gates (the fake truth fails fewer gates the more is kept)


def test_a_failure_above_a_pass_is_said():
    state = SearchState(max_layers=8, width=2)
    state.record(0, {"decision": "blocked", "failed_gates": ["a"]})
    state.record(3, {"decision": "release", "failed_gates": []})
    state.record(8, {"decision": "blocked", "failed_gates": ["b"]})
    assert state.best() == 3 and "did not always help" in state.monotonic_note()
    assert state.next_points() == [1, 2]


def test_a_trial_keeps_the_top_groups_modules_out_of_quantization(tmp_path):
    ranking = [{"group": "model.layers.11", "modules": ["model.layers.11.mlp.up_proj", "model.layers.11.mlp.down_proj"]},
               {"group": "model.layers.2", "modules": ["model.layers.2.self_attn.q_proj"]}]
    assert ignore_for(["lm_head"], ranking, 0) == ["lm_head"]
    assert ignore_for(["lm_head"], ranking, 2) == ["lm_head", "model.layers.11.mlp.up_proj",
                                                   "model.layers.11.mlp.down_proj", "model.layers.2.self_attn.q_proj"]
    assert trial_name("gptq-w4a16", 3) == "gptq-w4a16-keep3" and len(trial_name("x" * 64, 12)) == 64


def test_a_written_recipe_reads_the_same_files_from_its_new_folder(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "calib.jsonl").write_text("{}\n")
    data = {"model": {"source": "default"}, "calibration": {"datasets": [{"path": "../data/calib.jsonl"}]},
            "quality": {"suites": ["default"]}, "serve": {"endpoint": "http://127.0.0.1:8000"}}
    out = tmp_path / "runs" / "search" / "x"
    out.mkdir(parents=True)
    moved = rebased(data, tmp_path / "recipes", out)
    assert moved["calibration"]["datasets"][0]["path"] == "../../../data/calib.jsonl"
    assert (out / moved["calibration"]["datasets"][0]["path"]).resolve() == (tmp_path / "data" / "calib.jsonl")
    # names that are not files stay as written
    assert moved["model"]["source"] == "default" and moved["quality"]["suites"] == ["default"]
    assert moved["serve"]["endpoint"] == "http://127.0.0.1:8000"
    assert yaml.safe_load(yaml.safe_dump(moved)) == moved


def test_knobs_parsed_as_ordered_choices():
    from quantlab.search.state import parse_knob

    assert parse_knob("quantization.group_size=128, 64,32") == ("quantization.group_size", [128, 64, 32])
    assert parse_knob("quantization.smoothquant.smoothing_strength=0.8,0.5") == (
        "quantization.smoothquant.smoothing_strength", [0.8, 0.5])
    assert parse_knob("quantization.symmetric=true,false")[1] == [True, False]
    for bad in ("group_size=128", "quantization.group_size", "quantization.group_size=", "Quant.x=1",
                "quantization.group_size=64,64"):
        with pytest.raises(ValueError, match="--knob"):
            parse_knob(bad)


def test_a_knob_sets_its_field_in_a_copy():
    from quantlab.recipe.file import set_field

    data = {"quantization": {"method": "gptq", "gptq": None}}
    out = set_field(data, "quantization.gptq.dampening_frac", 0.05)
    assert out["quantization"]["gptq"] == {"dampening_frac": 0.05} and data["quantization"]["gptq"] is None
    with pytest.raises(ValueError, match="not a section"):
        set_field(data, "quantization.method.x", 1)


def test_the_first_passing_choice_wins_else_the_closest_is_carried_on():
    from quantlab.search.state import knob_pick

    blocked = lambda n: {"decision": "blocked", "failed_gates": ["g"] * n}  # noqa: E731
    assert knob_pick([blocked(3), {"decision": "release"}, {"decision": "release"}]) == (1, 1)
    assert knob_pick([blocked(3), blocked(1), blocked(1)]) == (None, 1)


def test_a_knob_that_makes_no_valid_recipe_is_refused_before_any_work(tmp_path):
    from quantlab.core.errors import RecipeError
    from quantlab.recipe.file import load_recipe
    from quantlab.pipeline.search import checked_knob

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "r", "model": {"source": "default"},
                                      "quantization": {"method": "rtn", "scheme": "W4A16", "group_size": 64}}))
    loaded = load_recipe(recipe)
    assert checked_knob(loaded, "quantization.group_size=128,32") == ("quantization.group_size", [128, 32])
    with pytest.raises(RecipeError) as err:
        checked_knob(loaded, "quantization.group_size=128,100")
    assert "quantization.group_size=100" in str(err.value) and err.value.field == "--knob"
    with pytest.raises(RecipeError, match="--knob"):
        checked_knob(loaded, "quantization.group_sise=128")
