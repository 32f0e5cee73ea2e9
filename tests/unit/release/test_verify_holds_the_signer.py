"""`verify` holds the signer to the record: each forgery a key holder can sign (the folder
edited, then signed and attested again with the same key) is a problem naming what is
wrong, exit 1; a development-key release needs --allow-dev-key; malformed evidence is
exit 1 and bad usage exit 2, never a crash. The release is made by quantlab's own
functions (tests/unit/release/registered_release.py), and verifies as made."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cryptography.hazmat.primitives import serialization
from securesystemslib.dsse import Envelope
from securesystemslib.signer import CryptoSigner

from quantlab.core.layout import ATTESTATION_FILE, REGISTRATION_FILE, REGISTRATION_SIG, SIGNATURE_FILE
from quantlab.core.shipped import RECIPES
from quantlab.core.version import __version__
from quantlab.core.verdicts import GateVerdict, gate_id
from quantlab.performance.result import load_points
from quantlab.recipe.file import load_recipe
from quantlab.release.decision import RULE_VERSION, RULES, DecisionPolicy, decide
from quantlab.release.manifest import Manifest, policy_of_manifest
from quantlab.release.registered_gates import performance_points
from quantlab.release.rule_history import LEGACY_VERSIONS, RULES_BY_VERSION
from quantlab.release.signing_key import local_public_key
from quantlab.release.verify import verify_release
from tests.unit.release.registered_release import Release, build, resign


@pytest.fixture
def release(tmp_path) -> Release:
    return build(tmp_path)


def problems(r: Release, **kw) -> list[str]:
    return verify_release(r.folder, public_key=r.public_key, require_attestation=True, **kw).problems


def cli(*args, env=None):
    from conftest import REPO

    return subprocess.run([sys.executable, "-m", "quantlab", "verify", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, timeout=120, env=env)


def redecide(m: dict) -> None:
    """The decision made again from the (edited) verdicts, as the forger would, so that
    it follows from them."""
    manifest = Manifest.model_validate(m)
    decided = decide(manifest.gates, policy_of_manifest(manifest), rule=manifest.decision.rule_version or 1)
    m["decision"] = decided.record.model_dump(mode="json")
    m["targets"] = {n: t.model_dump(mode="json") for n, t in decided.targets.items()}


def gate(m: dict, gid: str) -> dict:
    return next(g for g in m["gates"] if gate_id(GateVerdict.model_validate(g)) == gid)


def test_a_release_as_the_release_stage_makes_it_verifies(release):
    assert problems(release) == []
    r = cli(release.folder, "--public-key", release.public_key, "--require-attestation")
    assert r.returncode == 0, r.stderr
    assert f"its 20 gates the ones it calls for, under decision rule {RULE_VERSION}" in r.stdout


def test_zero_gates_claiming_rule_1_and_release(release):
    """Rule 1 released a run with no gate at all: a key holder's manifest claimed it, and verified."""
    def forge(m):
        m["gates"] = []
        m["decision"] = decide([], DecisionPolicy(fallback="the baseline"), rule=1).record.model_dump(mode="json")
        m["targets"] = {}
    resign(release, forge)
    assert release.manifest()["decision"]["decision"] == "release"  # it follows from no gates under rule 1
    found = problems(release)
    assert any("carries an error budget" in p and "yet claims rule 1" in p for p in found), found
    assert any(f"registered under rule {RULE_VERSION}" in p for p in found), found
    assert "gate performance.min_throughput_ratio@short/c1 is missing: the registered gate set calls for it" in found
    assert "gate quality.non_inferiority@ql_lastword is missing: the registered gate set calls for it" in found
    assert "gate stability.max_server_errors@bad_requests is missing: the registered gate set calls for it" in found

    resign(release, lambda m: m.update(error_budget=None))  # no ledger either: the registration still says
    found = problems(release)
    assert any(f"registered under rule {RULE_VERSION}" in p for p in found), found
    r = cli(release.folder, "--public-key", release.public_key)
    assert r.returncode == 1 and "NOT VERIFIED" in r.stderr and "is missing" in r.stderr


def test_a_rule_its_quantlab_version_never_had(release):
    newer = max(RULES) + 1

    def newer_rule(m):
        m["decision"]["rule_version"] = newer
        m["error_budget"]["rule_version"] = newer
    resign(release, newer_rule)
    found = problems(release)
    assert any(f"decision rule {newer} is not one quantlab {__version__} decided under" in p for p in found), found

    resign(release, lambda m: (newer_rule(m), m["decision"].update(rule_version=RULE_VERSION),
                               m["error_budget"].update(rule_version=RULE_VERSION),
                               m["quantlab"].update(version="0.0.1")))
    [found] = problems(release)
    assert "records quantlab '0.0.1', a version this verifier" in found and "does not know" in found


