"""The load_quality gates: the candidate at load against the baseline at load and against
itself at concurrency 1, non-inferiority on Tango's interval (checked here against the
score statistic at a numerically found restricted maximum likelihood), failing closed on
documents not answered; and the flip rate between concurrency 1 and load."""

from __future__ import annotations

import math

import pytest
from pydantic import TypeAdapter
from scipy.optimize import minimize_scalar
from scipy.stats import beta, binomtest, norm

from quantlab.core.results import LoadQualityLevel, LoadQualityPoint, LoadQualityResult, LoadQualityRole, StageOutput
from quantlab.load_quality.gates import PointAnswers, flip_rate, level_counts, pair, verdicts
from quantlab.recipe.load_quality import LoadQualitySpec
from quantlab.release.gate_consistency import verdict_contradiction

DOCS = tuple(("a", i) for i in range(120)) + tuple(("b", i) for i in range(80))
BASE_RIGHT = 140  # the baseline is right on the first 140 of the 200 documents


def answers(right: set[int], *, missing: set[int] = frozenset(), unscored: set[int] = frozenset()):
    return {d: (None if i in unscored else i in right) for i, d in enumerate(DOCS) if i not in missing}


def baseline(**kw):
    return answers(set(range(BASE_RIGHT)), **kw)


def candidate(base_only: int, cand_only: int, **kw):
    """The baseline's answers with `base_only` of its right ones wrong and `cand_only` of its wrong ones right."""
    return answers(set(range(base_only, BASE_RIGHT)) | set(range(BASE_RIGHT, BASE_RIGHT + cand_only)), **kw)


def point(name="chat/c8", load_cand=None, load_base=None, c1_cand=None, concurrency=8):
    return PointAnswers(point=name, docs=DOCS, concurrency=concurrency,
                        load={"baseline": baseline() if load_base is None else load_base,
                              "candidate": candidate(0, 0) if load_cand is None else load_cand},
                        c1={"baseline": baseline(), "candidate": candidate(0, 0) if c1_cand is None else c1_cand})


def score_z(cand_only: int, base_only: int, n: int, d0: float) -> float:
    """Tango's score statistic at d0 with the baseline-only cell's restricted maximum likelihood
    found numerically (the module under test has it in closed form)."""
    rest = n - cand_only - base_only

    def minus_loglik(q):  # q: the baseline-only cell; candidate-only is q + d0
        return -(cand_only * math.log(q + d0) + base_only * math.log(q) + rest * math.log(1 - 2 * q - d0))

    lo, hi = max(0.0, -d0) + 1e-12, (1 - d0) / 2 - 1e-12
    q = minimize_scalar(minus_loglik, bounds=(lo, hi), method="bounded", options={"xatol": 1e-13}).x
    return (cand_only - base_only - n * d0) / math.sqrt(n * (2 * q + d0 - d0 * d0))


def test_an_unchanged_candidate_passes_both_gates_with_its_numbers_said():
    spec = LoadQualitySpec()
    at_load, versus = verdicts(spec, [point(load_cand=candidate(3, 4), c1_cand=candidate(0, 0))])
    assert (at_load.check, at_load.gate, at_load.scope, at_load.verdict) == ("load_quality", "at_load", "chat/c8",
                                                                           "pass")
    assert at_load.samples == 200 and at_load.estimate == pytest.approx(1 / 200)
    # Tango's bounds: where the score statistic crosses -+1.96
    z = norm.ppf(0.975)
    assert score_z(4, 3, 200, at_load.low) == pytest.approx(z, abs=1e-4)
    assert score_z(4, 3, 200, at_load.high) == pytest.approx(-z, abs=1e-4)
    assert at_load.value == at_load.low > -0.05 and at_load.limit == -0.05 and at_load.margin == 0.05
    assert at_load.fail_confidence == pytest.approx(1 - 0.05 / 2) and at_load.test == "tango-score"
    p = binomtest(3, 7, 0.5).pvalue
    assert f"flips: 3 right only for the baseline, 4 only for the candidate at load (McNemar p {p:.3g})" in \
        at_load.evidence
    assert "candidate at load 0.7050, the baseline at load 0.7000 over 200 paired documents" in at_load.evidence
    assert versus.gate == "versus_c1" and versus.verdict == "pass"  # c1: the baseline's answers, load: 4 vs 3
    assert not any(verdict_contradiction(v) for v in (at_load, versus))


def test_a_candidate_wrong_under_load_only_is_blocked_at_load_and_against_itself_at_c1():
    spec = LoadQualitySpec()
    broken = candidate(40, 2)  # 40 right answers lost at load, 2 gained
    got = verdicts(spec, [point("chat/c1", concurrency=1), point("chat/c8", load_cand=broken)])
    by = {(v.scope, v.gate): v for v in got}
    assert set(by) == {("chat/c1", "at_load"), ("chat/c8", "at_load"), ("chat/c8", "versus_c1")}  # c1: no versus
    assert by[("chat/c1", "at_load")].verdict == "pass"
    assert by[("chat/c8", "at_load")].verdict == by[("chat/c8", "versus_c1")].verdict == "fail"
    v = by[("chat/c8", "versus_c1")]
    assert v.estimate == pytest.approx(-38 / 200) and v.high < -0.05
    assert "the candidate at concurrency 1 0.7000" in v.evidence
    assert "flips: 40 right only for the candidate at c1, 2 only for the candidate at load" in v.evidence
    assert all(x.fail_confidence == pytest.approx(1 - 0.05 / 3) for x in got)
    assert "Bonferroni over 3 gates" in v.evidence
    assert not any(verdict_contradiction(x) for x in got)
    assert [v.gate for v in verdicts(LoadQualitySpec(versus_c1=False), [point(load_cand=broken)])] == ["at_load"]


