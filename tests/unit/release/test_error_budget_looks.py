"""The ledger of a run judged look by look (`quality.samples: auto`): the alpha the looks
spent in all, not the last look's nominal level."""

import pytest

from quantlab.core.verdicts import GateVerdict
from quantlab.quality.sequential import boundary_confidence, nominal_levels
from quantlab.recipe.quality import QualitySpec
from quantlab.release.error_budget import ledger

PLAN = [40, 80, 160, 320, 400]  # the shipped suite's 400 items from 40 samples, x 2 a look


def judged(scope: str, n: int, m: int) -> GateVerdict:
    """A task's gate as the stage records it at its look of n samples, m comparisons gated."""
    return GateVerdict(check="quality", gate="non_inferiority", scope=scope, verdict="pass", value=0.0, limit=-0.05,
                       evidence="d", comparator="non_inferior", margin=0.05, samples=n, test="tango-score",
                       confidence=boundary_confidence(0.95, PLAN, n),
                       fail_confidence=boundary_confidence(1 - 0.05 / m, PLAN, n), estimate=0.0, low=-0.01, high=0.01)


def test_the_looks_spend_the_whole_alpha_and_the_ledger_says_so():
    spec = QualitySpec(samples="auto", sequential={"first": 40, "growth": 2})
    verdicts = [judged("a", 400, 2), judged("b", 80, 2)]
    book = ledger(verdicts, rule_version=3, quality=spec)
    quality = book["checks"]["quality"]
    # the boundary's total per side, whatever look a task stopped at: not the last look's nominal 0.0214
    # (nor its increment alone, 0.0128, which the ledger recorded before as the looks' spend)
    assert quality["pass_alpha"] == pytest.approx(0.025) and book["run"]["false_release_bound"] == pytest.approx(0.025)
    assert quality["fail_alpha_family"] == pytest.approx(0.025) and quality["fail_alpha_per_test"] == pytest.approx(
        0.0125)
    looks = quality["looks"]
    assert looks["first"] == 40 and looks["growth"] == 2 and looks["alpha_per_side"] == pytest.approx(0.025)
    assert "Lan-DeMets" in looks["rule"] and "Bonferroni" in looks["rule"]
    levels = nominal_levels(0.025, PLAN)
    assert looks["nominal_levels"]["a"]["pass"] == pytest.approx(levels[-1], abs=1e-8)
    assert looks["nominal_levels"]["b"] == {"samples": 80, "pass": pytest.approx(levels[1], abs=1e-8),
                                            "fail": pytest.approx(nominal_levels(0.0125, PLAN)[1], abs=1e-8)}
    assert levels[-1] == pytest.approx(0.0214, abs=1e-4)


def test_a_stricter_override_sets_what_the_looks_spend():
    spec = QualitySpec(samples="auto", task_gates={"a": {"confidence": 0.99}})
    book = ledger([judged("a", 400, 1)], rule_version=3, quality=spec)
    assert book["checks"]["quality"]["pass_alpha"] == pytest.approx(0.025)  # the largest alpha of any gate
    all_samples = ledger([judged("a", 400, 1)], rule_version=3, quality=QualitySpec())["checks"]["quality"]
    assert "looks" not in all_samples and all_samples["samples"] == "all"
