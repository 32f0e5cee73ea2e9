"""A comparison's files, written from its outcome (reports/comparison_records.py): the
table (comparison.md), its JSON (comparison.json), the page with its plot
(comparison.html, pareto.png) and every judged candidate's JUnit suites (junit.xml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantlab.core.fsutil import write_json_atomic, write_text_atomic
from quantlab.core.layout import COMPARISON_FILE
from quantlab.core.progress import Progress
from quantlab.reports.comparison_records import ComparisonOutcome
from quantlab.reports.comparison_table import as_json, html, markdown


def write_comparison(folder: Path, outcome: ComparisonOutcome, progress: Progress) -> tuple[str, dict[str, Any]]:
    """Every file of the comparison into `folder`; (the table's Markdown, what the JSON holds)."""
    from quantlab.reports.report import render_junit  # the run report's modules, only once a comparison ends

    baseline_row, rows, choice, refused = outcome.baseline_row, outcome.rows, outcome.choice, outcome.refused
    table = markdown(baseline_row, rows, choice) if choice else "no candidate could be judged\n"
    if refused:
        table += "".join(f"- {n}: {why}\n" for n, why in refused.items())
    data = {**(as_json(baseline_row, rows, choice) if choice else {"candidates": rows, "chosen": None}),
            "refused": refused, "selection": outcome.selection.model_dump(mode="json"), "runs": outcome.runs}
    family = outcome.family
    if family is not None:
        data["family"] = family.as_dict()
        table += f"\nJudged as a family of {family.size} ({family.kind}): {family.as_dict()['why']}.\n"
    write_json_atomic(folder / COMPARISON_FILE, data)
    write_text_atomic(folder / "comparison.md", "# Comparison\n\n" + table)
    plot = _pareto(folder, baseline_row, rows, progress)
    if choice:
        write_text_atomic(folder / "comparison.html", html(baseline_row, rows, choice, refused=refused,
                                                           plot_png=plot.read_bytes() if plot else None))
    suites = [render_junit(record) for record in outcome.records]
    write_text_atomic(folder / "junit.xml", _junit_of(suites))
    return table, data


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


def _junit_of(documents: list[str]) -> str:
    """One <testsuites> with each candidate's suites (each already named by its recipe)."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites", name="quantlab comparison")
    for doc in documents:
        tree = ET.fromstring(doc)
        for suite in ([tree] if tree.tag == "testsuite" else list(tree)):
            root.append(suite)
    return ET.tostring(root, encoding="unicode")
