"""A comparison's files (reports/comparison_report.py) written from its outcome, built as
the pipeline builds it from a real recorded run (the tiny model's blocked run)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from quantlab.core.layout import COMPARISON_FILE
from quantlab.core.run import RunRecord
from quantlab.pipeline.candidates.select import choose
from quantlab.recipe.family import Family
from quantlab.recipe.selection import SelectionSpec
from quantlab.reports.comparison_records import ComparisonOutcome
from quantlab.reports.comparison_report import write_comparison
from quantlab.reports.comparison_summary import summarize

RECORD = Path(__file__).resolve().parents[2] / "data" / "run-record-blocked.json"
GATES = "performance.max_p99_ttft_ms@short/c1, performance.max_p99_ttft_ms@short/c4"


@pytest.fixture(scope="module")
def record() -> RunRecord:
    return RunRecord.model_validate(json.loads(RECORD.read_text()))


def outcome(record: RunRecord, **changes) -> ComparisonOutcome:
    summary, row = summarize("rtn", record)
    fields = dict(baseline_row=summarize("baseline", record, role="baseline")[1], rows=[row],
                  choice=choose([summary], SelectionSpec()), refused={"fp8": "no FP8 kernel"},
                  selection=SelectionSpec(), runs={"rtn": "candidates/rtn/r1"},
                  family=Family(size=2, members=("fp8", "rtn")), records=[record])
    return ComparisonOutcome(**{**fields, **changes})


def test_every_file_of_a_judged_comparison(record, tmp_path):
    said: list[str] = []
    table, data = write_comparison(tmp_path, outcome(record), said.append)
    assert said == [] and sorted(p.name for p in tmp_path.iterdir()) == [
        "comparison.html", "comparison.json", "comparison.md", "junit.xml", "pareto.png"]
    md = (tmp_path / "comparison.md").read_text()
    assert md == "# Comparison\n\n" + table
    lines = md.splitlines()
    assert lines[4].startswith("| baseline | baseline | 7.22e-06 | 38.5 | 3.33 | 2,097,152 | 615 |")
    assert lines[5].startswith("| rtn | blocked | 6.6e-06 | 42.1 | 3.36 | 2,097,152 | 674 |")
    assert lines[7:10] == [f"no candidate released; the closest is rtn: blocked by {GATES}",
                           f"- rtn: blocked by {GATES}", "- fp8: no FP8 kernel"]
    assert lines[11].startswith("Judged as a family of 2 (comparison): Bonferroni over 2 candidate(s)")
    assert json.loads((tmp_path / COMPARISON_FILE).read_text()) == data
    assert list(data) == ["baseline", "candidates", "chosen", "why", "ranking", "closest", "lost", "refused",
                          "selection", "runs", "family"]
    assert data["chosen"] is None and data["closest"] == "rtn" and data["runs"] == {"rtn": "candidates/rtn/r1"}
    assert data["selection"] == SelectionSpec().model_dump(mode="json") and data["family"]["size"] == 2
    page = (tmp_path / "comparison.html").read_text()
    assert "<td>rtn</td>" in page and "fp8: no FP8 kernel" in page and "data:image/png;base64," in page
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert root.tag == "testsuites" and root.get("name") == "quantlab comparison"
    assert [s.get("name") for s in root] == ["quantlab.tiny-golden"] and root[0].get("failures") == "2"


def test_no_candidate_judged_writes_the_table_json_and_junit_only(record, tmp_path):
    table, data = write_comparison(tmp_path, outcome(record, baseline_row=None, rows=[], choice=None, runs={},
                                                     family=None, records=[]), print)
    assert table == "no candidate could be judged\n- fp8: no FP8 kernel\n"
    assert data == {"candidates": [], "chosen": None, "refused": {"fp8": "no FP8 kernel"},
                    "selection": SelectionSpec().model_dump(mode="json"), "runs": {}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comparison.json", "comparison.md", "junit.xml"]
    assert (tmp_path / "junit.xml").read_text() == '<testsuites name="quantlab comparison" />'


def test_a_plot_that_cannot_be_drawn_is_said_and_the_page_has_none(record, tmp_path):
    (tmp_path / "pareto.png").mkdir()  # a folder where the plot goes
    said: list[str] = []
    write_comparison(tmp_path, outcome(record), said.append)
    assert len(said) == 1 and said[0].startswith("the comparison plot could not be drawn: ")
    assert "<img" not in (tmp_path / "comparison.html").read_text()
