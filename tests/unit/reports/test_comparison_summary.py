"""A judged run reduced to its comparison row, and the comparison table, from a real
recorded run (the tiny model's blocked run the report tests use)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantlab.pipeline.candidates.select import choose
from quantlab.recipe.selection import SelectionSpec
from quantlab.reports.comparison_summary import summarize
from quantlab.reports.comparison_table import as_json, markdown
from quantlab.core.run import RunRecord

RECORD = Path(__file__).resolve().parents[2] / "data" / "run-record-blocked.json"


@pytest.fixture(scope="module")
def record() -> RunRecord:
    return RunRecord.model_validate(json.loads(RECORD.read_text()))


def test_a_blocked_run_summarised_with_its_gates_and_costs(record):
    s, row = summarize("rtn", record)
    assert s.decision == "blocked" and s.failed_gates == ["performance.max_p99_ttft_ms@short/c1",
                                                          "performance.max_p99_ttft_ms@short/c4"]
    perf = record.result("performance")
    assert s.cost_per_successful_request == perf.cost["candidate"]["cost_per_successful_request"]
    assert s.peak_memory_bytes == perf.memory["candidate"]["peak_bytes"]
    top = max(perf.points, key=lambda p: p.candidate["output_tokens_per_s"])
    assert s.output_tokens_per_s == top.candidate["output_tokens_per_s"] and row["at"] == "short/c4"
    assert row["p99_ttft_ms"] == top.candidate["ttft_ms"]["p99"]
    assert s.worst_slice_recovery is None  # this run had no quality section
    base, brow = summarize("baseline", record, role="baseline")
    assert brow["decision"] == "baseline" and base.cost_per_successful_request == \
        perf.cost["baseline"]["cost_per_successful_request"]


def test_a_run_without_a_decision_is_not_a_candidate_to_ship(record):
    stopped = record.model_copy(deep=True)
    del stopped.stages["release"]
    stopped.status = "failed"
    s, _ = summarize("x", stopped)
    assert s.decision == "blocked" and s.failed_gates == ["run failed before its release decision"]


def test_the_comparison_table_and_json(record):
    s, row = summarize("rtn", record)
    _, brow = summarize("baseline", record, role="baseline")
    choice = choose([s], SelectionSpec())
    md = markdown(brow, [row], choice)
    lines = md.splitlines()
    assert lines[0].startswith("| candidate | decision | cost / success |")
    assert lines[2].startswith("| baseline | baseline |") and lines[3].startswith("| rtn | blocked |")
    assert "no candidate released; the closest is rtn: blocked by performance.max_p99_ttft_ms@short/c1" in md
    data = as_json(brow, [row], choice)
    assert data["chosen"] is None and data["closest"] == "rtn" and json.dumps(data)


def test_candidates_measured_beside_other_baseline_blocks_are_ranked_on_one_scale():
    from quantlab.reports.comparison_records import CandidateSummary
    from quantlab.reports.comparison_summary import on_common_baseline

    def pair(name, tps, good, cost):
        return (CandidateSummary(name, "release", output_tokens_per_s=tps, goodput_at_slo=good,
                                 cost_per_successful_request=cost),
                {"name": name, "output_tokens_per_s": tps, "goodput_at_slo": good, "cost_per_successful_request": cost})

    # group 1: a and b beside a baseline at 200 tok/s; group 2: c beside a quieter machine's 250 tok/s
    pairs = [pair("a", 120.0, 10.0, 1.0), pair("b", 125.0, 10.5, 0.95), pair("c", 170.0, 14.0, 0.7)]
    g1, g2 = {"output_tokens_per_s": 200.0, "goodput_at_slo": 16.0}, {"output_tokens_per_s": 250.0,
                                                                      "goodput_at_slo": 20.0}
    out = on_common_baseline(pairs, [g1, g1, g2])
    assert out[:2] == pairs[:2]  # one sweep, one baseline: as measured
    c, row = out[2]
    assert c.output_tokens_per_s == pytest.approx(170 * 200 / 250)  # 136: still ahead of a and b, by less
    assert c.goodput_at_slo == pytest.approx(14 * 16 / 20)
    assert c.cost_per_successful_request == pytest.approx(0.7 * 20 / 16)
    assert row["measured_as"]["output_tokens_per_s"] == 170.0 and row["baseline_scale"]["output_tokens_per_s"] == 0.8
    assert choose([s for s, _ in out], SelectionSpec(rule="highest_throughput")).chosen == "c"
    # a candidate twice as fast only because its group's machine was: no longer chosen
    out = on_common_baseline([pairs[1], pair("d", 240.0, 20.0, 0.5)], [g1, {"output_tokens_per_s": 400.0}])
    assert out[1][0].output_tokens_per_s == pytest.approx(120.0)
    assert choose([s for s, _ in out], SelectionSpec(rule="highest_throughput")).chosen == "b"
    lines = markdown(None, [r for _, r in out], choose([s for s, _ in out], SelectionSpec(rule="highest_throughput")))
    assert "d: x0.500" in lines and "240 out tok/s as measured" in lines
    # without a performance record there is nothing to scale
    assert on_common_baseline(pairs[:1], [None]) == pairs[:1]
