"""The run's error budget: one ledger of how the chance of a wrong decision was spent."""

import pytest

from quantlab.core.verdicts import GateVerdict
from quantlab.recipe.performance import PerformanceSpec
from quantlab.recipe.quality import QualitySpec
from quantlab.release.error_budget import ledger


def q(scope, gate="non_inferiority", fail_confidence=1 - 0.05 / 3):
    return GateVerdict(check="quality", gate=gate, scope=scope, verdict="pass", value=0.0, limit=-0.05, evidence="d",
                       comparator="non_inferior", margin=0.05, confidence=0.95, fail_confidence=fail_confidence,
                       estimate=0.0, low=-0.01, high=0.01, test="tango-score")


def test_the_ledger_spends_each_checks_alpha_and_bounds_the_run():
    perf = PerformanceSpec.model_validate({"workloads": [{"name": "w", "prompt_tokens": 8, "output_tokens": 8,
                                                          "concurrency": [1]}]})
    p = GateVerdict(check="performance", gate="max_p99_ttft_ratio", scope="w/c1", verdict="pass", value=1.0,
                    limit=1.5, evidence="d", comparator="at_most", fail_confidence=1 - 0.05 / 3,
                    test="hierarchical-bootstrap")
    s = GateVerdict(check="stability", gate="max_server_errors", scope="bad_requests", verdict="pass", value=0,
                    limit=0, evidence="d", comparator="at_most", test="threshold")
    # three comparisons, one of them read by two gates (two margins on one interval): three tests
    verdicts = [q("a"), q("b"), q("c"), q("c", gate="max_drop"), p, s]
    book = ledger(verdicts, rule_version=2, quality=QualitySpec(), performance=perf)
    quality = book["checks"]["quality"]
    assert quality["tests"] == 3 and quality["gates"] == 4 and quality["test"] == ["tango-score"]
    assert quality["fail_alpha_family"] == pytest.approx(0.025) and quality["pass_alpha"] == pytest.approx(0.025)
    assert book["checks"]["performance"]["fail_alpha_family"] == pytest.approx(0.025)
    # one budget: an unchanged model is falsely blocked at most 5% of the time over both checks
    assert book["run"]["false_block_bound"] == pytest.approx(0.05)
    assert book["run"]["false_release_bound"] == pytest.approx(0.05)
    assert book["fixed_thresholds"]["gates"] == ["stability.max_server_errors@bad_requests"]
    assert book["rule_version"] == 2 and book["ledger_version"] == 3
    assert "warned_gates" not in book["run"]


def test_a_candidate_judged_in_a_family_records_it_and_the_familys_bound():
    from quantlab.recipe.family import Family, for_family
    from quantlab.recipe.file import Recipe

    recipe = Recipe.model_validate({"name": "r", "model": {"source": "default"},
                                    "quantization": {"method": "rtn", "scheme": "W8A16"}, "quality": {}})
    three = for_family(recipe, 3)
    verdict = q("a").model_copy(update={"confidence": three.quality.gates.confidence})
    book = ledger([verdict], rule_version=2, quality=three.quality,
                  family=Family(size=3, members=("a", "b", "c"), id="cmp"))
    assert book["checks"]["quality"]["pass_alpha"] == pytest.approx(0.025 / 3, abs=1e-6)
    assert book["family"]["size"] == 3 and book["family"]["rule"] == "bonferroni"
    assert book["family"]["false_release_bound"] == pytest.approx(0.025, abs=1e-5)  # the recipe's, over all three
    assert "family" not in ledger([q("a")], rule_version=2, quality=QualitySpec())
