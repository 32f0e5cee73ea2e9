"""Correct-answer goodput: documents right and within every SLO, per second, with the
count's exact interval scaled to a rate, and the cost per such answer."""

from __future__ import annotations

import pytest
from scipy.stats import beta

from quantlab.load_quality.goodput import correct_goodput, document_within_slo
from quantlab.performance.metrics import RequestRecord

SLO = {"ttft_ms": 200.0, "tpot_ms": 50.0, "e2e_ms": 1000.0}


def gen(ttft=0.1, e2e=0.5, tokens=9, outcome="ok"):
    """A generate request: TPOT = (e2e - ttft) / (tokens - 1)."""
    return RequestRecord(index=0, outcome=outcome, sent_at=0.0, ttft=ttft, e2e=e2e, output_tokens=tokens)


def loglik(e2e=0.15, ttft=None):
    """A loglikelihood request: one token, so no TPOT (its TTFT: the whole answer, unless given)."""
    return RequestRecord(index=0, outcome="ok", sent_at=0.0, ttft=e2e if ttft is None else ttft, e2e=e2e,
                         output_tokens=1)


def test_a_document_is_within_the_slos_when_every_request_is():
    assert document_within_slo([gen()], SLO)  # TPOT 0.05 s = 50 ms: at the limit, within
    assert not document_within_slo([gen(e2e=0.6)], SLO)  # TPOT 62.5 ms
    assert not document_within_slo([gen(ttft=0.25)], SLO)
    # four choices of a multiple-choice item: the TPOT limit does not apply to them, the others do
    assert loglik().tpot is None and document_within_slo([loglik()] * 4, SLO)
    assert not document_within_slo([loglik(), loglik(), loglik(e2e=1.2, ttft=0.1), loglik()], SLO)  # e2e
    assert not document_within_slo([loglik(), RequestRecord(index=1, outcome="error", sent_at=0.0)], SLO)
    assert not document_within_slo([], SLO)  # no timed request: not shown within


def test_counts_rate_interval_and_cost():
    docs = [("t", i) for i in range(10)]
    correct = {d: i < 7 for i, d in enumerate(docs[:9])}  # 7 right, 2 wrong, the tenth not answered
    correct[docs[8]] = None  # answered, its scorer gave no pass/fail
    records = {d: [loglik()] * 4 for d in docs[:9]}
    records[docs[1]] = [loglik(), loglik(e2e=0.3)]  # right, its TTFT over the SLO
    records[docs[7]] = [gen(ttft=0.05, e2e=0.2)]  # wrong, fast
    g = correct_goodput(correct, records, SLO, wall_s=4.0, price_per_hour=3.6, documents=10)
    assert (g.documents, g.answered, g.correct, g.within_slo, g.correct_within_slo) == (10, 9, 7, 8, 6)
    assert g.rate == pytest.approx(6 / 4.0)
    # the count's Clopper-Pearson bounds over 10 documents, scaled by 10 / 4 s
    assert g.low == pytest.approx(beta.ppf(0.025, 6, 5) * 10 / 4) and g.high == pytest.approx(
        beta.ppf(0.975, 7, 4) * 10 / 4)
    assert g.low < g.rate < g.high
    # 3.6 per hour = 0.001 per second, at 1.5 correct answers within the SLOs a second
    assert g.cost_per_correct_answer == pytest.approx(0.001 / 1.5)
    assert g.cost_low == pytest.approx(0.001 / g.high) and g.cost_high == pytest.approx(0.001 / g.low)
    assert g.as_dict()["correct_within_slo"] == 6


def test_without_documents_given_the_maps_keys_are_the_documents():
    g = correct_goodput({"a": True, "b": False}, {"a": [loglik()], "c": [loglik()]}, SLO, 2.0, None)
    assert (g.documents, g.answered, g.correct, g.within_slo, g.correct_within_slo) == (3, 2, 1, 2, 1)
    assert g.cost_per_correct_answer is None and g.cost_low is None  # no price
    assert g.high == pytest.approx(beta.ppf(0.975, 2, 2) * 3 / 2.0)


def test_no_correct_answer_has_no_cost_and_a_zero_lower_bound():
    g = correct_goodput({"a": False}, {"a": [loglik()]}, SLO, 1.0, 2.0, documents=5)
    assert g.rate == 0 and g.low == 0 and g.high == pytest.approx((1 - 0.025 ** (1 / 5)) * 5)
    assert g.cost_per_correct_answer is None and g.cost_high is None and g.cost_low == pytest.approx(
        2.0 / 3600 / g.high)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="wall_s"):
        correct_goodput({}, {}, SLO, 0.0, None)
    with pytest.raises(ValueError, match="fewer than"):
        correct_goodput({"a": True, "b": True}, {}, SLO, 1.0, None, documents=1)
