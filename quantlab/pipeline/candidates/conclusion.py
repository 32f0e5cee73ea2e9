"""A comparison's conclusion: each candidate's summary row, the choice, and the outcome its
files are written from (reports/comparison_report.py writes the table, JSON, HTML with its
plot, JUnit)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from quantlab.pipeline.candidates.select import choose
from quantlab.recipe.selection import SelectionSpec
from quantlab.reports.comparison_records import ComparisonOutcome
from quantlab.reports.comparison_report import write_comparison
from quantlab.reports.comparison_summary import on_common_baseline, summarize
from quantlab.core.progress import Progress
from quantlab.pipeline.candidates.members import Candidate, Comparison


def summary_rows(judged: list[Candidate], *, decide: bool) -> list[tuple[Any, dict[str, Any]]]:
    """Each judged candidate's (summary, row), speed figures on its first candidate's
    baseline's scale where groups were measured apart. `decide`: before the release
    stages ran (each decision made now)."""
    pairs, baselines = [], []
    for c in judged:
        decided = c.lifecycle.decide().record if decide and c.active else None
        summary, row = summarize(c.name, c.run.record, decided=decided)
        if c.failed:  # say why it was not judged, not only that it was not
            summary = replace(summary, failed_gates=[f"failed: {c.failed}"])
            row.update(failed=c.failed, failed_gates=summary.failed_gates)
        row["source"] = c.origin
        row["served_at"] = _served_at(c)
        perf = c.run.record.result("performance")
        row["measured_together"] = getattr(perf, "measured_together", None)
        pairs.append((summary, row))
        baselines.append(summarize("baseline", c.run.record, role="baseline")[1] if perf is not None else None)
    return on_common_baseline(pairs, baselines)


def conclude(folder: Path, cands: list[Candidate], selection: SelectionSpec, progress: Progress) -> Comparison:
    """Summaries, the choice, and the comparison's files (table, JSON, JUnit)."""
    judged = [c for c in cands if c.run is not None and c.refused is None]
    pairs = summary_rows(judged, decide=False)
    summaries, rows = [s for s, _ in pairs], [row for _, row in pairs]
    baseline_row = None
    for c in judged:
        if c.run.record.result("performance") is not None or c.run.record.result("quality") is not None:
            baseline_row = summarize("baseline", c.run.record, role="baseline")[1]
            break
    choice = choose(summaries, selection) if summaries else None
    outcome = ComparisonOutcome(
        baseline_row=baseline_row, rows=rows, choice=choice, refused={c.name: c.refused for c in cands if c.refused},
        selection=selection, runs={c.name: str(c.run.path.relative_to(folder)) for c in cands if c.run is not None},
        family=next((c.ctx.family for c in judged if c.ctx is not None and c.ctx.family is not None), None),
        records=[c.run.record for c in judged])
    table, data = write_comparison(folder, outcome, progress)
    exit_code = 0 if choice and choice.chosen else (1 if summaries else 3)
    return Comparison(folder, cands, choice, table, exit_code, data)


def _served_at(c: Candidate) -> str:
    """Where its server ran: launched on this host (or a Ray node), or the endpoint it was given."""
    spec = c.loaded.recipe.serve
    placement = c.run.record.placement if c.run is not None else None
    if placement and spec.mode == "launch":
        return f"Ray node {placement['node']}"
    if spec.mode == "endpoint":
        return spec.candidate_endpoint or spec.endpoint or "endpoint"
    return "this host" if spec.mode == "launch" else "its serve.command"
