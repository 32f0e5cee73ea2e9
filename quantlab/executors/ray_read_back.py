"""The driver's read-back of `--ray`: nothing on the shared storage is trusted for being there.

Each task hands back, as its Ray return value, the sha256 of every file it left in its
run folder (its checkpoint's as the quantize stage recorded them: ray_node.written_files);
the driver hashes the folder it reads against those (and the files it wrote itself before
the task, against its own digests) and refuses the comparison (IntegrityError, exit 3,
naming each file) on an added, missing or changed file, before any decision or signature;
the release then compares the checkpoint's files with their record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantlab.core import folder_record
from quantlab.core.errors import IntegrityError, QuantlabError
from quantlab.core.layout import CHECKPOINT_DIR, RECORD_FILE
from quantlab.core.run import RunDir
from quantlab.executors.ray_node import NodeOutcome
from quantlab.pipeline.candidates.members import Candidate


def own_digests(cands: list[Candidate]) -> dict[str, dict[str, str]]:
    """What this machine wrote into each run folder before its task (the registration), by
    candidate: checked against these digests, not the task's."""
    return {c.name: {rel: d["sha256"] for rel, d in
                     folder_record.digests(c.run.path, skip=lambda rel: rel == RECORD_FILE).items()} for c in cands}


def read_back_problems(run_path: Path, written: dict[str, Any], own: dict[str, str]) -> list[str]:
    """The run folder on the shared storage against what its task handed back (`written`) and
    what this machine wrote there before the task (`own`, which wins): each added, missing or
    changed file, in words; the record's checkpoint files against the task's. Empty: it holds."""
    expected = {**written["files"], **own}
    files, others = folder_record.walk(run_path)
    problems = [f"not a plain file: {rel}" for rel in others
                if not rel.startswith(f"{CHECKPOINT_DIR}/") and rel not in written.get("not_files", [])]
    seen = set()
    for rel in files:
        if rel.startswith(f"{CHECKPOINT_DIR}/"):
            continue  # hashed against the checkpoint's record by the release stage
        seen.add(rel)
        if rel not in expected:
            problems.append(f"added file: {rel} (its task did not write it)")
        elif folder_record.file_digest(run_path / rel)["sha256"] != expected[rel]:
            problems.append(f"changed file: {rel} (not the sha256 its task handed back)")
    problems += [f"missing file: {rel} (its task wrote it)" for rel in expected if rel not in seen]
    if not problems and (record_problem := _checkpoint_record_problem(run_path, written)):
        problems.append(record_problem)
    return problems


def _checkpoint_record_problem(run_path: Path, written: dict[str, Any]) -> str | None:
    """run.json (its bytes checked already) against the checkpoint files the task recorded."""
    record = RunDir.open(run_path).record
    made = record.result("quantize") or record.result("checkpoint")
    mine = {rel: f.sha256 for rel, f in made.files.items()} if made is not None else None
    if mine != written.get("checkpoint"):
        return f"{RECORD_FILE}: its checkpoint files are not those its task recorded"
    return None


def check_read_back(cands: list[Candidate], outcomes: dict[str, NodeOutcome], own: dict[str, dict[str, str]]) -> None:
    """Every candidate's run folder as its task handed it back, before any decision or signature
    is made from it; IntegrityError (exit 3) naming the files otherwise (the records say so)."""
    wrong = {}
    for c in cands:
        out = outcomes.get(c.name)
        if out is None or out.written is None:  # the task itself failed: nothing is read from it to release
            continue
        problems = read_back_problems(c.run.path, out.written, own.get(c.name, {}))
        if problems:
            wrong[c.name] = problems
    if not wrong:
        return
    for c in [c for c in cands if c.name in wrong]:
        try:
            run = RunDir.open(c.run.path)
            run.record.status = "failed"
            run.save()
        except (QuantlabError, OSError, ValueError):
            pass  # a record that cannot be read back is among the problems named
    folders = {c.name: c.run.path for c in cands}
    said = "; ".join(f"candidate {n} ({folders[n]}): " + ", ".join(p[:8]) for n, p in wrong.items())
    raise IntegrityError(f"ray: the shared storage does not hold what the candidates' tasks wrote; nothing is decided "
                         f"or signed from it: {said}. Something changed the storage folder after the tasks ended: "
                         "run the comparison again", cause="the shared storage changed after its tasks wrote it")
