"""The recipe's load_quality section: its fields, the point names it takes, and the checks
against the quality and performance sections it needs, each refusal naming its field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from quantlab.core.errors import RecipeError
from quantlab.performance.result import load_points
from quantlab.recipe.file import parse_recipe
from quantlab.recipe.load_quality import LoadQualitySpec, point_names, selected_points, workload_points
from quantlab.recipe.performance import PerformanceSpec

BASE = {"name": "lq", "quantization": {"method": "fp8", "scheme": "FP8_DYNAMIC"}}
PERF = {"workloads": [{"name": "chat", "concurrency": [1, 8], "request_rates": [2.5, 4]},
                      {"name": "long", "concurrency": [16]}]}


def recipe(**sections):
    return parse_recipe({**BASE, **sections}, file="recipe.yaml")


def refusal(**sections) -> str:
    with pytest.raises(RecipeError) as err:
        recipe(**sections)
    return str(err.value)


def test_the_defaults():
    spec = LoadQualitySpec()
    assert (spec.points, spec.tasks, spec.items, spec.max_items, spec.min_items) == ("all", None, "auto", 400, 40)
    assert (spec.margin, spec.confidence, spec.versus_c1, spec.num_concurrent, spec.timeout_s) == \
        (0.05, 0.95, True, 64, 1800)
    assert all(f.description for f in LoadQualitySpec.model_fields.values()), "each field is described"


def test_points_are_named_as_the_performance_stage_names_them():
    perf = PerformanceSpec.model_validate(PERF)
    for w in perf.workloads:
        assert workload_points(w) == load_points(w)
    assert point_names(perf) == ["chat/c1", "chat/c8", "chat/r2.5", "chat/r4", "long/c16"]


def test_all_selects_every_point_and_names_keep_the_performance_order():
    perf = PerformanceSpec.model_validate(PERF)
    every = selected_points(LoadQualitySpec(), perf)
    assert [(name, w.name, c, r) for name, w, c, r in every] == [
        ("chat/c1", "chat", 1, None), ("chat/c8", "chat", 8, None), ("chat/r2.5", "chat", None, 2.5),
        ("chat/r4", "chat", None, 4.0), ("long/c16", "long", 16, None)]
    chosen = selected_points(LoadQualitySpec(points=["long/c16", "chat/r2.5"]), perf)
    assert [name for name, *_ in chosen] == ["chat/r2.5", "long/c16"]


def test_a_recipe_with_the_three_sections_loads():
    r = recipe(quality={}, performance=PERF, load_quality={"points": ["chat/c8", "chat/r2.5"], "items": 120})
    assert r.load_quality.points == ["chat/c8", "chat/r2.5"] and r.load_quality.items == 120
    assert recipe(quality={}, performance=PERF).load_quality is None  # off unless named


def test_an_unknown_point_is_refused_naming_the_field_and_the_valid_names():
    msg = refusal(quality={}, performance=PERF, load_quality={"points": ["chat/c4", "chat/c8"]})
    assert "field 'load_quality.points'" in msg and "'chat/c4' is not a point of the performance section" in msg
    assert "chat/c1, chat/c8, chat/r2.5, chat/r4, long/c16" in msg
    msg = refusal(quality={}, performance=PERF, load_quality={"points": ["other/c1", "chat/r3"]})
    assert "'other/c1', 'chat/r3' are not points" in msg


@pytest.mark.parametrize("missing", [("quality",), ("performance",), ("quality", "performance")])
def test_the_section_needs_quality_and_performance(missing):
    sections = {"quality": {}, "performance": PERF, "load_quality": {}}
    for name in missing:
        sections.pop(name)
    msg = refusal(**sections)
    assert "field 'load_quality': needs the " + " and ".join(missing) + " section" in msg


@pytest.mark.parametrize("points, words", [
    (["c8"], "'c8' is not a point name"),
    (["chat/c0"], "'chat/c0' is not a point name"),
    (["chat/8"], "is not a point name"),
    (["chat/c8", "chat/c8"], "a point is named twice: ['chat/c8']"),
    ([], "name at least one point"),
])
def test_badly_formed_point_names_are_refused(points, words):
    msg = refusal(quality={}, performance=PERF, load_quality={"points": points})
    assert "field 'load_quality.points'" in msg and words in msg


@pytest.mark.parametrize("section, words", [
    ({"items": 20}, "items (20) must be at least min_items (40)"),
    ({"min_items": 500}, "min_items (500) is above max_items (400)"),
    ({"margin": 0}, "greater than 0"),
    ({"confidence": 1.0}, "less than 1"),
    ({"tasks": ["a", "a"]}, "a task is named twice: ['a']"),
    ({"tasks": []}, "at least 1 item"),
    ({"points": "some"}, "Input should be 'all'"),
    ({"item": 100}, "unknown key. Did you mean 'items'?"),
])
def test_bad_sizes_and_settings_are_refused(section, words):
    msg = refusal(quality={}, performance=PERF, load_quality=section)
    assert "load_quality" in msg and words in msg


def test_items_at_min_items_are_allowed():
    assert LoadQualitySpec(items=40).items == 40
    with pytest.raises(ValidationError):
        LoadQualitySpec(items=39)
