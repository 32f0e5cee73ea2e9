"""Reports from a run record: Markdown (fits a pull-request comment), a self-contained
HTML page (plots embedded), and JUnit XML with one test case per gate.

Pure functions of the record (plus the plot files it names), so `quantlab report
RUN_DIR` re-renders any run without running anything.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from xml.etree import ElementTree as ET

from quantlab.core.layout import HTML_FILE, JUNIT_FILE, MARKDOWN_FILE  # noqa: F401 (also read from here)
from quantlab.core import checks as check_table
from quantlab.core.verdicts import all_verdicts, gate_id
from quantlab.recipe.stream import report_line
from quantlab.release import threshold_rates
from quantlab.release.decision import (TargetDecision, targets_line)
from quantlab.core.results import (
    ReleaseResult,
)
from quantlab.core.verdicts import GateVerdict
from quantlab.core.run import RunRecord
from quantlab.reports.sections import blocking_gates, stage_results, sections
from quantlab.reports.sections import time_line



def decision_line(record: RunRecord) -> str:
    release = record.result("release")
    if isinstance(release, ReleaseResult):
        word = {"release": "RELEASE", "blocked": "BLOCKED", "not_shown": "NOT SHOWN"}[release.decision]
        if getattr(record.result("quality"), "code_sandbox", None) == "unsandboxed":  # first: never cut off
            word += " (model code ran UNSANDBOXED)"
        fallback = f" Fallback: {release.fallback}." if release.fallback else ""
        targets = ""
        if release.targets:
            decisions = {n: TargetDecision.model_validate(d) for n, d in release.targets.items()}
            targets = f" Targets: {targets_line(decisions)}."
        return f"{word}: {release.why}.{fallback}{targets}"
    stopped = next((s.name for s in record.stages.values() if s.status != "ok"), None)
    if record.status in ("failed", "interrupted"):
        where = f"in stage {stopped}" if stopped else "before its first stage (a preflight check)"
        return f"no decision: the run {record.status} {where}"
    return f"no decision: the run is {record.status}"


def stream_line(record: RunRecord) -> str | None:
    """What this decision was judged at among the runs against the same baseline, and what a
    re-run will be (recipe/stream.py)."""
    release = record.result("release")
    budget = release.error_budget if isinstance(release, ReleaseResult) else None
    if not isinstance(budget, dict) or "stream" not in budget:
        return None
    return report_line(budget["stream"], release.decision == "release")


def fixed_thresholds_line(record: RunRecord) -> str | None:
    """The fixed thresholds (no interval) and what A/A runs measured them to block
    (release/threshold_rates.py)."""
    release = record.result("release")
    budget = release.error_budget if isinstance(release, ReleaseResult) else None
    if not isinstance(budget, dict) or not isinstance(budget.get("fixed_thresholds"), dict):
        return None
    return threshold_rates.report_line(budget["fixed_thresholds"])


def plots(record: RunRecord) -> list[str]:
    out: list[str] = []
    for check in check_table.CHECKS:  # the checks that draw plots (core/checks.py), in the decision's order
        if check.plots:
            out += list(getattr(record.result(check.name), "plots", None) or [])
    return out


def render_markdown(record: RunRecord) -> str:
    lines = [f"## quantlab: {record.recipe_name}", "", f"**{decision_line(record)}**", "",
             f"run `{record.run_id}`, recipe sha256 `{record.recipe_sha256[:12]}`, quantlab {record.quantlab_version}",
             ""]
    stream = stream_line(record)
    if stream:
        lines += [f"Stream: {stream}", ""]
    fixed = fixed_thresholds_line(record)
    if fixed:
        lines += [f"Fixed thresholds: {fixed}", ""]
    for title, header, rows, notes in sections(record):
        lines += [f"### {title}", ""]
        if rows:
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "---|" * len(header))
            for row in rows:
                lines.append("| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in row) + " |")
            lines.append("")
        lines += [f"- {n}" for n in notes]
        if notes:
            lines.append("")
    for p in plots(record):
        lines += [f"![{Path(p).stem}]({p})", ""]
    return "\n".join(lines).rstrip() + "\n"


CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;
text-align:left}th{background:#f3f3f3}.release{color:#176f2c}.blocked{color:#b00020}.not_shown{color:#8a6d00}.FAIL{color:#b00020;
font-weight:bold}.PASS{color:#176f2c}.NOT{color:#8a6d00}ul{font-size:14px;color:#444}img{max-width:100%}"""


