"""The release's attestation: an in-toto Statement v1 whose subject is the released
folder's files and whose predicate is the evaluation (release/attestation_predicate.py),
DSSE-signed with the release's own key (securesystemslib) or Sigstore identity.

It is written after OpenSSF model-signing has signed the folder and takes its subjects
from that signature's own statement: the model's name with its root digest (so tools join
the two statements on it) and every signed file with its sha256. The file itself is
outside what model-signing signs (its ignored paths), and `verify` does not count it as
an added file. What `verify` checks: the envelope's signature, that its subjects are the
files on disk and model-signing's subject, and that its predicate is the one the release
builds from the signed manifest (predicate_of), field by field.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from quantlab.core.digest import canonical_json
from quantlab.core.fsutil import sha256_file, write_text_atomic
from quantlab.core.layout import ATTESTATION_BUNDLE, ATTESTATION_FILE, MANIFEST_FILE, REGISTRATION_FILE, SIGNATURE_FILE
from quantlab.core.verdicts import gate_id
from quantlab.release.attestation_predicate import (
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    Decision,
    FileDigest,
    Gate,
    Harness,
    Predicate,
    Suite,
)

ATTESTATION_FILES = (ATTESTATION_FILE, ATTESTATION_BUNDLE)


# ------------------------------------------------------------------ the statement

def signed_statement(folder: Path) -> dict[str, Any]:
    """The in-toto statement model-signing signed over `folder` (read from its signature
    file, not verified here: verify_folder verifies that signature)."""
    bundle = json.loads((Path(folder) / SIGNATURE_FILE).read_text())
    envelope = bundle.get("dsseEnvelope") or {}
    return json.loads(base64.b64decode(envelope["payload"]))


def subjects_of(model_signing: dict[str, Any]) -> list[dict[str, Any]]:
    """model-signing's subject (the model's root digest) first, then each file it signed."""
    root = model_signing["subject"][0]
    files = [{"name": r["name"], "digest": {r["algorithm"]: r["digest"]}}
             for r in model_signing["predicate"]["resources"]]
    return [{"name": root["name"], "digest": dict(root["digest"])}, *files]


def predicate_of(manifest: Any, *, manifest_sha256: str, model_signing_subject: dict[str, Any],
                 data: dict[str, Any] | None = None) -> Predicate:
    """The evaluation, read off the manifest (a release.manifest.Manifest) that is signed with
    it, and the data digests and seeds its registration statement holds."""
    m = manifest
    quality = m.results.get("quality") or {}
    registration = m.registration or None
    runtime_versions = (m.runtime or {}).get("versions") or {}
    quantize_versions = (m.quantization or {}).get("versions") or {}
    versions = {
        "lm-eval": quality.get("lm_eval_version"),
        "vllm": runtime_versions.get("vllm"),
        "llm-compressor": quantize_versions.get("llmcompressor"),
        "compressed-tensors (quantize)": quantize_versions.get("compressed-tensors"),
        "compressed-tensors (serve)": runtime_versions.get("compressed-tensors"),
        "torch (quantize)": quantize_versions.get("torch"),
        "torch (serve)": runtime_versions.get("torch"),
        "transformers": quantize_versions.get("transformers"),
    }
    d = m.decision
    return Predicate(
        manifest=FileDigest(name=MANIFEST_FILE, sha256=manifest_sha256),
        model_signing_subject=FileDigest(name=model_signing_subject["name"],
                                         sha256=model_signing_subject["digest"]["sha256"]),
        created_at=m.created_at,
        recipe={"name": m.recipe.get("name"), "sha256": m.recipe.get("sha256")},
        model={"kind": m.model.get("kind"), "source": m.model.get("source")},
        quantization={k: m.quantization.get(k) for k in ("method", "scheme", "quantization_config")
                      if k in m.quantization},
        calibration=m.calibration,
        suites=[Suite(name=s["name"], sha256=s["sha256"]) for s in quality.get("suites") or []
                if s.get("name") and s.get("sha256")],
        data=data,
        registration=registration,
        harness=Harness(quantlab={"version": m.quantlab.get("version"), "git_commit": m.quantlab.get("git_commit"),
                                  "code_sha256": m.quantlab.get("code_sha256")}, versions=versions),
        hardware=m.hardware,
        kernels=_kernels(m.runtime or {}),
        environments=getattr(m, "environments", None),
        evidence=getattr(m, "evidence", None),
        gates=[_gate(v) for v in m.gates],
        error_budget=m.error_budget,
        decision=Decision(decision=d.decision, why=d.why, failed_gates=d.failed_gates,
                          not_shown_gates=d.not_shown_gates, warned_gates=d.warned_gates,
                          rule_version=d.rule_version, policy=d.not_shown_policy, fallback=d.fallback,
                          targets={n: t.model_dump(mode="json") for n, t in m.targets.items()}),
        run={k: m.run.get(k) for k in ("run_id", "placement", "stopped_early") if k in m.run},
    )


def _gate(v: Any) -> Gate:
    return Gate(id=gate_id(v), check=v.check, gate=v.gate, scope=v.scope, target=v.target, metric=v.metric,
                comparator=v.comparator, limit=v.limit, margin=v.margin, confidence=v.confidence,
                fail_confidence=v.fail_confidence, samples=v.samples, value=v.value, estimate=v.estimate,
                interval=None if v.low is None and v.high is None else [v.low, v.high], test=v.test,
                verdict=v.verdict, evidence=v.evidence)


def _kernels(runtime: dict[str, Any]) -> dict[str, Any]:
    engines = runtime.get("engines") or {}
    return {"engine_kernels": runtime.get("engine_kernels"),
            "roles": {role: {k: e.get(k) for k in ("linear_kernels", "attention_backend", "kv_cache_dtype")}
                      for role, e in engines.items()},
            "kernel_path": runtime.get("kernel_path")}


def statement(folder: Path, manifest: Any) -> dict[str, Any]:
    ms = signed_statement(folder)
    predicate = predicate_of(manifest, manifest_sha256=sha256_file(Path(folder) / MANIFEST_FILE),
                             model_signing_subject=ms["subject"][0], data=_registered_data(folder))
    return {"_type": STATEMENT_TYPE, "subject": subjects_of(ms), "predicateType": PREDICATE_TYPE,
            "predicate": predicate.model_dump(mode="json")}


def _checked(doc: dict[str, Any]) -> bytes:
    """The statement as the payload's bytes, after in_toto_attestation's own validation."""
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
    from in_toto_attestation.v1.statement import Statement

    subjects = [ResourceDescriptor(name=s["name"], digest=s["digest"]).pb for s in doc["subject"]]
    Statement(subjects, doc["predicateType"], doc["predicate"]).validate()
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


# ------------------------------------------------------------------ signing

def planned(method: str) -> dict[str, Any] | None:
    """What the manifest names before signing: the attestation file this release will carry
    (None: unsigned, no attestation)."""
    if method == "none":
        return None
    return {"file": ATTESTATION_BUNDLE if method == "sigstore" else ATTESTATION_FILE, "predicate_type": PREDICATE_TYPE}


def write_attestation(folder: Path, manifest: Any, *, method: str, private_key: Path | None = None,
                      password: str | None = None, use_staging: bool = False, identity_token: str | None = None,
                      **_unused: Any) -> dict[str, Any] | None:
    """Sign and write the attestation beside the folder's signature, atomically; what the
    release record keeps of it. None for an unsigned release (nothing to attest with)."""
    if method == "none":
        return None
    payload = _checked(statement(folder, manifest))
    if method in ("key", "certificate"):
        target = Path(folder) / ATTESTATION_FILE
        write_text_atomic(target, json.dumps(_dsse_sign(payload, private_key, password)) + "\n")
    elif method == "sigstore":
        target = Path(folder) / ATTESTATION_BUNDLE
        write_text_atomic(target, _sigstore_sign(payload, use_staging=use_staging, identity_token=identity_token))
    else:
        raise ValueError(f"unknown signing method {method}")
    return {"file": target.name, "sha256": sha256_file(target), "predicate_type": PREDICATE_TYPE,
            "payload_sha256": _sha256(payload)}


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _dsse_sign(payload: bytes, private_key: Path | None, password: str | None) -> dict[str, Any]:
    from cryptography.hazmat.primitives import serialization
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner

    key = serialization.load_pem_private_key(Path(private_key).read_bytes(), password.encode() if password else None)
    envelope = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(CryptoSigner(key))
    return envelope.to_dict()


def _sigstore_sign(payload: bytes, *, use_staging: bool, identity_token: str | None) -> str:
    """A Sigstore bundle holding the DSSE envelope (needs Sigstore's services: network)."""
    from sigstore import dsse, models, oidc, sign

    trust = models.ClientTrustConfig.staging() if use_staging else models.ClientTrustConfig.production()
    context = sign.SigningContext.from_trust_config(trust)
    raw = identity_token or oidc.detect_credential()  # the CI's workload identity, afresh (as sign_folder)
    token = oidc.IdentityToken(raw) if raw else oidc.Issuer(trust.signing_config.get_oidc_url()).identity_token()
    with context.signer(token) as signer:
        return signer.sign_dsse(dsse.Statement(payload)).to_json()


# ------------------------------------------------------------------ verifying

def verify_attestation(folder: Path, manifest: Any, *, require: bool = False,
                       **signature_args: Any) -> tuple[list[str], list[str]]:
    """(problems, notes) about a released folder's attestation: the one its signed manifest
    names must be there and hold; any other attestation file is a problem. A manifest from
    before attestations names none: a note, unless `require`."""
    folder = Path(folder)
    named = (getattr(manifest, "attestation", None) or {}).get("file")
    present = [n for n in ATTESTATION_FILES if (folder / n).is_file()]
    problems = [f"attestation file {n}: the signed manifest names {named or 'no attestation'}, not this file"
                for n in present if n != named]
    if named is None:
        said = f"no attestation: the manifest is from a release made before attestations"
        if require:
            return problems + [said + " (--require-attestation)"], []
        return problems, ([] if problems else [said])
    if named not in present:
        return problems + [f"attestation {named} is missing: the signed manifest says the release carries it"], []
    try:
        if named == ATTESTATION_FILE:
            payload, payload_type = _dsse_verified(folder, folder / named, **signature_args)
        else:
            payload, payload_type = _sigstore_verified(folder / named, **signature_args)
    except _NotVerified as err:
        return problems + [f"attestation {named}: {err}"], []
    if payload_type != PAYLOAD_TYPE:
        return problems + [f"attestation {named}: payload type '{payload_type}', expected '{PAYLOAD_TYPE}'"], []
    try:
        doc = json.loads(payload)
    except ValueError as err:
        return problems + [f"attestation {named}: its statement is not JSON ({err})"], []
    if not isinstance(doc, dict):
        return problems + [f"attestation {named}: its statement is a JSON {type(doc).__name__}, not an object"], []
    return problems + [f"attestation {named}: {p}" for p in _statement_problems(folder, manifest, doc)], []


class _NotVerified(Exception):
    """The attestation's signature does not hold (the message says why)."""


def _dsse_verified(folder: Path, path: Path, *, public_key: Path | None = None,
                   certificate_chain: list[Path] | None = None, **_unused: Any) -> tuple[bytes, str]:
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError
    from securesystemslib.signer import SSlibKey

    try:
        envelope = Envelope.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError, AttributeError) as err:  # AttributeError: JSON that is no object
        raise _NotVerified(f"not a DSSE envelope ({type(err).__name__}: {err})") from None
    if public_key is not None:
        key = SSlibKey.from_crypto(_load_public_key(Path(public_key).read_bytes()))
    elif certificate_chain:
        key = SSlibKey.from_crypto(_signing_certificate_key(folder))
    else:
        raise _NotVerified("no key to check it with (--public-key or --certificate-chain)")
    try:
        envelope.verify([key], 1)
    except (VerificationError, ValueError, TypeError):  # a signature that is no signature: not verified
        signed_by = sorted(s.keyid[:16] for s in envelope.signatures.values())
        raise _NotVerified(f"its signature does not verify with the key given (key id {key.keyid[:16]}; the "
                           f"envelope is signed by {', '.join(signed_by) or 'no key'}): tampered with, or signed "
                           "by another key") from None
    return envelope.payload, envelope.payload_type


