"""The release manifest: what was released (or blocked), from what, how, on what, with
which results; signed with OpenSSF model-signing together with the weights.

The manifest is written into the checkpoint folder before signing, so one signature
covers the weights and the manifest. `verify` checks the signature, every file hash,
that no file was added or removed, and that the decision follows from the gate
verdicts. Key material is read from files only and never printed or logged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantlab.core.layout import ATTESTATION_BUNDLE, ATTESTATION_FILE, MANIFEST_FILE, SIGNATURE_FILE  # noqa: F401
# written after the folder is signed, so outside what model-signing signs and what a manifest lists
NOT_SIGNED = (SIGNATURE_FILE, ATTESTATION_FILE, ATTESTATION_BUNDLE)
from quantlab.core.errors import RecipeError
from quantlab.core.folder_record import digests
from quantlab.core.verdicts import GateVerdict
from quantlab.release.decision import DecisionPolicy, DecisionRecord, TargetDecision, decide, recorded_policy

MANIFEST_VERSION = 1


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RawFile(_M):
    path: str  # relative to the run directory
    sha256: str | None
    role: str


class Signer(_M):
    """Who signed, as the release stage knew it before signing (the signature covers this)."""

    method: str = Field(description="key, certificate or sigstore.")
    key_fingerprint: str | None = Field(None, description="sha256 of the DER public key (key and certificate).")
    development_key: bool = Field(False, description="quantlab's local development key: fine for trying, "
                                  "never for shipping.")


class Manifest(_M):
    manifest_version: Literal[1] = MANIFEST_VERSION
    quantlab: dict[str, Any]
    created_at: str
    run: dict[str, Any] = Field(description="Run id, status, stage timestamps and durations; with --ray the "
                                "node and Ray job the checks ran on (placement) and a racing stop.")
    recipe: dict[str, Any] = Field(description="The resolved recipe and its sha256.")
    model: dict[str, Any] = Field(description="The unquantized source: kind, provenance, file hashes.")
    calibration: dict[str, Any] | None
    quantization: dict[str, Any]
    checkpoint_files: dict[str, dict[str, Any]] = Field(description="Every file of the signed folder but the "
                                                        "manifest and signature: size and sha256.")
    runtime: dict[str, Any] = Field(description="Serving engine, versions, kernels, KV cache, engine args.")
    hardware: dict[str, Any]
    results: dict[str, Any] = Field(description="Summary per check stage.")
    raw_files: list[RawFile]
    gates: list[GateVerdict]
    decision: DecisionRecord
    targets: dict[str, TargetDecision] = Field(default_factory=dict, description="Per serve target (only when "
                                               "the recipe names serve.targets): decision, why, required.")
    comparison: dict[str, Any] | None = Field(None, description="In a run of several candidates: whether this "
                                              "one was chosen, the rule, why, and every candidate's summary.")
    error_budget: dict[str, Any] | None = Field(None, description="How the run's error rates were spent: per "
                                                "check its tests, looks and alphas, the fixed thresholds, the run's "
                                                "bounds, and the decision rule's version (release/error_budget.py); "
                                                "None: a manifest from before the ledger.")
    signer: Signer | None = Field(None, description="Who signs it; None: unsigned (signing.method none), or a "
                                  "manifest written before quantlab recorded the signer.")
    registration: dict[str, Any] | None = Field(None, description="The gate set registered before any engine "
                                                "started: the statement's sha256 (its copy and signature are in "
                                                "the folder), its gate set's digest and the one decided under, "
                                                "when and how it was signed (release/registration.py); None: a "
                                                "manifest from before registrations.")
    attestation: dict[str, Any] | None = Field(None, description="The in-toto attestation that comes with this "
                                               "release (file, predicate type), named here before signing so that "
                                               "one removed is missed; None: unsigned, or a manifest from before "
                                               "attestations (release/attestation.py).")
    environments: dict[str, Any] | None = Field(None, description="Every package that ran, per environment "
                                                "(quantize, serving, serving-<target>): the CycloneDX SBOM in the "
                                                "folder (file, sha256, component count, the key packages' versions), "
                                                "the environment's lock, and its known vulnerabilities or why they "
                                                "were not checked (release/environments.py); a serving environment "
                                                "quantlab cannot see says so; None: a manifest from before SBOMs.")
    evidence: dict[str, Any] | None = Field(None, description="quantlab decide: the evidence was imported, not "
                                            "produced by quantlab: who produced it, every file judged (role, kind, "
                                            "the name given, its copy in the run, size, sha256) and how the "
                                            "checkpoint is tied to it; None: quantlab served both models itself.")


def policy_of_manifest(manifest: Manifest) -> DecisionPolicy:
    """The policy a manifest's decision was made under, read back from it."""
    return recorded_policy({n: t.required for n, t in manifest.targets.items()}, manifest.decision.not_shown_policy,
                           fallback=manifest.decision.fallback or "")