def test_below_the_margin_at_its_own_confidence_but_not_the_families_is_inconclusive():
    spec = LoadQualitySpec()
    got = verdicts(spec, [point("chat/c8", load_cand=candidate(22, 2)), point("chat/c16")])
    v = got[0]  # 4 gates: the fail side at 98.75%
    assert v.gate == "at_load" and v.verdict == "inconclusive" and v.high < -0.05
    assert "the whole 95% interval is below -0.05, but not the fail side's" in v.evidence
    assert v.warnable and v.samples_to_verdict is not None


def test_an_interval_across_the_margin_is_inconclusive_with_the_documents_that_would_tell():
    v = verdicts(LoadQualitySpec(versus_c1=False), [point(load_cand=candidate(10, 4))])[0]
    assert v.verdict == "inconclusive" and v.low < -0.05 < v.high and v.estimate == pytest.approx(-0.03)
    half = (v.high - v.low) / 2
    assert v.samples_to_verdict == math.ceil(200 * (half / 0.02) ** 2)
    assert f"about {v.samples_to_verdict} paired documents would tell" in v.evidence and v.warnable


def test_a_document_the_candidate_did_not_answer_or_score_counts_wrong():
    # 30 of the baseline's right answers unanswered and 5 unscored at load: 35 right for the baseline only
    lost = candidate(0, 0, missing=set(range(30)), unscored=set(range(30, 35)))
    p = pair(DOCS, lost, baseline())
    assert (p.n, p.reference_only, p.judged_only, p.unanswered, p.unscored, p.reference_missing) == \
        (200, 35, 0, 30, 5, 0)
    v = verdicts(LoadQualitySpec(versus_c1=False), [point(load_cand=lost)])[0]
    assert v.verdict == "fail" and v.estimate == pytest.approx(-35 / 200)
    assert "30 the candidate did not answer at load, counted wrong" in v.evidence
    assert "5 whose answer the scorer could not score, counted wrong" in v.evidence


def test_a_document_the_reference_did_not_answer_is_left_out_and_said():
    v = verdicts(LoadQualitySpec(versus_c1=False),
                 [point(load_cand=candidate(0, 0), load_base=baseline(missing=set(range(150, 200))))])[0]
    assert v.samples == 150 and v.verdict == "pass"
    assert "50 left out: the baseline at load did not answer or score them" in v.evidence


@pytest.mark.parametrize("missing, words", [(set(range(200)), "no document answered by both sides"),
                                             (set(range(170)), "only 30 paired documents, fewer than "
                                                               "load_quality.min_items 40")])
def test_too_few_paired_documents_are_not_judged_and_not_warnable(missing, words):
    v = verdicts(LoadQualitySpec(versus_c1=False), [point(load_base=baseline(missing=missing))])[0]
    assert v.verdict == "inconclusive" and v.value is None and v.estimate is None and not v.warnable
    assert words in v.evidence and "release.policy cannot warn it through" in v.evidence
    assert not v.within_limit()


def test_a_point_without_any_answers_is_not_judged():
    empty = PointAnswers(point="chat/c8", docs=DOCS, load={}, c1={}, concurrency=8)
    got = verdicts(LoadQualitySpec(), [empty])
    assert [(v.gate, v.verdict, v.warnable) for v in got] == [("at_load", "inconclusive", False),
                                                             ("versus_c1", "inconclusive", False)]


def test_the_flip_rate_between_c1_and_load_with_its_exact_interval():
    c1 = answers(set(range(100)))
    load = answers(set(range(6, 100)) | {150, 151}, missing={199}, unscored={198})
    fr = flip_rate(c1, load)
    assert (fr.k, fr.n) == (8, 198) and fr.rate == pytest.approx(8 / 198)  # 198, 199: not scored at both
    assert fr.low == pytest.approx(beta.ppf(0.025, 8, 191)) and fr.high == pytest.approx(beta.ppf(0.975, 9, 190))
    none = flip_rate(c1, c1)
    assert (none.k, none.n, none.low) == (0, 200, 0.0) and none.high == pytest.approx(1 - 0.025 ** (1 / 200))
    empty = flip_rate({}, load)
    assert (empty.n, empty.rate, empty.low, empty.high) == (0, None, None, None)


def test_level_counts_over_the_slice():
    c = level_counts(DOCS, candidate(0, 0, missing={0, 1}, unscored={2}))
    assert (c.documents, c.correct, c.answered, c.unscored) == (200, 137, 198, 1)
    assert c.accuracy == pytest.approx(137 / 200) and level_counts((), {}).accuracy is None


def test_the_result_holds_the_gates_and_reads_back_through_the_stage_union():
    got = verdicts(LoadQualitySpec(), [point(load_cand=candidate(3, 4))])
    level = LoadQualityLevel(accuracy=0.7, correct=140, documents=200, answered=200, seconds=12.5,
                             goodput={"rate": 1.2})
    role = LoadQualityRole(load=level, c1=level, flips=flip_rate(baseline(), baseline()).as_dict())
    result = LoadQualityResult(points=[LoadQualityPoint(name="chat/c8", workload="chat", point="c8", concurrency=8,
                                                        roles={"baseline": role, "candidate": role})],
                               tasks=["a", "b"], items={"a": 120, "b": 80}, gates=got, seconds={"baseline": 30.0})
    back = TypeAdapter(StageOutput).validate_python(result.model_dump(mode="json"))
    assert isinstance(back, LoadQualityResult) and back == result
