"""Evidence stage (`quantlab decide`): the user's lm-eval outputs and benchmark files copied
into the run folder (evidence/<role>/<kind>/) and hashed as they are copied; the checks judge
the copies and the manifest names each file with its sha256.

An lm-eval output given as a folder brings its results_*.json and samples_*.jsonl files (its
sub-folders too: lm-eval writes one per model); given as one results file, that file and the
samples files beside it. A link, or anything but a plain file, is refused, naming it: what is
judged and signed is never reached through a path the user did not name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantlab.core import folder_record
from quantlab.core.errors import RecipeError
from quantlab.core.evidence import BENCH, EVALS, EVIDENCE_DIR, IMPORTED_BY, OPTION, Evidence, copy_folder
from quantlab.core.fsutil import remove_tree, sha256_file
from quantlab.core.results import EvidenceFile, EvidenceResult
from quantlab.core.stage_context import StageContext

NAME = "evidence"
LM_EVAL_FILES = ("results_*.json", "samples_*.jsonl")


def _evidence(ctx: StageContext) -> Evidence:
    if getattr(ctx, "evidence", None) is None:
        raise RecipeError("the evidence stage needs files to import (quantlab decide --baseline-evals ... "
                          "--candidate-evals ... / --baseline-bench ... --candidate-bench ...)")
    return ctx.evidence


def eval_files(given: Path, role: str) -> tuple[list[tuple[str, Path]], str]:
    """(relative name in the copy, file) of an lm-eval output, and what the reader is pointed at."""
    field = OPTION[EVALS].format(role=role)
    if given.is_file():
        picked = [given] + sorted(p for p in given.parent.glob("samples_*.jsonl") if p != given)
        files, reader = [(p.name, p) for p in picked], given.name
    else:
        files = sorted({(str(p.relative_to(given)), p) for pattern in LM_EVAL_FILES for p in given.rglob(pattern)})
        reader = "."
        if not files:
            raise RecipeError(f"{given} holds no lm-eval output (no results_*.json or samples_*.jsonl below it): "
                              "give the folder lm-eval's --output_path wrote, from a run with --log_samples",
                              file=str(given), field=field)
    for _, p in files:
        if p.is_symlink() or not p.is_file():
            raise RecipeError(f"{p} is {'a link' if p.is_symlink() else 'not a plain file'}: evidence is read from "
                              "plain files only; copy the file it stands for in its place", file=str(p), field=field)
    return files, reader


def inputs(ctx: StageContext) -> dict[str, Any]:
    # the files' digests: evidence replaced under the same names is imported again
    return {"evidence": [(role, kind, str(p), sha256_file(p) if p.is_file() else None)
                         for role, kind, p in _evidence(ctx).paths()]}


def preflight(ctx: StageContext) -> None:
    ev = _evidence(ctx)
    check_sections(ctx, ev)
    for role, given in ev.evals.items():
        eval_files(given, role)
    for role, files in ev.bench.items():
        for p in files:
            if p.is_symlink() or not p.is_file():
                raise RecipeError(f"{p} is not a plain file: give the benchmark's result file itself",
                                  file=str(p), field=OPTION[BENCH].format(role=role))


def check_sections(ctx: StageContext, ev: Evidence) -> None:
    """Every check the recipe asks for is judged, or the decision is refused: a check that needs
    a served model (stability, the serve targets) cannot be judged on imported files, and one
    whose evidence was not given would be dropped silently."""
    r, path = ctx.recipe, str(ctx.loaded.path)
    served = [(field, name) for field, name, on in (("stability", "stability", r.stability is not None),
                                                   ("serve.targets", "the serve targets", bool(r.serve.targets)))
              if on]
    if served:
        field, name = served[0]
        raise RecipeError(f"the recipe asks for {name}, which needs a model quantlab serves: imported files cannot "
                          f"show it. Remove `{field}` for `quantlab decide` (the decision is then made without it, "
                          "as the manifest's gates show), or run `quantlab validate` where both models can be "
                          "served", file=path, field=field)
    for section, kind, given in (("quality", EVALS, ev.evals), ("performance", BENCH, ev.bench)):
        if getattr(r, section) is not None and not given:
            raise RecipeError(f"the recipe has a {section} section but no {kind} evidence was given: its gates would "
                              f"be dropped. Give {OPTION[kind].format(role='baseline')} and "
                              f"{OPTION[kind].format(role='candidate')}, or remove `{section}` from the recipe",
                              file=path, field=section)


def run(ctx: StageContext) -> EvidenceResult:
    ev = _evidence(ctx)
    remove_tree(ctx.run.path / EVIDENCE_DIR)  # a resume imports anew: the copies are of the files as they are now
    files: list[EvidenceFile] = []
    evals: dict[str, str] = {}
    bench: dict[str, list[str]] = {}
    for role, given in ev.evals.items():
        picked, reader = eval_files(given, role)
        into = copy_folder(ctx.run.path, role, EVALS)
        files += [_copied(ctx, role, EVALS, src, into / rel) for rel, src in picked]
        evals[role] = str((into / reader).relative_to(ctx.run.path)) if reader != "." else \
            str(into.relative_to(ctx.run.path))
    for role, given_files in ev.bench.items():
        into = copy_folder(ctx.run.path, role, BENCH)
        copies = [_copied(ctx, role, BENCH, src, into / f"{i + 1}-{src.name}") for i, src in enumerate(given_files)]
        files += copies
        bench[role] = [c.copied for c in copies]
    ctx.progress(f"evidence: {len(files)} file(s) copied into the run and hashed "
                 f"({', '.join(f'{k}: {sum(f.kind == k for f in files)}' for k in (EVALS, BENCH))})")
    return EvidenceResult(imported=IMPORTED_BY, files=files, evals=evals, bench=bench)


def _copied(ctx: StageContext, role: str, kind: str, src: Path, dst: Path) -> EvidenceFile:
    digest = folder_record.copy_hashed(src, dst)
    rel = str(dst.relative_to(ctx.run.path))
    ctx.add_artifact(rel, f"evidence-{role}-{kind}")
    return EvidenceFile(role=role, kind=kind, source=str(src), copied=rel, size=digest["size"], sha256=digest["sha256"])
