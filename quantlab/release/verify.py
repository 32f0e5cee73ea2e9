"""`quantlab verify`: a released folder checked whole (release/manifest.verify_folder: the
signature, every file, the decision from the verdicts) and its registration
(release/registration.verify_registration: the statement, its signature, the gate set
the decision was made under)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import sha256_file
from quantlab.core.layout import REGISTRATION_FILE, REGISTRATION_SIG, SIGNATURE_FILE
from quantlab.release.manifest import read_manifest, verify_folder, verify_signature


def verify_release(folder: Path, **signature_args) -> list[str]:
    """Every problem found; an empty list means verified."""
    problems = verify_folder(folder, **signature_args)
    try:
        manifest = read_manifest(folder)
    except RecipeError:
        return problems  # said by verify_folder already
    return problems + verify_registration(folder, manifest.registration, **signature_args)


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
