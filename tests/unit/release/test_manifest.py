"""The release manifest with real OpenSSF model-signing on a small folder: sign, verify,
and every kind of tampering caught with a message naming the file."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from quantlab.release.decision import DecisionPolicy, decide
from quantlab.core.provenance import quantlab_identity
from quantlab.release.rule_history import LEGACY_VERSIONS
from quantlab.core.errors import RecipeError
from quantlab.release.manifest import (
    MANIFEST_FILE,
    SIGNATURE_FILE,
    Manifest,
    folder_files,
    generate_keypair,
    public_key_fingerprint,
    read_manifest,
    sign_folder,
    verify_folder,
)
from quantlab.core.verdicts import GateVerdict


def verdict(gate, v, scope="w/c1"):
    return GateVerdict(check="performance", gate=gate, scope=scope, verdict=v, value=1.0, limit=1.0, evidence="d")


@pytest.fixture
def keys(tmp_path):
    priv, pub = tmp_path / "keys" / "signing.pem", tmp_path / "keys" / "signing.pub.pem"
    generate_keypair(priv, pub)
    return priv, pub


def make_release(folder, verdicts=()):
    """A folder with a manifest of the legacy format (no registration, no error budget):
    `quantlab verify` takes it only with --allow-legacy."""
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    (folder / "config.json").write_text('{"quantization_config": {"format": "pack-quantized"}}')
    decision = decide(list(verdicts), DecisionPolicy(fallback="the baseline")).record
    legacy = {**quantlab_identity(), "version": min(LEGACY_VERSIONS)}
    m = Manifest(quantlab=legacy, created_at="2026-11-30T00:00:00+00:00", run={}, recipe={}, model={},
                 calibration=None, quantization={}, checkpoint_files=folder_files(folder), runtime={}, hardware={},
                 results={}, raw_files=[], gates=list(verdicts), decision=decision)
    (folder / MANIFEST_FILE).write_text(json.dumps(m.model_dump(mode="json")))
    return folder


def test_keygen_writes_a_private_key_only_its_owner_reads(keys):
    priv, pub = keys
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in priv.read_bytes() and b"PUBLIC KEY" in pub.read_bytes()
    assert public_key_fingerprint(pub.read_bytes()).startswith("sha256:")
    with pytest.raises(RecipeError, match="already exists"):
        generate_keypair(priv, pub)


def test_sign_then_verify(tmp_path, keys):
    priv, pub = keys
    folder = make_release(tmp_path / "ckpt", [verdict("a", "pass")])
    sign_folder(folder, method="key", private_key=priv)
    assert (folder / SIGNATURE_FILE).is_file()
    assert verify_folder(folder, public_key=pub) == []
    assert read_manifest(folder).decision.decision == "release"


@pytest.fixture
def signed(tmp_path, keys):
    priv, pub = keys
    folder = make_release(tmp_path / "ckpt")
    sign_folder(folder, method="key", private_key=priv)
    return folder, pub


def test_a_flipped_byte_in_a_weight_file(signed):
    folder, pub = signed
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[100] ^= 0xFF
    (folder / "model.safetensors").write_bytes(bytes(data))
    problems = verify_folder(folder, public_key=pub)
    assert any(p.startswith("changed file: model.safetensors") for p in problems)
    assert any("signature check failed" in p for p in problems)


def test_an_edited_manifest(signed):
    folder, pub = signed
    m = json.loads((folder / MANIFEST_FILE).read_text())
    m["created_at"] = "2030-01-01T00:00:00+00:00"  # any change, however small
    (folder / MANIFEST_FILE).write_text(json.dumps(m))
    problems = verify_folder(folder, public_key=pub)
    assert len(problems) == 1 and "signature check failed" in problems[0] and MANIFEST_FILE in problems[0]


def test_an_added_file(signed):
    folder, pub = signed
    (folder / "extra.bin").write_bytes(b"x")
    problems = verify_folder(folder, public_key=pub)
    assert "added file: extra.bin (not in the manifest)" in problems
    assert any("signature check failed" in p for p in problems)


def test_a_removed_file(signed):
    folder, pub = signed
    (folder / "config.json").unlink()
    problems = verify_folder(folder, public_key=pub)
    assert "missing file: config.json (listed in the manifest)" in problems


def test_another_key_does_not_verify(signed, tmp_path):
    folder, _ = signed
    generate_keypair(tmp_path / "other.pem", tmp_path / "other.pub.pem")
    [problem] = verify_folder(folder, public_key=tmp_path / "other.pub.pem")
    assert "signature check failed" in problem


def test_a_decision_that_does_not_follow_from_the_gates(tmp_path, keys):
    priv, pub = keys
    folder = make_release(tmp_path / "ckpt", [verdict("a", "fail")])
    m = json.loads((folder / MANIFEST_FILE).read_text())
    m["decision"] = {"decision": "release", "why": "trust me", "failed_gates": [], "inconclusive_gates": [],
                     "fallback": None}
    (folder / MANIFEST_FILE).write_text(json.dumps(m))
    sign_folder(folder, method="key", private_key=priv)  # signed, but inconsistent
    [problem] = verify_folder(folder, public_key=pub)
    assert "decision 'release' does not follow" in problem and "'blocked'" in problem


def test_unsigned_and_missing_manifest(tmp_path, keys):
    _, pub = keys
    folder = make_release(tmp_path / "ckpt")
    assert any("the manifest is unsigned" in p for p in verify_folder(folder, public_key=pub))
    shutil.rmtree(folder)
    folder.mkdir()
    [problem] = verify_folder(folder, public_key=pub)  # not verified (exit 1), not bad input
    assert "no quantlab-manifest.json" in problem


def test_a_malformed_manifest_is_not_verified(signed):
    """It used to raise (exit 2): a manifest that fails the schema is a folder that does not verify."""
    folder, pub = signed
    (folder / MANIFEST_FILE).write_text('{"manifest_version": 1, "decision": "release"}')
    [problem] = verify_folder(folder, public_key=pub)
    assert "is not a valid quantlab manifest" in problem


def test_a_symlink_in_a_released_folder_is_refused_by_name(signed, tmp_path):
    folder, pub = signed
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (folder / "tokenizer.json").symlink_to(outside)
    problems = verify_folder(folder, public_key=pub)
    assert "symlink: tokenizer.json (a released folder holds plain files only)" in problems
    assert "tokenizer.json" not in folder_files(folder)  # never hashed through the link


def test_the_signer_the_manifest_names_is_checked(tmp_path, keys):
    priv, pub = keys
    folder = make_release(tmp_path / "ckpt")
    m = json.loads((folder / MANIFEST_FILE).read_text())
    m["signer"] = {"method": "key", "key_fingerprint": public_key_fingerprint(pub.read_bytes()),
                   "development_key": True}
    (folder / MANIFEST_FILE).write_text(json.dumps(m))
    sign_folder(folder, method="key", private_key=priv)
    assert verify_folder(folder, public_key=pub) == []
    assert read_manifest(folder).signer.development_key
    m["signer"]["method"] = "sigstore"  # signed by a key, claiming Sigstore
    (folder / MANIFEST_FILE).write_text(json.dumps(m))
    sign_folder(folder, method="key", private_key=priv)
    [problem] = verify_folder(folder, public_key=pub)
    assert "signed by method 'sigstore', but it was verified by 'key'" in problem


def test_a_sigstore_identity_needs_its_issuer(signed):
    folder, _ = signed
    with pytest.raises(RecipeError, match="--sigstore-identity needs --sigstore-issuer"):
        verify_folder(folder, sigstore_identity="someone@example.com")


def test_keygen_never_writes_through_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "keys" / "new.pem"
    link.parent.mkdir()
    link.symlink_to(victim)
    with pytest.raises(RecipeError, match="already exists"):
        generate_keypair(link, tmp_path / "keys" / "new.pub.pem")
    generate_keypair(link, tmp_path / "keys" / "new.pub.pem", overwrite=True)  # replaces the link itself
    assert victim.read_text() == "keep me" and not link.is_symlink()
    assert b"PRIVATE KEY" in link.read_bytes() and stat.S_IMODE(link.stat().st_mode) == 0o600


def gv(verdict, target=None, gate="g"):
    return GateVerdict(check="targets" if target else "quality", gate=gate, scope=target or "task", target=target,
                       verdict=verdict, value=None, limit=1, evidence=f"{gate} on {target}")


def test_a_target_decision_that_does_not_follow_from_the_gates(tmp_path, keys):
    priv, pub = keys
    verdicts = [gv("pass"), gv("fail", "gpu", "servable")]
    folder = make_release(tmp_path / "ckpt", verdicts)
    m = json.loads((folder / MANIFEST_FILE).read_text())
    decided = decide(verdicts, DecisionPolicy(fallback="b", targets={"primary": True, "gpu": False}))
    m["decision"] = decided.record.model_dump(mode="json")
    good = {n: d.model_dump(mode="json") for n, d in decided.targets.items()}
    m["targets"] = good
    (folder / MANIFEST_FILE).write_text(json.dumps(m))
    sign_folder(folder, method="key", private_key=priv)
    assert verify_folder(folder, public_key=pub) == []
    m["targets"]["gpu"] = {"decision": "release", "required": False, "why": "trust me", "failed_gates": []}
    (folder / MANIFEST_FILE).write_text(json.dumps(m))
    sign_folder(folder, method="key", private_key=priv)  # signed, but inconsistent
    [problem] = verify_folder(folder, public_key=pub)
    assert "target 'gpu': decision 'release' does not follow" in problem


def _verify_cli(*args):
    """`quantlab verify --allow-legacy` (make_release writes the legacy format)."""
    from conftest import REPO

    return subprocess.run([sys.executable, "-m", "quantlab", "verify", "--allow-legacy", *map(str, args)],
                          capture_output=True,
                          text=True, cwd=REPO, timeout=120)


def test_verify_exits_0_only_for_a_verified_release(tmp_path, keys):
    """A deploy step gated on `quantlab verify` must not ship a correctly signed blocked release."""
    priv, pub = keys
    released = make_release(tmp_path / "released", [verdict("a", "pass")])
    blocked = make_release(tmp_path / "blocked", [verdict("a", "fail")])
    for folder in (released, blocked):
        sign_folder(folder, method="key", private_key=priv)
    assert _verify_cli(released, "--public-key", pub).returncode == 0
    r = _verify_cli(blocked, "--public-key", pub)
    assert r.returncode == 1 and "NOT RELEASED" in r.stderr and "'blocked'" in r.stderr
    assert "verified" in r.stdout  # the integrity holds, and it says so
    assert _verify_cli(blocked, "--public-key", pub, "--allow-blocked").returncode == 0
    (blocked / MANIFEST_FILE).write_text("{not json")
    r = _verify_cli(blocked, "--public-key", pub, "--allow-blocked")
    assert r.returncode == 1 and "NOT VERIFIED" in r.stderr  # malformed: not verified, not bad input
    r = _verify_cli(released, "--sigstore-identity", "someone@example.com")
    assert r.returncode == 2 and "--sigstore-issuer" in r.stderr


def test_a_manifest_made_under_the_old_rule_still_verifies_under_it(tmp_path, keys):
    """Rule 1 released a run with no gate (and a warned breach): a manifest signed then
    records no rule version and is decided again under rule 1, not today's; the same
    decision claimed under rule 2 does not follow."""
    priv, pub = keys
    folder = make_release(tmp_path / "old")
    m = json.loads((folder / MANIFEST_FILE).read_text())
    m["decision"] = decide([], DecisionPolicy(fallback="the baseline"), rule=1).record.model_dump(mode="json")
    assert m["decision"]["decision"] == "release" and m["decision"]["rule_version"] is None
    del m["decision"]["rule_version"], m["decision"]["warned_gates"]  # as a manifest of rule 1 was written
    (folder / MANIFEST_FILE).write_text(json.dumps(m))
    sign_folder(folder, method="key", private_key=priv)
    assert verify_folder(folder, public_key=pub) == []
    m["decision"]["rule_version"] = 2
    (folder / MANIFEST_FILE).write_text(json.dumps(m))
    sign_folder(folder, method="key", private_key=priv)
    [problem] = verify_folder(folder, public_key=pub)
    assert "decision 'release' does not follow" in problem and "'not_shown'" in problem