def test_the_rule_table_knows_this_version_and_every_rule():
    """A new rule ships with a new quantlab version: bump core/version.py and give it a row in
    release/rule_history.RULES_BY_VERSION (the rows before it stay as they were)."""
    assert RULES_BY_VERSION.get(__version__) == (RULE_VERSION,), \
        f"quantlab {__version__} decides under rule {RULE_VERSION}, its row says {RULES_BY_VERSION.get(__version__)}"
    assert __version__ not in LEGACY_VERSIONS
    assert {r for rules in RULES_BY_VERSION.values() for r in rules} == set(RULES)


def headline_forgery(m: dict, version: str) -> None:
    """Zero gates, rule 1, decision release, no registration and no error budget, claiming `version`."""
    m["gates"] = []
    m["decision"] = decide([], DecisionPolicy(fallback="the baseline"), rule=1).record.model_dump(mode="json")
    m["targets"] = {}
    m.update(registration=None, error_budget=None)
    m["quantlab"]["version"] = version


@pytest.mark.parametrize("version", [*sorted(LEGACY_VERSIONS), __version__])
def test_the_headline_forgery_registration_deleted_and_resigned(release, version):
    """A key holder removes the registration and the error budget, and re-signs a manifest of
    no gates under rule 1: as this quantlab's, it lacks what every release of it carries; as
    a legacy one's, it verifies only with --allow-legacy."""
    (release.folder / REGISTRATION_FILE).unlink()
    (release.folder / REGISTRATION_SIG).unlink()
    resign(release, lambda m: headline_forgery(m, version), relist=True)
    assert release.manifest()["decision"]["decision"] == "release"
    r = cli(release.folder, "--public-key", release.public_key, "--require-attestation")
    assert r.returncode == 1 and "NOT VERIFIED" in r.stderr, r.stdout + r.stderr
    found = problems(release)
    if version in LEGACY_VERSIONS:
        [said] = found
        assert f"records quantlab {version}, whose releases may lack a registration" in said and \
            "--allow-legacy" in said and f"a release made now records quantlab {__version__}" in said
        assert problems(release, allow_legacy=True) == []  # what --allow-legacy trusts: that history
        r = cli(release.folder, "--public-key", release.public_key, "--require-attestation", "--allow-legacy")
        assert r.returncode == 0 and f"note: made by quantlab {version}, accepted by --allow-legacy" in r.stdout, \
            r.stdout + r.stderr
    else:
        assert any("claims a rule its own quantlab never had" in p for p in found), found
        assert any("'registration' is null" in p for p in found) and any("'error_budget' is null" in p for p in found)
        assert problems(release, allow_legacy=True) == found  # --allow-legacy is for legacy manifests only


def test_a_faithful_release_records_this_quantlab_and_verifies_without_allow_legacy(release):
    m = release.manifest()
    assert m["quantlab"]["version"] == __version__ and m["decision"]["rule_version"] == RULE_VERSION
    assert m["registration"] and m["error_budget"]
    r = cli(release.folder, "--public-key", release.public_key, "--require-attestation")
    assert r.returncode == 0 and "allow-legacy" not in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("gid, edit, said", [
    ("quality.non_inferiority@ql_lastword", {"margin": 0.5, "limit": -0.5},
     "its margin is 0.5, the registered gate set gives one of"),
    ("quality.non_inferiority@pooled", {"confidence": 0.8},
     "its confidence is 0.8, the registered gate set gives 0.95 (quality.pooled.confidence)"),
    ("performance.min_throughput_ratio@short/c8", {"limit": 0.5},
     "its limit is 0.5, the registered gate set gives 0.8 (performance.gates.min_throughput_ratio)"),
    ("stability.max_rss_growth_mb@soak", {"limit": 4096.0},
     "its limit is 4096.0, the registered gate set gives 512.0 (stability.gates.max_rss_growth_mb)"),
    ("performance.max_error_rate@short/c1", {"comparator": "at_least"},
     "its comparator is 'at_least', the registered gate set gives 'at_most'"),
])
def test_a_gate_changed_from_its_registered_value(release, gid, edit, said):
    def forge(m):
        gate(m, gid).update(edit)
        redecide(m)
    resign(release, forge)
    [found] = problems(release)
    assert found.startswith(f"gate {gid}: ") and said in found, found


