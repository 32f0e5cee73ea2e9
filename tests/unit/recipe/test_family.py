"""The family's confidences (recipe/family.py): what a candidate judged among others is judged by."""

import pytest

from quantlab.core.shipped import RECIPES
from quantlab.recipe.family import Family, family_confidence, for_family
from quantlab.recipe.file import load_recipe
from quantlab.recipe.quality import GateOverride


def test_every_interval_gate_confidence_is_divided_by_the_family():
    loaded = load_recipe(RECIPES / "gptq-w4a16.yaml")
    recipe = loaded.recipe
    q = recipe.quality.model_copy(update={"task_gates": {"ql_code": GateOverride(confidence=0.9),
                                                         "ql_chat": GateOverride(max_drop=0.1)}})
    recipe = recipe.model_copy(update={"quality": q})
    three = for_family(recipe, 3)
    assert three.quality.gates.confidence == pytest.approx(1 - 0.05 / 3)
    assert three.quality.pooled.confidence == pytest.approx(1 - (1 - q.pooled.confidence) / 3)
    assert three.quality.task_gates["ql_code"].confidence == pytest.approx(1 - 0.1 / 3)  # its own, divided
    assert three.quality.task_gates["ql_chat"].confidence is None  # inherits the divided default
    assert three.performance.confidence == pytest.approx(1 - (1 - recipe.performance.confidence) / 3)
    # nothing else moves: margins, samples, the KL thresholds, the rest of the recipe
    assert three.quality.gates.non_inferiority_min_margin == q.gates.non_inferiority_min_margin
    assert three.quality.kl == q.kl and three.quantization == recipe.quantization
    assert for_family(recipe, 1) is recipe
    assert loaded.recipe.quality.gates.confidence == 0.95  # the file's recipe is not touched


def test_load_quality_is_judged_at_the_familys_share_too():
    recipe = load_recipe(RECIPES / "gptq-w4a16-at-load.yaml").recipe
    four = for_family(recipe, 4)
    assert four.load_quality.confidence == pytest.approx(1 - (1 - recipe.load_quality.confidence) / 4)
    assert four.load_quality.margin == recipe.load_quality.margin


def test_a_family_has_a_member_and_says_its_rule():
    with pytest.raises(ValueError):
        Family(size=0)
    said = Family(size=3, members=("a", "b", "c"), id="cmp-1").as_dict()
    assert said["rule"] == "bonferroni" and said["members"] == ["a", "b", "c"] and "1 - (1 - c) / 3" in said["why"]
    assert family_confidence(0.95, 1) == 0.95 and family_confidence(0.95, 5) == pytest.approx(0.99)