def folder_files(folder: Path) -> dict[str, dict[str, Any]]:
    """size and sha256 of every file below `folder`, but the manifest, its signature and the attestation."""
    return digests(folder, skip=lambda rel: rel in (MANIFEST_FILE, *NOT_SIGNED))


def symlinks(folder: Path) -> list[str]:
    """Symbolic links below `folder`: a released folder holds plain files only, so a link
    (which could point anywhere after signing) is refused by name."""
    return [p.relative_to(folder).as_posix() for p in sorted(Path(folder).rglob("*")) if p.is_symlink()]


def read_manifest(folder: Path) -> Manifest:
    f = Path(folder) / MANIFEST_FILE
    if not f.is_file():
        raise RecipeError(f"no {MANIFEST_FILE} in {folder}: not a folder released by quantlab (or the manifest "
                          "was removed)")
    try:
        return Manifest.model_validate(json.loads(f.read_text()))
    except (ValueError, ValidationError) as err:
        raise RecipeError(f"{f} is not a valid quantlab manifest: {str(err).splitlines()[0]}") from None


def json_schema() -> dict[str, Any]:
    schema = Manifest.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "quantlab release manifest"
    return schema


# ------------------------------------------------------------------ keys and signing

def generate_keypair(private_path: Path, public_path: Path, *, overwrite: bool = False) -> None:
    """An EC P-256 key pair as PEM files; the private key is created readable by its owner only."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private_path, public_path = Path(private_path), Path(public_path)
    for p in (private_path, public_path):
        if (p.exists() or p.is_symlink()) and not overwrite:
            raise RecipeError(f"{p} already exists; choose another path or pass --overwrite")
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    private_path.parent.mkdir(parents=True, exist_ok=True)
    public_path.parent.mkdir(parents=True, exist_ok=True)
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    for path, data, mode in ((private_path, pem, 0o600), (public_path, public_pem, 0o644)):
        if overwrite and (path.is_symlink() or path.exists()):
            path.unlink()  # the link itself, never where it points
        # O_EXCL: never write through a file or link planted between the check and the write
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
        except FileExistsError:
            raise RecipeError(f"{path} appeared while the key was being written (a file or a link); choose "
                              "another path") from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)


def public_key_fingerprint(public_pem: bytes) -> str:
    """sha256 of the DER public key: safe to print and record."""
    import hashlib

    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_public_key(public_pem)
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def public_pem_of(private_key: Path, password: str | None = None) -> bytes:
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(Path(private_key).read_bytes(),
                                                 password.encode() if password else None)
    except (ValueError, TypeError) as err:
        # the library's message names the problem, never the key's content
        raise RecipeError(f"cannot load the private key {private_key}: {err}", field="signing.private_key") from None
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _hashing_config():
    from model_signing import hashing

    return hashing.Config().set_ignored_paths(paths=list(NOT_SIGNED))


def sign_folder(folder: Path, *, method: str, private_key: Path | None = None, password: str | None = None,
                signing_certificate: Path | None = None, certificate_chain: list[Path] | None = None,
                use_staging: bool = False, identity_token: str | None = None) -> Path:
    """Sign every file of `folder` (manifest included) into folder/SIGNATURE_FILE, atomically:
    a failed signing leaves no signature file that looks valid."""
    from model_signing import signing

    cfg = signing.Config().set_hashing_config(_hashing_config())
    if method == "key":
        cfg = cfg.use_elliptic_key_signer(private_key=private_key, password=password)
    elif method == "certificate":
        cfg = cfg.use_certificate_signer(private_key=private_key, signing_certificate=signing_certificate,
                                         certificate_chain=certificate_chain or [])
    elif method == "sigstore":
        # no token given: the CI's workload identity (GitHub Actions with id-token: write), asked
        # afresh for each signing (its tokens live minutes, a run hours), else Sigstore's browser flow
        cfg = cfg.use_sigstore_signer(use_staging=use_staging, identity_token=identity_token,
                                      use_ambient_credentials=identity_token is None)
    else:
        raise ValueError(f"unknown signing method {method}")
    target = Path(folder) / SIGNATURE_FILE
    tmp = Path(folder).parent / f".{Path(folder).name}.{SIGNATURE_FILE}.partial"
    try:
        cfg.sign(folder, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def check_verification_args(*, public_key: Path | None = None, certificate_chain: list[Path] | None = None,
                            sigstore_identity: str | None = None, sigstore_issuer: str | None = None) -> None:
    """Refuse (RecipeError, exit 2) what a verifier was given that cannot verify anything:
    a key or certificate file that is missing or not what its option says. A folder that
    does not verify is a problem found (exit 1); this is the command used wrongly."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if sigstore_identity and not sigstore_issuer:
        raise RecipeError("--sigstore-identity needs --sigstore-issuer: an identity means something only with "
                          "the OIDC issuer that vouched for it (e.g. https://token.actions.githubusercontent.com)")
    if public_key is None and not certificate_chain and not sigstore_identity:
        raise RecipeError("say how to verify the signature: --public-key (key signing), --certificate-chain, "
                          "or --sigstore-identity with --sigstore-issuer")
    if public_key is not None:
        data = _read_given(public_key, "--public-key")
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, TypeError) as err:
            raise RecipeError(f"--public-key {public_key} is not a PEM public key ({str(err).splitlines()[0]}): pass "
                              "the .pub.pem file `quantlab keygen` wrote beside the private key") from None
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise RecipeError(f"--public-key {public_key} is a {type(key).__name__.lstrip('_')}, not an elliptic-curve "
                              "key: quantlab signs with EC P-256 keys (quantlab keygen)")
    for cert in certificate_chain or []:
        try:
            x509.load_pem_x509_certificates(_read_given(cert, "--certificate-chain"))
        except ValueError as err:
            raise RecipeError(f"--certificate-chain {cert} is not a PEM X.509 certificate ({str(err).splitlines()[0]}):"
                              " pass the certificates up to the root, one PEM file each") from None