def test_a_gate_added_or_renamed_is_not_in_the_registered_gate_set(release):
    def forge(m):
        g = gate(m, "performance.max_p99_ttft_ratio@short/c1")
        g["scope"] = "short/c64"  # a point never registered (and c1's gate now missing)
    resign(release, forge)
    found = problems(release)
    assert any("performance.max_p99_ttft_ratio@short/c64 is not in the registered gate set: 'short/c64' is not "
               "a registered workload point" in p for p in found), found
    assert "gate performance.max_p99_ttft_ratio@short/c1 is missing: the registered gate set calls for it" in found


def test_the_policy_and_targets_decided_under_are_the_registered_ones(release):
    def warn_all(m):
        m["decision"]["not_shown_policy"] = {"not_shown": "warn", "checks": {}, "gates": {}}
        redecide(m)
    resign(release, warn_all)
    [found] = problems(release)
    assert "release.policy {'not_shown': 'warn'" in found and "the registered one is {'not_shown': 'block'" in found


def forge_predicate(release: Release, edit) -> None:
    """The attestation's predicate edited and its envelope signed again with the release key."""
    path = release.folder / ATTESTATION_FILE
    envelope = Envelope.from_dict(json.loads(path.read_text()))
    statement = json.loads(envelope.payload)
    edit(statement["predicate"])
    key = serialization.load_pem_private_key(release.private_key.read_bytes(), None)
    forged = Envelope(payload=json.dumps(statement, sort_keys=True).encode(), payload_type=envelope.payload_type,
                      signatures={})
    forged.sign(CryptoSigner(key))
    path.write_text(json.dumps(forged.to_dict()) + "\n")


@pytest.mark.parametrize("edit, field", [
    (lambda p: p["hardware"]["cpu"].update(model="NVIDIA H100"), "hardware.cpu.model"),
    (lambda p: p["quantization"].update(scheme="w8a8"), "quantization.scheme"),
    (lambda p: p["gates"][1].update(estimate=0.2), "gates[quality.non_inferiority@ql_lastword].estimate"),
    (lambda p: p["decision"].update(rule_version=1), "decision.rule_version"),
])
def test_the_attestation_predicate_is_the_manifests_field_by_field(release, edit, field):
    forge_predicate(release, edit)
    [found] = problems(release)
    assert found == f"attestation {ATTESTATION_FILE}: its predicate is not this manifest's evaluation: {field} differ"


def test_a_decision_flipped_with_its_verdicts_edited(release):
    """The run measured a failure (blocked, and that verifies); the key holder flips the
    failed gate to pass and the decision to release: the gate's own numbers say fail."""
    def measured_failure(m):
        g = gate(m, "stability.max_server_errors@bad_requests")
        g.update(value=3.0, estimate=3.0, verdict="fail", evidence="3 malformed requests got a 5xx")
        row = next(r for r in m["results"]["quality"]["tasks"] if r["task"] == "ql_arithmetic")
        row.update(diff=-0.3, ci=[-0.38, -0.22])  # the candidate lost 30 points on it
        q = gate(m, "quality.non_inferiority@ql_arithmetic")
        q.update(estimate=-0.3, low=-0.38, high=-0.22, value=-0.38, verdict="fail")
        redecide(m)
    resign(release, measured_failure)
    assert release.manifest()["decision"]["decision"] == "blocked"
    assert problems(release) == []  # a signed, consistent blocked release

    def flip(m):
        gate(m, "stability.max_server_errors@bad_requests")["verdict"] = "pass"
        gate(m, "quality.non_inferiority@ql_arithmetic")["verdict"] = "pass"
        redecide(m)
    resign(release, flip)
    assert release.manifest()["decision"]["decision"] == "release"
    found = problems(release)
    assert "gate stability.max_server_errors@bad_requests: recorded 'pass', but its value 3 is beyond its limit 0" \
        in found
    margin = gate(release.manifest(), "quality.non_inferiority@ql_arithmetic")["margin"]
    assert f"gate quality.non_inferiority@ql_arithmetic: recorded 'pass', but its interval's worse end -0.38 is " \
        f"below -{margin:.4g}: a pass needs it above" in found, found

    def numbers_too(m):  # a better interval than its comparison in the results
        gate(m, "quality.non_inferiority@ql_arithmetic").update(estimate=0.0, low=-0.02, high=0.02, value=-0.02)
    resign(release, numbers_too)
    assert any("quality.non_inferiority@ql_arithmetic: its estimate +0 and interval -0.02 .. 0.02 are not its "
               "comparison's" in p for p in problems(release))


