"""The comparison's table (reports/comparison_table.py) as Markdown, HTML and the candidates' plot."""

from __future__ import annotations

from quantlab.pipeline.candidates.select import choose
from quantlab.recipe.selection import SelectionSpec
from quantlab.reports.comparison_records import CandidateSummary
from quantlab.reports.comparison_table import as_json, html, markdown
from quantlab.reports.plots import pareto

ROWS = [
    {"name": "gptq", "decision": "release", "output_tokens_per_s": 120.0, "peak_memory_bytes": 1.2e9,
     "worst_recovery": 0.93},
    {"name": "awq", "decision": "blocked", "output_tokens_per_s": 130.0, "peak_memory_bytes": 1.1e9,
     "worst_recovery": 0.61, "failed_gates": ["quality.min_recovery@ql_json_extract"]},
]
BASELINE = {"name": "baseline", "decision": "baseline", "output_tokens_per_s": 100.0, "peak_memory_bytes": 1.6e9}


def the_choice():
    return choose([CandidateSummary("gptq", "release", output_tokens_per_s=120.0),
                   CandidateSummary("awq", "blocked", failed_gates=["quality.min_recovery@ql_json_extract"],
                                    output_tokens_per_s=130.0)], SelectionSpec(rule="highest_throughput"))


def test_markdown_and_html_mark_the_chosen_one_and_say_why_the_others_lost():
    choice = the_choice()
    md = markdown(BASELINE, ROWS, choice)
    assert "| gptq (chosen) |" in md and "| baseline |" in md
    assert "awq: blocked by quality.min_recovery@ql_json_extract" in md
    page = html(BASELINE, ROWS, choice, refused={"fp8": "refused by its preflight: no FP8 kernel"})
    assert "gptq (chosen)" in page and "fp8: refused by its preflight" in page and "<img" not in page
    assert as_json(BASELINE, ROWS, choice)["chosen"] == "gptq"


def test_the_plot_has_every_candidate_with_figures(tmp_path):
    out = pareto([{**BASELINE, "worst_recovery": 1.0}, *ROWS], tmp_path / "p.png", "test")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # no candidate with both figures: nothing to draw
    assert pareto([{"name": "x", "decision": "release"}], tmp_path / "q.png", "test") is None
