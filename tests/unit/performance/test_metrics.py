"""Latency, throughput, goodput and cost arithmetic on hand-made requests."""

from __future__ import annotations

import pytest

from quantlab.performance.metrics import RequestRecord, compare, costs, distribution, median_metrics, spread, summarize


def ok(i, ttft, e2e, out, prompt=10, itl=()):
    return RequestRecord(index=i, outcome="ok", sent_at=0.0, ttft=ttft, e2e=e2e, output_tokens=out,
                         prompt_tokens=prompt, itl=list(itl))


def test_percentiles_on_known_samples():
    d = distribution([0.001 * x for x in range(1, 101)])  # 1..100 ms
    assert d["mean"] == pytest.approx(50.5)
    assert d["median"] == pytest.approx(50.5)
    assert d["p90"] == pytest.approx(90.1)
    assert d["p99"] == pytest.approx(99.01)
    assert distribution([])["p99"] is None


def test_tpot_excludes_the_first_token():
    r = ok(0, ttft=0.5, e2e=1.5, out=11)
    assert r.tpot == pytest.approx(0.1)
    assert ok(1, ttft=0.5, e2e=0.5, out=1).tpot is None  # one token: no time per *next* token


def test_summary_counts_every_outcome_and_goodput():
    records = [
        ok(0, ttft=0.1, e2e=1.0, out=10),  # within SLO
        ok(1, ttft=0.3, e2e=1.2, out=10),  # TTFT too slow
        ok(2, ttft=0.1, e2e=2.0, out=10),  # TPOT 0.211 s too slow
        RequestRecord(index=3, outcome="error", sent_at=0.0, status=500, error="boom"),
        RequestRecord(index=4, outcome="timeout", sent_at=0.0, error="late"),
    ]
    m = summarize(records, wall_s=2.0, slo={"ttft_ms": 200, "tpot_ms": 150, "e2e_ms": None})
    assert (m["requests"], m["ok_requests"], m["error_requests"], m["timeout_requests"]) == (5, 3, 1, 1)
    assert m["error_rate"] == pytest.approx(0.4)
    assert m["output_tokens_per_s"] == pytest.approx(15.0)  # 30 tokens / 2 s
    assert m["total_tokens_per_s"] == pytest.approx(30.0)  # + 30 prompt tokens
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["goodput_requests_per_s"] == pytest.approx(0.5)  # only request 0 meets both SLOs
    assert m["slo_attainment"] == pytest.approx(0.2)
    assert m["ttft_ms"]["median"] == pytest.approx(100.0)


def test_no_slo_means_every_success_is_good():
    m = summarize([ok(0, 0.1, 1.0, 5), ok(1, 9.0, 20.0, 5)], wall_s=10, slo={"ttft_ms": None})
    assert m["goodput_requests_per_s"] == pytest.approx(0.2)


def test_cost_counts_failures_as_cost_not_answers():
    c = costs(3.6, wall_s=100, output_tokens=1000, good_requests=4)  # 0.1 currency units spent
    assert c["cost_per_million_output_tokens"] == pytest.approx(100.0)
    assert c["cost_per_successful_request"] == pytest.approx(0.025)
    assert costs(3.6, wall_s=100, output_tokens=0, good_requests=0) == {
        "cost_per_million_output_tokens": None, "cost_per_successful_request": None}
    assert costs(None, wall_s=1, output_tokens=1, good_requests=1)["cost_per_successful_request"] is None


def test_paired_ratios_with_spread():
    base = [{"output_tokens_per_s": 100.0, "ttft_ms": {"p99": 10.0}},
            {"output_tokens_per_s": 110.0, "ttft_ms": {"p99": 12.0}}]
    cand = [{"output_tokens_per_s": 130.0, "ttft_ms": {"p99": 10.0}},
            {"output_tokens_per_s": 143.0, "ttft_ms": {"p99": 12.6}}]
    cmp = compare(base, cand)
    tp = cmp["output_tokens_per_s"]
    assert tp["ratio"] == pytest.approx(1.3) and tp["ratio_min"] == pytest.approx(1.3)
    assert tp["noise"] == pytest.approx(max(10 / 105, 13 / 136.5))
    assert tp["beyond_noise"] is True  # 30% faster, runs vary by under 10%
    ttft = cmp["ttft_ms.p99"]
    assert ttft["ratio"] == pytest.approx(1.025) and ttft["beyond_noise"] is False
    assert compare(base[:1], cand[:1])["output_tokens_per_s"]["beyond_noise"] is None  # one repeat: cannot tell


def test_spread_and_median_metrics():
    assert spread([1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert spread([5.0]) is None
    med = median_metrics([{"a": 1.0, "d": {"x": 1.0}, "s": "k"}, {"a": 3.0, "d": {"x": 5.0}, "s": "k"},
                          {"a": 2.0, "d": {"x": None}, "s": "k"}])
    assert med == {"a": 2.0, "d": {"x": 3.0}, "s": "k"}