def render_html(record: RunRecord, run_dir: Path) -> str:
    release = record.result("release")
    cls = release.decision if isinstance(release, ReleaseResult) else "blocked"
    e = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             f"<title>quantlab: {e(record.recipe_name)}</title><style>{CSS}</style></head><body>",
             f"<h1>quantlab: {e(record.recipe_name)}</h1>",
             f"<h2 class='{cls}'>{e(decision_line(record))}</h2>",
             f"<p>run <code>{e(record.run_id)}</code>, recipe sha256 <code>{e(record.recipe_sha256[:12])}</code>, "
             f"quantlab {e(record.quantlab_version)}</p>"]
    for title, header, rows, notes in sections(record):
        parts.append(f"<h3>{e(title)}</h3>")
        if rows:
            parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
            for row in rows:
                first = f" class='{e(row[0])}'" if title == "Gates" else ""
                parts.append("<tr>" + "".join(f"<td{first if i == 0 else ''}>{e(c)}</td>"
                                              for i, c in enumerate(row)) + "</tr>")
            parts.append("</table>")
        if notes:
            parts.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    for p in plots(record):
        f = run_dir / p
        # embedded: the page is one self-contained file; only a file inside the run folder
        # (a run record naming any other path must not pull it into a report)
        if f.is_file() and f.resolve().is_relative_to(run_dir.resolve()):
            data = base64.b64encode(f.read_bytes()).decode()
            parts.append(f"<p><img alt='{e(Path(p).stem)}' src='data:image/png;base64,{data}'></p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def render_junit(record: RunRecord) -> str:
    """One test case per gate (failure = a failed gate, or a required one that could not
    decide; skipped = one not shown that release.policy only warns about), and one error
    case per failed stage, so CI systems show them natively."""
    results = stage_results(record)
    verdicts: list[GateVerdict] = all_verdicts(results)
    blocking = blocking_gates(verdicts, results.get("release"))
    unshown = sum(v.verdict == "inconclusive" and gate_id(v) in blocking for v in verdicts)
    failed_stages = [s for s in record.stages.values() if s.status != "ok"]
    suite = ET.Element("testsuite", name=f"quantlab.{record.recipe_name}",
                       tests=str(len(verdicts) + len(failed_stages)),
                       failures=str(sum(v.verdict == "fail" for v in verdicts) + unshown),
                       errors=str(len(failed_stages)),
                       skipped=str(sum(v.verdict == "inconclusive" for v in verdicts) - unshown))
    for v in verdicts:
        case = ET.SubElement(suite, "testcase", classname=f"{record.recipe_name}.{v.check}",
                             name=f"{v.gate}@{v.scope}")
        if v.verdict == "fail":
            ET.SubElement(case, "failure", message=v.evidence, type="GateFailed").text = v.evidence
        elif v.verdict == "inconclusive" and gate_id(v) in blocking:  # required and not shown: nothing released
            ET.SubElement(case, "failure", message=f"not shown: {v.evidence}", type="GateNotShown").text = v.evidence
        elif v.verdict == "inconclusive":
            ET.SubElement(case, "skipped", message=v.evidence)
    for s in failed_stages:
        case = ET.SubElement(suite, "testcase", classname=f"{record.recipe_name}.stages", name=s.name)
        ET.SubElement(case, "error", message=s.cause or (s.error or s.status).splitlines()[0],
                      type=s.status).text = s.error
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def summary_lines(record: RunRecord, run_dir: Path) -> list[str]:
    """The few lines a run ends with on the terminal (failed gates and errors follow in
    the error message itself)."""
    lines = [f"{s.name:<12} {s.status:<11} {s.duration_s:8.1f} s"
             + (f"   engines {s.engine_s:7.1f} s" if s.engine_s is not None else "") for s in record.stages.values()]
    if record.attempt is not None:
        lines.append(time_line(record))
    return lines + headline(record, run_dir)


HEADLINE_WIDTH = 120


def headline(record: RunRecord, run_dir: Path) -> list[str]:
    """At most 3 lines of at most 120 characters: the decision with its counts, the first
    gates by importance (all of them are in the report), where the report is."""
    line = decision_line(record)  # "BLOCKED: 3 gate(s) failed, 1 more not shown: a, b and 2 more. Fallback: ..."
    word, sep, rest = line.partition(": ")
    counts, named, names = rest.partition(": ")
    lines = [f"decision: {word}: {counts}", f"  {names}"] if sep and named else [f"decision: {line}"]
    lines = [_fit(x) for x in lines]
    if (run_dir / MARKDOWN_FILE).is_file():
        lines.append(f"report: {run_dir / MARKDOWN_FILE} (also {HTML_FILE}, {JUNIT_FILE})")
    return lines


def _fit(line: str) -> str:
    return line if len(line) <= HEADLINE_WIDTH else line[:HEADLINE_WIDTH - 3].rstrip() + "..."


def write_reports(run_dir: Path, record: RunRecord) -> dict[str, Path]:
    from quantlab.core.fsutil import write_text_atomic

    out = {MARKDOWN_FILE: render_markdown(record), HTML_FILE: render_html(record, run_dir),
           JUNIT_FILE: render_junit(record)}
    paths = {}
    for name, text in out.items():
        write_text_atomic(run_dir / name, text)
        paths[name] = run_dir / name
    return paths