def _load_public_key(pem: bytes):
    from cryptography.hazmat.primitives import serialization

    return serialization.load_pem_public_key(pem)


def _signing_certificate_key(folder: Path):
    """The public key of the certificate in the folder's model-signing bundle (verify_folder
    checks that certificate against the chain given)."""
    from cryptography import x509

    try:
        material = json.loads((folder / SIGNATURE_FILE).read_text()).get("verificationMaterial") or {}
        chain = (material.get("x509CertificateChain") or {}).get("certificates") or []
        raw = chain[0]["rawBytes"] if chain else (material.get("certificate") or {}).get("rawBytes")
        if not raw:
            raise _NotVerified(f"{SIGNATURE_FILE} holds no signing certificate to check the attestation with")
        return x509.load_der_x509_certificate(base64.b64decode(raw)).public_key()
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
        raise _NotVerified(f"no signing certificate can be read from {SIGNATURE_FILE} ({type(err).__name__})") \
            from None


def _sigstore_verified(path: Path, *, sigstore_identity: str | None = None, sigstore_issuer: str | None = None,
                       **_unused: Any) -> tuple[bytes, str]:
    if not (sigstore_identity and sigstore_issuer):
        raise _NotVerified("a Sigstore attestation is checked with --sigstore-identity and --sigstore-issuer")
    try:
        from sigstore import models, verify

        bundle = models.Bundle.from_json(path.read_text())
        verifier = verify.Verifier(trusted_root=models.ClientTrustConfig.production().trusted_root)
        payload_type, payload = verifier.verify_dsse(
            bundle, verify.policy.Identity(identity=sigstore_identity, issuer=sigstore_issuer))
    except Exception as err:  # the trust root comes from Sigstore's servers; a bad bundle is its own error
        raise _NotVerified(f"Sigstore verification failed ({type(err).__name__}: {str(err)[:200]})") from None
    return payload, payload_type


