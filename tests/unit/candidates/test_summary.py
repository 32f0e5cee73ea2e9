"""A judged run reduced to its comparison row, and the comparison table, from a real
recorded run (the tiny model's blocked run the report tests use)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantlab.candidates.select import choose
from quantlab.candidates.spec import SelectionSpec
from quantlab.candidates.summary import summarize
from quantlab.candidates.table import as_json, markdown
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