def test_a_development_key_release_verifies_only_with_allow_dev_key(tmp_path):
    release = build(tmp_path, development_key=True)
    [found] = problems(release)
    assert "signed with quantlab's local development key" in found and "--allow-dev-key" in found
    assert "signing.private_key" in found and "Sigstore" in found
    assert problems(release, allow_dev_key=True) == []
    r = cli(release.folder, "--public-key", release.public_key)
    assert r.returncode == 1 and "local development key" in r.stderr
    r = cli(release.folder, "--public-key", release.public_key, "--allow-dev-key")
    assert r.returncode == 0 and "accepted by --allow-dev-key" in r.stdout, r.stderr


def test_this_machines_development_key_is_one_whatever_the_manifest_says(release, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    local_public_key().parent.mkdir(parents=True)
    local_public_key().write_bytes(release.public_key.read_bytes())  # the key that signed is this machine's
    [found] = problems(release)
    assert "is this machine's local development key" in found
    assert problems(release, allow_dev_key=True) == []


def test_a_malformed_registration_is_a_problem_not_a_crash(release):
    for text in ("{not json", "[]", '{"gates": [], "gates_sha256": null}', '{"gates": {"quality": 5}}',
                 '{"gates": {"targets": 5, "policy": [], "rule_version": "x"}, "data": {"suites": [5, {"tasks": 3}]}}'):
        (release.folder / REGISTRATION_FILE).write_text(text)
        resign(release, lambda m: m["registration"].update(sha256=None), relist=True)
        found = problems(release)  # never raises
        assert found and any(REGISTRATION_FILE in p or "registration" in p for p in found), (text, found)
    r = cli(release.folder, "--public-key", release.public_key)
    assert r.returncode == 1 and "NOT VERIFIED" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("name", [ATTESTATION_FILE, SIGNATURE_FILE, REGISTRATION_FILE])
@pytest.mark.parametrize("text", ["", "{", "[]", "null", '{"payload": 5, "signatures": [1]}',
                                  '{"dsseEnvelope": {"payload": "e30="}, "verificationMaterial": []}'])
def test_malformed_evidence_files_never_crash_verify(release, name, text):
    (release.folder / name).write_text(text)
    found = problems(release)
    assert found, (name, text)


def test_bad_usage_exits_2_without_a_traceback(release, tmp_path):
    not_a_cert = tmp_path / "chain.pem"
    not_a_cert.write_text("hello")
    for args, said in (
            (["--certificate-chain", not_a_cert], "is not a PEM X.509 certificate"),
            (["--certificate-chain", release.public_key], "is not a PEM X.509 certificate"),
            (["--public-key", not_a_cert], "is not a PEM public key"),
            (["--public-key", tmp_path / "missing.pub.pem"], "key or certificate file not found"),
            ([], "say how to verify the signature")):
        r = cli(release.folder, *args)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_the_registered_points_are_the_stages_points():
    """registered_gates names a workload's points as performance/result.load_points does."""
    for path in RECIPES.glob("*.yaml"):
        perf = load_recipe(path).recipe.performance
        if perf is not None:
            assert performance_points(perf) == [f"{w.name}/{p}" for w in perf.workloads for p, _, _ in load_points(w)]


def test_a_faithful_blocked_release_still_verifies_its_integrity(tmp_path):
    """A registered section's gates may be absent only where a race stopped a blocked candidate early."""
    release = build(tmp_path)

    def stopped(m):
        m["gates"] = [g for g in m["gates"] if g["check"] != "stability"]
        gate(m, "quality.non_inferiority@ql_arithmetic").update(verdict="fail", estimate=-0.3, low=-0.38, high=-0.22,
                                                               value=-0.38)
        row = next(r for r in m["results"]["quality"]["tasks"] if r["task"] == "ql_arithmetic")
        row.update(diff=-0.3, ci=[-0.38, -0.22])
        m["run"]["stopped_early"] = "quality.non_inferiority@ql_arithmetic failed after quality"
        del m["run"]["stages"]["stability"]
        redecide(m)
    resign(release, stopped)
    assert release.manifest()["decision"]["decision"] == "blocked"
    assert problems(release) == []
