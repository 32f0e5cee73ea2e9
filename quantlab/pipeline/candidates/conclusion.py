"""A comparison's conclusion: each candidate's summary row, the choice, and the comparison's
files (table, JSON, HTML with its plot, JUnit)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from quantlab.core.layout import COMPARISON_FILE  # noqa: F401 (also read from here)
from quantlab.pipeline.candidates.select import choose
from quantlab.recipe.selection import SelectionSpec
from quantlab.pipeline.candidates.summary import on_common_baseline, summarize
from quantlab.pipeline.candidates.table import as_json, html, markdown
from quantlab.core.progress import Progress
from quantlab.core.fsutil import write_json_atomic, write_text_atomic
from quantlab.pipeline.candidates.members import Candidate, Comparison


RESULT_FILE = COMPARISON_FILE


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
    from quantlab.reports.report import render_junit

    judged = [c for c in cands if c.run is not None and c.refused is None]
    pairs = summary_rows(judged, decide=False)
    summaries, rows = [s for s, _ in pairs], [row for _, row in pairs]
    baseline_row = None
    for c in judged:
        if c.run.record.result("performance") is not None or c.run.record.result("quality") is not None:
            baseline_row = summarize("baseline", c.run.record, role="baseline")[1]
            break
    choice = choose(summaries, selection) if summaries else None
    refused = {c.name: c.refused for c in cands if c.refused}
    table = markdown(baseline_row, rows, choice) if choice else "no candidate could be judged\n"
    if refused:
        table += "".join(f"- {n}: {why}\n" for n, why in refused.items())
    data = {**(as_json(baseline_row, rows, choice) if choice else {"candidates": rows, "chosen": None}),
            "refused": refused, "selection": selection.model_dump(mode="json"),
            "runs": {c.name: str(c.run.path.relative_to(folder)) for c in cands if c.run is not None}}
    family = next((c.ctx.family for c in judged if c.ctx is not None and c.ctx.family is not None), None)
    if family is not None:
        data["family"] = family.as_dict()
        table += f"\nJudged as a family of {family.size} ({family.kind}): {family.as_dict()['why']}.\n"
    write_json_atomic(folder / RESULT_FILE, data)
    write_text_atomic(folder / "comparison.md", "# Comparison\n\n" + table)
    plot = _pareto(folder, baseline_row, rows, progress)
    if choice:
        write_text_atomic(folder / "comparison.html", html(baseline_row, rows, choice, refused=refused,
                                                           plot_png=plot.read_bytes() if plot else None))
    suites = [render_junit(c.run.record) for c in judged]
    write_text_atomic(folder / "junit.xml", _junit_of(suites, {c.name for c in judged}))
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


def _pareto(folder: Path, baseline_row: dict[str, Any] | None, rows: list[dict[str, Any]],
            progress: Progress) -> Path | None:
    """The candidates' plot (the baseline at recovery 1); a plot that cannot be drawn is said, not fatal."""
    from quantlab.reports.plots import pareto

    points = ([{**baseline_row, "worst_recovery": 1.0}] if baseline_row else []) + rows
    try:
        return pareto(points, folder / "pareto.png", f"{len(rows)} candidates, one baseline")
    except (ImportError, OSError, ValueError) as err:
        progress(f"the comparison plot could not be drawn: {type(err).__name__}: {err}")
        return None


def _junit_of(documents: list[str], names: set[str]) -> str:
    """One <testsuites> with each candidate's suites (each already named by its recipe)."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites", name="quantlab comparison")
    for doc in documents:
        tree = ET.fromstring(doc)
        for suite in ([tree] if tree.tag == "testsuite" else list(tree)):
            root.append(suite)
    return ET.tostring(root, encoding="unicode")

