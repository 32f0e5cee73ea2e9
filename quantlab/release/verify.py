"""`quantlab verify`: a released folder checked whole (release/manifest.verify_folder: the
signature, every file, the decision from the verdicts), its registration
(verify_registration: the statement, its signature, the gate set the decision was made
under) and its attestation (release/attestation.verify_attestation)."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import sha256_file
from quantlab.core.layout import REGISTRATION_FILE, REGISTRATION_SIG, SIGNATURE_FILE
from quantlab.release.attestation import verify_attestation
from quantlab.release.manifest import read_manifest, verify_folder, verify_signature


@dataclass
class Verified:
    problems: list[str] = field(default_factory=list)  # none: verified
    notes: list[str] = field(default_factory=list)  # said, not held against it


def verify_release(folder: Path, *, require_attestation: bool = False, **signature_args) -> Verified:
    """Every problem found (none: verified), and what is only worth saying."""
    problems = verify_folder(folder, **signature_args)
    try:
        manifest = read_manifest(folder)
    except RecipeError:
        return Verified(problems)  # said by verify_folder already
    problems += verify_registration(folder, manifest.registration, **signature_args)
    if not (Path(folder) / SIGNATURE_FILE).is_file() and not require_attestation:  # unsigned: said already
        return Verified(problems)
    attested, notes = verify_attestation(folder, manifest, require=require_attestation, **signature_args)
    return Verified(problems + attested, notes)


def verify_registration(folder: Path, registration: dict[str, Any] | None, **signature_args) -> list[str]:
    """Problems with a released folder's registration (none recorded: a manifest from before
    registrations, nothing to check)."""
    if registration is None:
        return []
    path = Path(folder) / REGISTRATION_FILE
    if not path.is_file():
        return [f"the manifest records a registration, but {REGISTRATION_FILE} is not in the folder"]
    problems = []
    if sha256_file(path) != registration["sha256"]:
        problems.append(f"{REGISTRATION_FILE} is not the registration the manifest records (sha256 differs)")
    doc = json.loads(path.read_text())
    if doc.get("gates_sha256") != registration.get("gates_sha256_at_decision"):
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
