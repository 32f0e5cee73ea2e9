"""`quantlab verify`: a released folder checked whole (release/manifest.verify_folder: the
signature, every file, the decision from the verdicts), its registration
(verify_registration: the statement, its signature, the gate set the decision was made
under), the signer held to the record (the rule its quantlab knew, the gates the
registration calls for, the stream level its history gives: release/rule_history,
release/registered_gates, release/stream_consistency), the signing key
(the local development key only when allowed) and its attestation
(release/attestation.verify_attestation).

What it cannot catch: whoever holds the key can sign a self-consistent record of
measurements never made. It holds the signer to what the record says of itself."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantlab.core.digest import json_sha256
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import sha256_file
from quantlab.core.layout import REGISTRATION_FILE, REGISTRATION_SIG, SIGNATURE_FILE
from quantlab.release.attestation import verify_attestation
from quantlab.release.gate_consistency import consistency_problems
from quantlab.release.manifest import (
    Manifest,
    check_verification_args,
    public_key_fingerprint,
    read_manifest,
    verify_folder,
    verify_signature,
)
from quantlab.release.registered_gates import gate_set_problems
from quantlab.release.rule_history import legacy_note, rule_problems
from quantlab.release.signing_key import local_public_key
from quantlab.release.stream_consistency import claim_problems, stream_problems

DEV_KEY_FIX = ("to ship, sign with a key of your own (`quantlab keygen`, then the recipe's signing.private_key), "
               "a certificate (signing.method: certificate) or Sigstore (signing.method: sigstore); pass "
               "--allow-dev-key to accept it for a trial")


@dataclass
class Verified:
    problems: list[str] = field(default_factory=list)  # none: verified
    notes: list[str] = field(default_factory=list)  # said, not held against it


def verify_release(folder: Path, *, require_attestation: bool = False, allow_dev_key: bool = False,
                   allow_legacy: bool = False, **signature_args) -> Verified:
    """Every problem found (none: verified), and what is only worth saying. Raises
    RecipeError (exit 2) for verification arguments that cannot verify anything.
    `allow_legacy`: accept a manifest of a quantlab from before every release carried a
    registration (rule_history.LEGACY_VERSIONS)."""
    check_verification_args(**signature_args)
    problems = verify_folder(folder, **signature_args)
    try:
        manifest = read_manifest(folder)
    except RecipeError:
        return Verified(problems)  # said by verify_folder already
    problems += verify_registration(folder, manifest.registration, **signature_args)
    statement, _ = read_statement(folder) if manifest.registration is not None else (None, None)
    gates = statement.get("gates") if isinstance(statement, dict) else None
    registered_rule = gates.get("rule_version") if isinstance(gates, dict) else None
    problems += rule_problems(manifest, registered_rule, allow_legacy=allow_legacy)
    notes = [note] if allow_legacy and (note := legacy_note(manifest)) else []
    problems += consistency_problems(manifest)
    problems += stream_problems(manifest)  # the level its stream position gives, from the history it records
    if isinstance(statement, dict):
        problems += gate_set_problems(manifest, statement)
        problems += claim_problems(manifest, statement)  # its place in the stream, as registered
    problems += dev_key_problems(manifest, allow=allow_dev_key, public_key=signature_args.get("public_key"))
    if not (Path(folder) / SIGNATURE_FILE).is_file() and not require_attestation:  # unsigned: said already
        return Verified(problems, notes)
    attested, attestation_notes = verify_attestation(folder, manifest, require=require_attestation, **signature_args)
    return Verified(problems + attested, notes + attestation_notes)


def dev_key_problems(manifest: Manifest, *, allow: bool, public_key: Path | None = None) -> list[str]:
    """A release signed with quantlab's local development key (the manifest says so, or the
    key given is this machine's development key): a problem unless allowed. That key is
    made unasked on whatever machine ran quantlab and guards nothing anyone else could trust."""
    if allow:
        return []
    signer = manifest.signer
    if signer is not None and signer.development_key:
        return [f"signed with quantlab's local development key ({signer.key_fingerprint}), made on the machine that "
                f"ran it for trying quantlab, not for shipping: {DEV_KEY_FIX}"]
    if public_key is not None and _is_local_dev_key(Path(public_key)):
        return [f"the key given ({public_key}) is this machine's local development key: a release it verifies "
                f"is a trial's, whatever its manifest says; {DEV_KEY_FIX}"]
    return []


def _is_local_dev_key(public_key: Path) -> bool:
    local = local_public_key()
    try:
        return local.is_file() and public_key_fingerprint(public_key.read_bytes()) == \
            public_key_fingerprint(local.read_bytes())
    except (OSError, ValueError):
        return False


def read_statement(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The folder's registration statement as JSON, or why it cannot be read (a problem)."""
    path = Path(folder) / REGISTRATION_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None, f"the manifest records a registration, but {REGISTRATION_FILE} is not in the folder"
    except (OSError, ValueError) as err:
        return None, f"{REGISTRATION_FILE} is not a registration statement (not JSON: {err})"
    if not isinstance(doc, dict):
        return None, f"{REGISTRATION_FILE} is not a registration statement (a JSON {type(doc).__name__})"
    return doc, None


def verify_registration(folder: Path, registration: dict[str, Any] | None, **signature_args) -> list[str]:
    """Problems with a released folder's registration (none recorded: a manifest from before
    registrations, nothing to check)."""
    if registration is None:
        return []
    path = Path(folder) / REGISTRATION_FILE
    if not path.is_file():
        return [f"the manifest records a registration, but {REGISTRATION_FILE} is not in the folder"]
    problems = []
    if sha256_file(path) != registration.get("sha256"):
        problems.append(f"{REGISTRATION_FILE} is not the registration the manifest records (sha256 differs)")
    doc, unreadable = read_statement(folder)
    if unreadable:
        problems.append(unreadable)
    elif json_sha256(doc.get("gates")) != doc.get("gates_sha256"):
        problems.append(f"{REGISTRATION_FILE}: its gate set does not hash to the gates_sha256 it states (the gates "
                        "were edited after they were registered)")
    elif doc.get("gates_sha256") != registration.get("gates_sha256_at_decision"):
        problems.append("the decision was made under a gate set other than the registered one (registered "
                        f"{str(doc.get('gates_sha256'))[:12]}, decided under "
                        f"{str(registration.get('gates_sha256_at_decision'))[:12]})")
    if registration.get("signed"):
        sig = Path(folder) / REGISTRATION_SIG
        if not sig.is_file():
            return problems + [f"the registration is recorded as signed, but {REGISTRATION_SIG} is missing"]
        with tempfile.TemporaryDirectory() as tmp:  # its signature covers a folder holding only the statement
            shutil.copyfile(path, Path(tmp) / REGISTRATION_FILE)
            shutil.copyfile(sig, Path(tmp) / SIGNATURE_FILE)
            problem = verify_signature(Path(tmp), **signature_args)
        if problem:
            problems.append(f"registration: {problem}")
    return problems