def _statement_problems(folder: Path, manifest: Any, doc: dict[str, Any]) -> list[str]:
    """The statement against the folder on disk, its model-signing statement and its manifest."""
    problems = []
    if doc.get("_type") != STATEMENT_TYPE:
        problems.append(f"statement type '{doc.get('_type')}', expected '{STATEMENT_TYPE}'")
    if doc.get("predicateType") != PREDICATE_TYPE:
        return problems + [f"predicate type '{doc.get('predicateType')}', expected '{PREDICATE_TYPE}'"]
    try:
        predicate = Predicate.model_validate(doc.get("predicate"))
    except ValidationError as err:
        return problems + [f"its predicate is not a {PREDICATE_TYPE} predicate: {str(err).splitlines()[0]}"]
    try:
        subjects = {s.get("name"): (s.get("digest") or {}).get("sha256") for s in doc.get("subject") or []}
    except (AttributeError, TypeError):
        return problems + ["its subjects are not a list of names with digests"]
    try:
        ms = signed_statement(folder)
        root = ms["subject"][0]
        signed = {r["name"]: r["digest"] for r in ms["predicate"]["resources"]}
        root_sha256 = root["digest"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return problems + [f"it cannot be joined to the folder's signature ({SIGNATURE_FILE} unreadable)"]
    if subjects.pop(root.get("name"), None) != root_sha256 or predicate.model_signing_subject.sha256 != root_sha256:
        problems.append(f"its subject is not the model-signing subject of this folder ({root.get('name')} "
                        f"{str(root_sha256)[:12]}...): an attestation for other files")
    problems += _subject_problems(folder, subjects, signed)
    manifest_sha256 = sha256_file(folder / MANIFEST_FILE)
    if predicate.manifest.sha256 != manifest_sha256:
        return problems + [f"its predicate is about another manifest (sha256 {predicate.manifest.sha256[:12]}...)"]
    # the predicate the release would have written from this manifest, field by field
    try:
        expected = predicate_of(manifest, manifest_sha256=manifest_sha256, model_signing_subject=root,
                                data=_registered_data(folder))
    except (AttributeError, TypeError, KeyError, ValueError) as err:  # a manifest no release would have written
        return problems + [f"no predicate can be built from the signed manifest as the release builds it "
                           f"({type(err).__name__}: {err})"]
    differing = differences(expected.model_dump(mode="json"), predicate.model_dump(mode="json"))
    if differing:
        shown = ", ".join(differing[:MAX_NAMED])
        more = f" and {len(differing) - MAX_NAMED} more" if len(differing) > MAX_NAMED else ""
        problems.append(f"its predicate is not this manifest's evaluation: {shown}{more} differ")
    return problems


def _subject_problems(folder: Path, subjects: dict[str, Any], signed: dict[str, Any]) -> list[str]:
    """Each file where the statement's subjects and the folder's signature differ, by name and digest."""
    problems = []
    # every file the folder's signature covers (model-signing's own resources: verify_folder checks them
    # against the disk), by name and digest; the disk is read only to say which file differs
    for name in sorted(set(signed) | set(subjects), key=str):
        if name not in subjects:
            problems.append(f"the signed file {name} is not among its subjects")
        elif name not in signed:
            problems.append(f"its subject {name} is not a file of this folder's signature")
        elif subjects[name] != signed[name]:
            on_disk = sha256_file(folder / name) if (folder / name).is_file() else "missing"
            problems.append(f"its subject {name} has sha256 {str(subjects[name])[:12]}..., the folder's file "
                            f"{on_disk[:12]}...: an attestation for other files")
    return problems


MAX_NAMED = 6  # differing predicate fields named in one problem line


def _registered_data(folder: Path) -> dict[str, Any] | None:
    """The data digests and seeds the folder's registration statement holds (as the release read them)."""
    try:
        doc = json.loads((Path(folder) / REGISTRATION_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc.get("data") if isinstance(doc, dict) else None


def differences(want: Any, got: Any, path: str = "") -> list[str]:
    """The paths at which two JSON values differ (gates named by id), in order."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for key in [*want, *(k for k in got if k not in want)]:
            out += differences(want.get(key), got.get(key), f"{path}.{key}" if path else str(key))
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path} ({len(got)} entries, the manifest implies {len(want)})"]
        out = []
        for i, (w, g) in enumerate(zip(want, got)):
            name = w.get("id") if isinstance(w, dict) and isinstance(w.get("id"), str) else i
            out += differences(w, g, f"{path}[{name}]")
        return out
    return [] if canonical_json(want) == canonical_json(got) else [path or "the predicate"]

