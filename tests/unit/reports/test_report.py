"""Reports from a recorded run record (a real `quantlab run` of the tiny model with a
performance section, one gate failing): golden Markdown and JUnit, a self-contained
HTML page, and the terminal summary. QUANTLAB_UPDATE_GOLDEN=1 rewrites the golden files
after a deliberate change of the reports."""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from quantlab.reports.report import render_html, render_junit, render_markdown, summary_lines
from quantlab.core.run import RunRecord

DATA = Path(__file__).resolve().parents[2] / "data"
RECORD = DATA / "run-record-blocked.json"


@pytest.fixture(scope="module")
def record() -> RunRecord:
    return RunRecord.model_validate(json.loads(RECORD.read_text()))


def golden(name: str, text: str) -> None:
    path = DATA / "golden" / name
    if os.environ.get("QUANTLAB_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from {path}; if intended, rerun with QUANTLAB_UPDATE_GOLDEN=1"


def test_markdown_report_is_golden(record, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(Path.home() / ".config"))  # where a user's dev key is: ~/.config
    md = render_markdown(record)
    golden("report.md", md)
    assert md.startswith(f"## quantlab: {record.recipe_name}\n\n**BLOCKED: ")


def test_junit_has_one_case_per_gate_and_is_golden(record):
    xml = render_junit(record)
    golden("junit.xml", xml)
    suite = ET.fromstring(xml)
    verdicts = record.stages["performance"].result.gates
    assert int(suite.get("tests")) == len(verdicts) == len(suite.findall("testcase"))
    failed = [c.get("name") for c in suite.findall("testcase") if c.find("failure") is not None]
    assert failed == [f"{v.gate}@{v.scope}" for v in verdicts if v.verdict == "fail"] and failed
    assert int(suite.get("failures")) == len(failed)


def test_html_is_self_contained(record, tmp_path):
    page = render_html(record, tmp_path)  # the plots are not in tmp_path: the page says nothing of them
    assert "<h2 class='blocked'>BLOCKED" in page
    assert "src='http" not in page and "href=" not in page  # nothing fetched from anywhere


def test_html_embeds_only_files_inside_the_run_folder(record, tmp_path):
    """A run record naming a path outside its folder must not pull that file into a report."""
    run_dir, secret = tmp_path / "run", tmp_path / "secret.png"
    (run_dir / "performance").mkdir(parents=True)
    secret.write_bytes(b"\x89PNG-not-for-the-report")
    inside = run_dir / "performance" / "inside.png"
    inside.write_bytes(b"\x89PNG-inside")
    (run_dir / "performance" / "link.png").symlink_to(secret)
    perf = record.stages["performance"].result.model_copy(
        update={"plots": ["performance/inside.png", "../secret.png", str(secret), "performance/link.png"]})
    stages = {**record.stages, "performance": record.stages["performance"].model_copy(update={"result": perf})}
    page = render_html(record.model_copy(update={"stages": stages}), run_dir)
    embedded = [base64.b64decode(m) for m in re.findall(r"base64,([A-Za-z0-9+/=]+)'", page)]
    assert embedded == [b"\x89PNG-inside"]


def test_summary_names_stages_decision_and_report(record, tmp_path):
    (tmp_path / "report.md").write_text("x")
    lines = summary_lines(record, tmp_path)
    assert [ln.split()[0] for ln in lines[:4]] == ["quantize", "serve", "performance", "release"]
    head = lines[4:]  # the headline: decision and counts, the first gates, where the report is
    assert len(head) <= 3 and all(len(x) <= 120 for x in head[:-1])  # the report path is as long as the folder's
    assert head[0] == "decision: BLOCKED: 2 gate(s) failed"
    assert head[1].startswith("  performance.max_p99_ttft_ms@short/c1") and "fallback" in head[1].lower()
    assert lines[-1].startswith(f"report: {tmp_path / 'report.md'}")


def test_summary_splits_the_time_into_the_engines_and_quantlabs_own(record, tmp_path):
    from quantlab.core.run import AttemptTime

    timed = record.model_copy(deep=True)
    timed.stages["serve"].engine_s = 70.5
    timed.attempt = AttemptTime(wall_s=372.0, engine_s=353.4)
    lines = summary_lines(timed, tmp_path)
    assert lines[1].split()[-3:] == ["engines", "70.5", "s"]
    assert "engines" not in lines[0]  # a stage recorded without engine time shows none
    assert lines[4] == ("time: 6 min 12 s in all (preflights and reports included), engines at work 5 min 53 s, "
                        "quantlab's own 18.6 s (5.0%)")
    assert lines[5].startswith("decision: BLOCKED")


def test_the_report_says_what_the_default_baseline_is(record):
    """The embedded default model is a dequantized Q4_1 GGUF; every delta is against it."""
    quantize = record.stages["quantize"].result
    default = quantize.model_copy(update={"model": {**quantize.model, "kind": "default", "provenance": {
        "model": "SmolLM2-135M-Instruct", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}}})
    stages = {**record.stages, "quantize": record.stages["quantize"].model_copy(update={"result": default})}
    md = render_markdown(record.model_copy(update={"stages": stages}))
    assert "dequantized from SmolLM2-135M-Instruct.Q4_1.gguf (4-bit Q4_1) to bf16" in md
    assert "Q4_1" not in render_markdown(record)  # a local model: nothing to say


def test_a_required_gate_that_could_not_decide_is_a_junit_failure_and_says_not_shown(record):
    perf = record.stages["performance"].result
    gates = [g.model_copy(update={"verdict": "inconclusive"}) if i == 0 else g for i, g in enumerate(perf.gates)]
    stages = {**record.stages, "performance": record.stages["performance"].model_copy(
        update={"result": perf.model_copy(update={"gates": gates})})}
    release = record.stages["release"].result
    for rules, kind in (({"not_shown": "block", "checks": {}, "gates": {}}, "failure"),
                        ({"not_shown": "warn", "checks": {}, "gates": {}}, "skipped")):
        rel = release.model_copy(update={"not_shown_policy": rules})
        run = record.model_copy(update={"stages": {**stages, "release": record.stages["release"].model_copy(
            update={"result": rel})}})
        case = [c for c in ET.fromstring(render_junit(run)).findall("testcase")
                if c.get("name") == f"{gates[0].gate}@{gates[0].scope}"][0]
        assert case.find(kind) is not None
        label = "NOT SHOWN |" if kind == "failure" else "NOT SHOWN (not required) |"
        assert label in render_markdown(run)


def test_the_verify_hint_is_a_command_that_verifies(record, monkeypatch, tmp_path):
    """A development-key release: its public half here and --allow-dev-key, without which
    `quantlab verify` refuses it; a release signed with a key of one's own: that key."""
    from quantlab.release.signing_key import local_public_key

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    release = record.stages["release"].result
    assert release.local_development_key
    [hint] = [line for line in render_markdown(record).splitlines() if line.startswith("- verify: ")]
    assert hint.startswith(f"- verify: quantlab verify checkpoint --public-key {local_public_key()} --allow-dev-key ")
    assert "local development key" in hint
    own = record.model_copy(deep=True)
    own.stages["release"].result.local_development_key = False
    [hint] = [line for line in render_markdown(own).splitlines() if line.startswith("- verify: ")]
    assert hint == "- verify: quantlab verify checkpoint --public-key <public key>"