def _read_given(path: Path, option: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise RecipeError(f"{option} {path}: {err.strerror or err}; pass an existing file") from None


def verify_signature(folder: Path, *, public_key: Path | None = None, certificate_chain: list[Path] | None = None,
                     sigstore_identity: str | None = None, sigstore_issuer: str | None = None) -> str | None:
    """None when the signature verifies; otherwise what model-signing found."""
    from model_signing import verifying

    sig = Path(folder) / SIGNATURE_FILE
    if not sig.is_file():
        return f"no signature ({SIGNATURE_FILE}) in {folder}: the manifest is unsigned"
    cfg = verifying.Config().set_hashing_config(_hashing_config())
    if public_key is not None:
        cfg = cfg.use_elliptic_key_verifier(public_key=public_key)
    elif certificate_chain:
        cfg = cfg.use_certificate_verifier(certificate_chain=certificate_chain)
    elif sigstore_identity:
        if not sigstore_issuer:
            raise RecipeError("--sigstore-identity needs --sigstore-issuer: an identity means something only with "
                              "the OIDC issuer that vouched for it (e.g. https://token.actions.githubusercontent.com)")
        try:
            cfg = cfg.use_sigstore_verifier(identity=sigstore_identity, oidc_issuer=sigstore_issuer)
        except Exception as err:  # the trust root is fetched (TUF) from Sigstore's servers
            return (f"Sigstore verification needs Sigstore's trust root, which could not be loaded (no network "
                    f"access to Sigstore?): {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    else:
        raise RecipeError("say how to verify the signature: --public-key (key signing), --certificate-chain, "
                          "or --sigstore-identity with --sigstore-issuer")
    try:
        cfg.verify(folder, sig)
    except ValueError as err:
        return f"signature check failed: {err}"
    except Exception as err:  # a malformed signature file surfaces as a parse error of its format
        return f"signature check failed ({type(err).__name__}): {err}"
    return None


def _signer_problems(manifest: Manifest, signature_args: dict[str, Any]) -> list[str]:
    """The manifest says how it is signed; verifying it another way, or with another key,
    is a problem even where that signature holds."""
    signer = manifest.signer
    if signer is None:
        return []
    used = ("key" if signature_args.get("public_key") else "certificate" if signature_args.get("certificate_chain")
            else "sigstore" if signature_args.get("sigstore_identity") else None)
    if used == "key" and signer.method == "certificate":
        used = "certificate"  # a certificate's public key verifies its signature too
    if used is not None and used != signer.method:
        return [f"the manifest says it is signed by method '{signer.method}', but it was verified by '{used}'"]
    key = signature_args.get("public_key")
    if key is not None and signer.key_fingerprint:
        try:
            given = public_key_fingerprint(Path(key).read_bytes())
        except (OSError, ValueError) as err:
            return [f"cannot read the public key {key}: {err}"]
        if given != signer.key_fingerprint:
            return [f"the manifest says it is signed by key {signer.key_fingerprint}, not by the key given ({given})"]
    return []


def verify_folder(folder: Path, **signature_args) -> list[str]:
    """Every problem found in a released folder; an empty list means verified (the
    integrity: whether the decision was release is the caller's to judge)."""
    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
    except RecipeError as err:  # missing or malformed: not verified, whatever else holds
        return [str(err)]
    problems = [f"symlink: {name} (a released folder holds plain files only)" for name in symlinks(folder)]
    problems += _signer_problems(manifest, signature_args)
    on_disk = folder_files(folder)
    for name, meta in manifest.checkpoint_files.items():
        if name not in on_disk:
            problems.append(f"missing file: {name} (listed in the manifest)")
        elif on_disk[name]["sha256"] != meta["sha256"]:
            problems.append(f"changed file: {name} (sha256 {on_disk[name]['sha256'][:12]}..., the manifest says "
                            f"{meta['sha256'][:12]}...)")
    for name in sorted(set(on_disk) - set(manifest.checkpoint_files)):
        problems.append(f"added file: {name} (not in the manifest)")
    rule = manifest.decision.rule_version or 1  # a manifest signed before rules had versions: rule 1
    try:
        expected = decide(manifest.gates, policy_of_manifest(manifest), rule=rule)
    except ValueError as err:
        return problems + [str(err)]
    for name, want in expected.targets.items():
        got = manifest.targets[name]
        if (got.decision, got.failed_gates, got.not_shown_gates) != \
                (want.decision, want.failed_gates, want.not_shown_gates):
            problems.append(f"target '{name}': decision '{got.decision}' does not follow from the manifest's "
                            f"gate verdicts (they give '{want.decision}')")
    run_decision = expected.record
    recorded = manifest.decision
    if (run_decision.decision, run_decision.failed_gates, run_decision.not_shown_gates) != \
            (recorded.decision, recorded.failed_gates, recorded.not_shown_gates):
        problems.append(f"decision '{manifest.decision.decision}' does not follow from the manifest's gate verdicts "
                        f"(they give '{run_decision.decision}': {run_decision.why})")
    sig_problem = verify_signature(folder, **signature_args)
    if sig_problem:
        problems.append(sig_problem)
    return problems
