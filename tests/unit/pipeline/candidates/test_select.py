"""Choosing among candidates, and the block order they are measured in (pure parts of
the multi-candidate run)."""

from __future__ import annotations

import pytest

from quantlab.pipeline.candidates.schedule import block_order, paired_baseline, serving_groups
from quantlab.pipeline.candidates.select import choose
from quantlab.recipe.selection import SelectionSpec
from quantlab.reports.comparison_records import CandidateSummary


def test_blocks_sweep_forward_then_back_with_the_baseline_between():
    order = block_order(["gptq", "awq", "w8a8"], repeats=3)
    assert [role for _, role in order] == ["baseline", "gptq", "awq", "w8a8", "baseline", "w8a8", "awq", "gptq",
                                           "baseline", "gptq", "awq", "w8a8"]
    assert paired_baseline(order, "awq") == [0, 1, 2]
    # nobody is always measured right after the baseline
    after = [order[i + 1][1] for i, (_, role) in enumerate(order[:-1]) if role == "baseline"]
    assert after == ["gptq", "w8a8", "gptq"]
    with pytest.raises(ValueError, match="unique"):
        block_order(["a", "a"], 1)
    with pytest.raises(ValueError, match="baseline's name"):
        block_order(["baseline"], 1)


@pytest.mark.parametrize("at_once, fits, groups", [
    (None, None, [["a", "b", "c"]]),  # all at once
    (2, None, [["a", "b"], ["c"]]),  # as the recipe says
    (None, 1, [["a"], ["b"], ["c"]]),  # as memory allows
    (2, 5, [["a", "b"], ["c"]]),  # memory allows more than asked
])
def test_candidates_are_served_in_groups_beside_the_baseline(at_once, fits, groups):
    assert serving_groups(["a", "b", "c"], at_once, fits) == groups


def test_no_group_when_not_one_candidate_fits():
    with pytest.raises(ValueError, match="not even one"):
        serving_groups(["a", "b"], None, 0)


def c(name, decision="release", failed=(), not_shown=(), cost=None, mem=None, tps=None, quality=None):
    return CandidateSummary(name, decision, list(failed), list(not_shown), cost, mem, tps, quality)


def test_the_cheapest_released_candidate_is_chosen_and_the_others_say_why_not():
    pool = [c("gptq", cost=0.004, mem=1.0e9, tps=300), c("awq", cost=0.003, mem=1.1e9, tps=280),
            c("fp8", "blocked", failed=["quality.non_inferiority@ql_code"], cost=0.001),
            c("w8a8", "not_shown", not_shown=["quality.non_inferiority@ql_chat"], cost=0.002)]
    ch = choose(pool, SelectionSpec())
    assert ch.chosen == "awq" and ch.ranking == ["awq", "gptq"]
    assert ch.why.startswith("chose awq: released by every required gate, cost_per_success 0.003")
    assert "next: gptq" in ch.why
    assert ch.lost["fp8"] == "blocked by quality.non_inferiority@ql_code"  # cheaper, but blocked
    assert ch.lost["w8a8"].startswith("not shown: quality.non_inferiority@ql_chat")
    assert ch.lost["gptq"].startswith("released, but cost_per_success: 0.004")
    assert choose(pool, SelectionSpec(rule="least_memory")).chosen == "gptq"
    assert choose(pool, SelectionSpec(rule="highest_throughput")).chosen == "gptq"


def test_a_missing_figure_ranks_last_not_first():
    ch = choose([c("a"), c("b", cost=0.01)], SelectionSpec())
    assert ch.ranking == ["b", "a"] and "no per successful answer figure" in ch.lost["a"]


def test_weighted_score_balances_cost_and_quality():
    pool = [c("cheap", cost=0.001, quality=0.90), c("good", cost=0.002, quality=1.00)]
    assert choose(pool, SelectionSpec(rule="weighted", weights={"cost_per_success": 1})).chosen == "cheap"
    assert choose(pool, SelectionSpec(rule="weighted", weights={"cost_per_success": 1, "quality": 20})).chosen \
        == "good"


def test_when_none_is_released_the_closest_is_named_with_its_gates():
    pool = [c("a", "blocked", failed=["g1", "g2"]), c("b", "blocked", failed=["quality.min_recovery@ql_chat"]),
            c("c", "not_shown", not_shown=["n1", "n2", "n3", "n4"])]
    ch = choose(pool, SelectionSpec())
    assert ch.chosen is None and ch.closest == "c" and ch.ranking == []
    assert ch.why == "no candidate released; the closest is c: not shown: n1, n2, n3 and 1 more"


def test_selection_spec_errors_name_the_field():
    with pytest.raises(ValueError, match="unknown figure"):
        SelectionSpec(rule="weighted", weights={"speed": 1})
    with pytest.raises(ValueError, match="needs selection.weights"):
        SelectionSpec(rule="weighted")
    with pytest.raises(ValueError, match="only read by rule 'weighted'"):
        SelectionSpec(weights={"memory": 1})


def test_without_a_price_cost_per_success_ranks_by_successful_answers_per_second():
    pool = [CandidateSummary("gptq", "release", goodput_at_slo=1.5), CandidateSummary("awq", "release",
                                                                                        goodput_at_slo=2.0)]
    ch = choose(pool, SelectionSpec())
    assert ch.chosen == "awq" and "no performance.price_per_hour" in ch.why
    assert ch.lost["gptq"].startswith("released, but goodput_at_slo: 1.5 successful answers/s")
    # with a price the cost itself decides, and nothing is said about a fallback
    priced = [CandidateSummary("gptq", "release", cost_per_successful_request=0.002, goodput_at_slo=1.5),
              CandidateSummary("awq", "release", cost_per_successful_request=0.003, goodput_at_slo=2.0)]
    ch = choose(priced, SelectionSpec())
    assert ch.chosen == "gptq" and "price_per_hour" not in ch.why
