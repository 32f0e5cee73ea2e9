"""Quality at load in a comparison's row: the most right answers within the SLOs per second
over the points, and the lowest cost per correct answer, which the Pareto plot then puts on
its x axis in place of the cost per successful answer."""

from __future__ import annotations

from quantlab.core.results import LoadQualityLevel, LoadQualityPoint, LoadQualityResult, LoadQualityRole
from quantlab.reports.comparison_summary import correct_answers
from quantlab.reports.plots import pareto, pareto_axis


def level(rate, cost):
    return LoadQualityLevel(accuracy=0.5, correct=10, documents=20, answered=20,
                            goodput={"rate": rate, "cost_per_correct_answer": cost})


def point(name, rate, cost):
    return LoadQualityPoint(name=name, workload="w", point=name.split("/")[1], concurrency=4,
                            roles={"candidate": LoadQualityRole(load=level(rate, cost)),
                                   "baseline": LoadQualityRole(load=level(rate / 2, cost * 2))})


def test_the_row_takes_the_best_point_for_each_figure():
    lq = LoadQualityResult(points=[point("w/c4", 2.0, 0.0002), point("w/c8", 3.0, 0.0003)])
    assert correct_answers(lq, "candidate") == {"correct_answers_per_s": 3.0, "correct_answers_at": "w/c8",
                                                "cost_per_correct_answer": 0.0002}
    assert correct_answers(lq, "baseline")["correct_answers_per_s"] == 1.5
    assert correct_answers(None, "candidate") == {}


def test_the_pareto_plot_prefers_cost_per_correct_answer(tmp_path):
    rows = [{"name": "a", "decision": "release", "worst_recovery": 0.98, "cost_per_correct_answer": 0.001,
             "cost_per_successful_request": 0.0005, "peak_memory_bytes": 1},
            {"name": "b", "decision": "blocked", "worst_recovery": 0.9, "cost_per_correct_answer": 0.002,
             "cost_per_successful_request": 0.0004, "peak_memory_bytes": 2}]
    assert pareto_axis(rows) == "cost_per_correct_answer"
    assert pareto_axis([{k: v for k, v in r.items() if k != "cost_per_correct_answer"} for r in rows]) == \
        "cost_per_successful_request"
    assert pareto_axis([{"name": "c"}]) == "output_tokens_per_s"
    out = pareto(rows, tmp_path / "pareto.png", "two")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
