"""`quantlab verify --evidence`: the files a user holds against the imported evidence a release
was decided on (its manifest's `evidence`, written by `quantlab decide`), by sha256.

A file given is verified when its digest is one the manifest records; one the manifest does not
record is a problem (it was not what the decision judged), and so is a manifest with no imported
evidence at all. A folder given stands for its lm-eval files: each that bears the name of a file
the decision read must match its digest; the others (tasks the recipe did not judge) are not
evidence and are passed over. Recorded files not given are listed, not a problem: a user may
hold only the candidate's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantlab.core.fsutil import sha256_file

LM_EVAL_FILES = ("results_*.json", "samples_*.jsonl")


def given_files(paths: list[Path]) -> list[tuple[Path, bool]]:
    """Each path with whether it was named itself (a folder stands for the lm-eval files below it)."""
    out: list[tuple[Path, bool]] = []
    for p in paths:
        if Path(p).is_dir():
            out += [(f, False) for f in sorted({f for pattern in LM_EVAL_FILES for f in Path(p).rglob(pattern)
                                                if f.is_file()})]
        else:
            out.append((Path(p), True))
    return out


def check_evidence(evidence: dict[str, Any] | None, paths: list[Path]) -> tuple[list[str], list[str]]:
    """(problems, notes) of the files given against the manifest's evidence record."""
    if not evidence:
        return ["--evidence: this release was not decided on imported evidence (its manifest records none): "
                "quantlab produced its evidence by serving both models"], []
    files = evidence.get("files") or []
    recorded = {f["sha256"]: f for f in files}
    problems, matched = [], set()
    names = {Path(r["source"]).name for r in files}
    for f, named in given_files(paths):
        if not f.is_file():
            problems.append(f"--evidence {f}: not a file")
            continue
        digest = sha256_file(f)
        if digest in recorded:
            matched.add(digest)
        elif not named and f.name not in names:
            continue  # in a folder given, beside the judged files: another task's samples, not evidence
        else:
            problems.append(f"--evidence {f}: sha256 {digest[:16]}... is none of the {len(files)} files the "
                            "decision was made on (changed since, or another run's)")
    unmatched = [r for r in files if r["sha256"] not in matched]
    notes = [f"evidence: {len(files) - len(unmatched)} of the {len(files)} recorded file(s) matched by the files "
             "given"]
    if unmatched:
        notes.append("not given: " + ", ".join(f"{r['role']} {r['kind']} {Path(r['source']).name}"
                                               for r in unmatched[:5]) + (" ..." if len(unmatched) > 5 else ""))
    return problems, notes
