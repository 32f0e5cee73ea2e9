"""The release's in-toto attestation, signed for real (model-signing, then securesystemslib's
DSSE): verified, joined to model-signing's statement, and refused when tampered with, made
for other files or signed by another key; checked from a process that imports no quantlab."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap

import pytest

from quantlab.core.layout import ATTESTATION_BUNDLE, ATTESTATION_FILE, MANIFEST_FILE, SIGNATURE_FILE
from quantlab.core.shipped import SCHEMAS
from quantlab.core.verdicts import GateVerdict
from quantlab.release.attestation import planned, signed_statement, write_attestation
from quantlab.release.attestation_predicate import PREDICATE_TYPE, SCHEMA_FILE, json_schema
from quantlab.release.manifest import folder_files, generate_keypair, read_manifest, sign_folder
from quantlab.release.verify import verify_release
from tests.unit.release.test_manifest import make_release

GATES = [
    GateVerdict(check="quality", gate="non_inferiority", scope="ql_json", verdict="pass", value=-0.02, limit=-0.087,
                evidence="40 paired items", samples=40, metric="acc", comparator="non_inferior", margin=0.087,
                confidence=0.95, fail_confidence=0.99, estimate=-0.02, low=-0.06, high=0.01, test="tango-score"),
    GateVerdict(check="stability", gate="max_server_errors", scope="bad_requests", verdict="pass", value=0, limit=0,
                evidence="22 malformed requests", comparator="at_most", test="count"),
]


@pytest.fixture
def keys(tmp_path):
    priv, pub = tmp_path / "keys" / "signing.pem", tmp_path / "keys" / "signing.pub.pem"
    generate_keypair(priv, pub)
    return priv, pub


def verify_legacy(folder, **kw):
    """verify_release with --allow-legacy (make_release writes the legacy format: no registration),
    less the note that says so."""
    checked = verify_release(folder, allow_legacy=True, **kw)
    checked.notes = [n for n in checked.notes if "accepted by --allow-legacy" not in n]
    return checked


def attested(folder, priv):
    """Signed and attested as the release stage does: the manifest names the attestation first."""
    m = json.loads((folder / MANIFEST_FILE).read_text())
    m["attestation"] = planned("key")
    (folder / MANIFEST_FILE).write_text(json.dumps(m))
    sign_folder(folder, method="key", private_key=priv)
    return write_attestation(folder, read_manifest(folder), method="key", private_key=priv)


@pytest.fixture
def release(tmp_path, keys):
    priv, pub = keys
    folder = make_release(tmp_path / "ckpt", GATES)
    record = attested(folder, priv)
    return folder, priv, pub, record


def envelope(folder):
    return json.loads((folder / ATTESTATION_FILE).read_text())


def test_an_attested_release_verifies_and_its_subjects_join_model_signing(release):
    folder, _, pub, record = release
    assert record["file"] == ATTESTATION_FILE and record["predicate_type"] == PREDICATE_TYPE
    checked = verify_legacy(folder, public_key=pub, require_attestation=True)
    assert checked.problems == [] and checked.notes == []
    statement = json.loads(base64.b64decode(envelope(folder)["payload"]))
    ms = signed_statement(folder)
    # the same root digest as model-signing's own statement, then every signed file
    assert statement["subject"][0] == ms["subject"][0]
    files = {s["name"]: s["digest"]["sha256"] for s in statement["subject"][1:]}
    assert files == {r["name"]: r["digest"] for r in ms["predicate"]["resources"]}
    assert set(files) == {"model.safetensors", "config.json", MANIFEST_FILE}
    predicate = statement["predicate"]
    assert [g["id"] for g in predicate["gates"]] == ["quality.non_inferiority@ql_json",
                                                      "stability.max_server_errors@bad_requests"]
    assert predicate["gates"][0]["interval"] == [-0.06, 0.01] and predicate["decision"]["decision"] == "release"
    assert predicate["harness"]["quantlab"]["code_sha256"]


def test_verify_does_not_count_the_attestation_as_an_added_file(release):
    folder, _, pub, _ = release
    assert not any("added file" in p for p in verify_legacy(folder, public_key=pub).problems)
    # and model-signing's own verification ignores it too (its ignored paths are signed)
    assert ATTESTATION_FILE in signed_statement(folder)["predicate"]["serialization"]["ignore_paths"]


def test_a_tampered_attestation_is_refused(release):
    folder, _, pub, _ = release
    env = envelope(folder)
    statement = json.loads(base64.b64decode(env["payload"]))
    statement["predicate"]["gates"][0]["estimate"] = 0.5  # a better figure than measured, the rest unchanged
    env["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    (folder / ATTESTATION_FILE).write_text(json.dumps(env))
    [problem] = verify_legacy(folder, public_key=pub).problems
    assert problem.startswith(f"attestation {ATTESTATION_FILE}: its signature does not verify")


def test_an_attestation_for_other_files_is_refused(tmp_path, keys, release):
    folder, priv, pub, _ = release
    other = make_release(tmp_path / "other", GATES)  # other weights, same key
    attested(other, priv)
    (folder / ATTESTATION_FILE).write_bytes((other / ATTESTATION_FILE).read_bytes())
    problems = verify_legacy(folder, public_key=pub).problems
    assert any("an attestation for other files" in p for p in problems)
    assert any("has sha256" in p and "model.safetensors" in p for p in problems)


def test_a_statement_signed_by_another_key_is_refused(tmp_path, release):
    folder, _, pub, _ = release
    generate_keypair(tmp_path / "other.pem", tmp_path / "other.pub.pem")
    write_attestation(folder, read_manifest(folder), method="key", private_key=tmp_path / "other.pem")
    [problem] = verify_legacy(folder, public_key=pub).problems
    assert "does not verify with the key given" in problem and "signed by another key" in problem


def test_an_attestation_removed_or_one_more_added_is_refused(release):
    folder, _, pub, _ = release
    (folder / ATTESTATION_BUNDLE).write_text("{}")  # a second attestation nobody signed for
    [problem] = verify_legacy(folder, public_key=pub).problems
    assert f"attestation file {ATTESTATION_BUNDLE}: the signed manifest names {ATTESTATION_FILE}" in problem
    (folder / ATTESTATION_BUNDLE).unlink()
    (folder / ATTESTATION_FILE).unlink()  # outside what model-signing signs, but the manifest names it
    [problem] = verify_legacy(folder, public_key=pub).problems
    assert "is missing: the signed manifest says the release carries it" in problem


def test_files_model_signing_leaves_out_are_not_subjects(tmp_path, keys):
    """A checkpoint taken from a git clone or a hub snapshot holds .gitattributes, which
    model-signing does not sign: the attestation's subjects are what it signs."""
    priv, pub = keys
    folder = make_release(tmp_path / "snapshot", GATES)
    (folder / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    m = json.loads((folder / MANIFEST_FILE).read_text())
    m["checkpoint_files"] = folder_files(folder)  # the manifest lists it, as a copied-in checkpoint's does
    (folder / MANIFEST_FILE).write_text(json.dumps(m))
    attested(folder, priv)
    assert ".gitattributes" not in {r["name"] for r in signed_statement(folder)["predicate"]["resources"]}
    assert verify_legacy(folder, public_key=pub, require_attestation=True).problems == []


def test_a_release_from_before_attestations_verifies_with_a_note_unless_required(tmp_path, keys):
    priv, pub = keys
    folder = make_release(tmp_path / "old", GATES)
    sign_folder(folder, method="key", private_key=priv)
    checked = verify_legacy(folder, public_key=pub)
    assert checked.problems == [] and "a release made before attestations" in checked.notes[0]
    [problem] = verify_legacy(folder, public_key=pub, require_attestation=True).problems
    assert "--require-attestation" in problem


def test_the_shipped_schema_is_the_predicate_model():
    shipped = json.loads((SCHEMAS / SCHEMA_FILE).read_text())
    assert shipped == json_schema(), "regenerate: quantlab manifest-schema --attestation > " \
        f"quantlab/shipped/schemas/{SCHEMA_FILE}"


CHECK_WITHOUT_QUANTLAB = textwrap.dedent("""
    import hashlib, json, pathlib, sys
    import jsonschema
    from cryptography.hazmat.primitives import serialization
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    folder, public_key, schema = map(pathlib.Path, sys.argv[1:4])
    envelope = Envelope.from_dict(json.loads((folder / "{attestation}").read_text()))
    key = SSlibKey.from_crypto(serialization.load_pem_public_key(public_key.read_bytes()))
    envelope.verify([key], 1)
    assert envelope.payload_type == "application/vnd.in-toto+json"
    statement = json.loads(envelope.payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "{predicate_type}"
    jsonschema.validate(statement["predicate"], json.loads(schema.read_text()))
    for subject in statement["subject"][1:]:
        digest = hashlib.sha256((folder / subject["name"]).read_bytes()).hexdigest()
        assert digest == subject["digest"]["sha256"], subject["name"]
    assert not any(m == "quantlab" or m.startswith("quantlab.") for m in sys.modules)
    print("ok", len(statement["subject"]), statement["predicate"]["decision"]["decision"])
""")


def test_anyone_can_check_it_without_quantlab(release, tmp_path):
    folder, _, pub, _ = release
    script = tmp_path / "check.py"
    script.write_text(CHECK_WITHOUT_QUANTLAB.format(attestation=ATTESTATION_FILE, predicate_type=PREDICATE_TYPE))
    r = subprocess.run([sys.executable, "-I", str(script), str(folder), str(pub),
                        str(SCHEMAS / SCHEMA_FILE)], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["ok", "4", "release"]  # the root subject and three files
