"""Evidence stage (`quantlab decide`): the user's lm-eval outputs and benchmark files copied
into the run folder (evidence/<role>/<kind>/) and hashed as they are copied; the checks judge
the copies and the manifest names each file with its sha256.

Of an lm-eval output only what the decision reads is copied and recorded: the one run's results
file and the samples files of the recipe's tasks (quality/lmeval_logs.read_eval_log's files),
under lm-eval's own names (its files pair by name). A file given twice (the same bytes as two
repeats, or as both roles' evidence) is refused: a candidate judged on the baseline's own files,
or a repeat counted twice, shows what it does not have. A link, or anything but a plain file,
is refused too, naming it. So is a check the files cannot judge (release/evidence_stage
check_sections)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantlab.core import folder_record
from quantlab.core.errors import RecipeError
from quantlab.core.evidence import BENCH, EVALS, EVIDENCE_DIR, IMPORTED_BY, OPTION, Evidence, copy_folder
from quantlab.core.fsutil import remove_tree, sha256_file
from quantlab.core.results import EvidenceFile, EvidenceResult
from quantlab.core.stage_context import StageContext
from quantlab.performance.bench_files import read_bench_file
from quantlab.quality.lmeval_logs import EvalLog, role_logs_once
from quantlab.quality.work import runnable, suites_of

NAME = "evidence"


def _evidence(ctx: StageContext) -> Evidence:
    if getattr(ctx, "evidence", None) is None:
        raise RecipeError("the evidence stage needs files to import (quantlab decide --baseline-evals ... "
                          "--candidate-evals ... / --baseline-bench ... --candidate-bench ...)")
    return ctx.evidence


def judged_tasks(ctx: StageContext) -> list[str]:
    """The recipe's quality tasks: what the decision reads of an lm-eval output."""
    work, _ = runnable(suites_of(ctx), None)
    return [t.task for _, t in work]


def eval_files(given: Path, log: EvalLog, role: str) -> tuple[list[tuple[str, Path]], str]:
    """(name in the copy, file) of what the decision reads of one lm-eval output (its results
    file and the recipe's tasks' samples files), and where the reader is pointed in the copy."""
    base = given if given.is_dir() else given.parent
    files = [(str(p.relative_to(base)), p) for p in log.files]
    for _, p in files:
        if p.is_symlink() or not p.is_file():
            raise RecipeError(f"{p} is {'a link' if p.is_symlink() else 'not a plain file'}: evidence is read from "
                              "plain files only; copy the file it stands for in its place", file=str(p),
                              field=OPTION[EVALS].format(role=role))
    return files, "." if given.is_dir() else given.name


def _given(ctx: StageContext, ev: Evidence) -> list[tuple[str, str, list[tuple[str, Path]], str]]:
    """(role, kind, [(name in the copy, file)], reader path) of everything given: one entry an
    lm-eval output, one a role's benchmark files."""
    tasks = judged_tasks(ctx) if ev.evals else []
    out = []
    for role, paths in ev.evals.items():
        logs = role_logs_once(ctx, paths, tasks, field=OPTION[EVALS].format(role=role))
        for given, log in zip(paths, logs, strict=True):
            files, reader = eval_files(given, log, role)
            out.append((role, EVALS, files, reader))
    for role, paths in ev.bench.items():
        for p in paths:
            if p.is_symlink() or not p.is_file():
                raise RecipeError(f"{p} is not a plain file: give the benchmark's result file itself",
                                  file=str(p), field=OPTION[BENCH].format(role=role))
        out.append((role, BENCH, [(f"{i + 1}-{p.name}", p) for i, p in enumerate(paths)], ""))
    return out


def refuse_repeated(given: list[tuple[str, str, list[tuple[str, Path]], str]]) -> None:
    """The same run given twice: a repeat counted twice, or a role judged on the other's files.
    A run is its benchmark file, or its lm-eval results file (dated, timed: two runs never write
    the same bytes); one task's samples files may be alike when two models answer alike."""
    seen: dict[str, tuple[str, Path]] = {}
    for role, kind, files, _ in given:
        for _, p in files if kind == BENCH else files[:1]:  # an lm-eval output's first file is its results file
            digest = sha256_file(p)
            if digest in seen:
                first_role, first = seen[digest]
                raise RecipeError(f"{p} ({role} {kind}) holds the same bytes as {first} ({first_role}): each file is "
                                  "evidence once. A repeat given twice adds no spread and a role judged on the "
                                  "other's files shows nothing; give each repeat's own file and each role's own run",
                                  file=str(p), field=OPTION[kind].format(role=role))
            seen[digest] = (role, p)


def inputs(ctx: StageContext) -> dict[str, Any]:
    # the files' digests: evidence replaced under the same names is imported again
    return {"evidence": [(role, kind, str(p), sha256_file(p) if p.is_file() else None)
                         for role, kind, p in _evidence(ctx).paths()]}


def preflight(ctx: StageContext) -> None:
    ev = _evidence(ctx)
    check_sections(ctx, ev)
    given = _given(ctx, ev)
    refuse_repeated(given)
    for role, kind, files, _ in given:
        if kind == BENCH:
            for _, p in files:
                read_bench_file(p)  # not a benchmark result, or without per-request rows: refused now


def check_sections(ctx: StageContext, ev: Evidence) -> None:
    """Every check the recipe asks for is judged, or the decision is refused: a check that needs
    a served model (stability, the serve targets, quality at load) cannot be judged on imported files, one whose
    evidence was not given would be dropped silently, and evidence no check reads is refused."""
    r, path = ctx.recipe, str(ctx.loaded.path)
    served = [(field, name) for field, name, on in (("stability", "stability", r.stability is not None),
                                                   ("serve.targets", "the serve targets", bool(r.serve.targets)),
                                                   ("load_quality", "quality at load",
                                                    getattr(r, "load_quality", None) is not None))
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
        if getattr(r, section) is None and given:
            raise RecipeError(f"{kind} evidence was given but the recipe has no {section} section to judge it by: add "
                              f"its gates to the recipe, or leave out {OPTION[kind].format(role='baseline')} and "
                              f"{OPTION[kind].format(role='candidate')}", file=path, field=section)


def run(ctx: StageContext) -> EvidenceResult:
    ev = _evidence(ctx)
    remove_tree(ctx.run.path / EVIDENCE_DIR)  # a resume imports anew: the copies are of the files as they are now
    given = _given(ctx, ev)
    refuse_repeated(given)
    files: list[EvidenceFile] = []
    evals: dict[str, list[str]] = {}
    bench: dict[str, list[str]] = {}
    for role, kind, picked, reader in given:
        into = copy_folder(ctx.run.path, role, kind)
        if kind == EVALS:  # each output in a folder of its own: lm-eval's names pair its files
            into = into / str(len(evals.get(role, [])) + 1)
        copies = [_copied(ctx, role, kind, src, into / rel) for rel, src in picked]
        files += copies
        if kind == EVALS:
            evals.setdefault(role, []).append(str((into / reader).relative_to(ctx.run.path)) if reader != "." else
                                              str(into.relative_to(ctx.run.path)))
        else:
            bench[role] = [c.copied for c in copies]
    ctx.progress(f"evidence: {len(files)} file(s) copied into the run and hashed "
                 f"({', '.join(f'{k}: {sum(f.kind == k for f in files)}' for k in (EVALS, BENCH))})")
    return EvidenceResult(imported=IMPORTED_BY, files=files, evals=evals, bench=bench,
                          facts=_facts(ctx, evals, bench))


def _facts(ctx: StageContext, evals: dict[str, list[str]], bench: dict[str, list[str]]) -> dict[str, Any]:
    """What the copies say of how they were made, per role: each lm-eval run's model, versions,
    seeds and environment; each benchmark file's facts and what it leaves unknown."""
    out: dict[str, Any] = {}
    tasks = judged_tasks(ctx) if evals else []
    for role, rels in evals.items():
        logs = role_logs_once(ctx, [ctx.run.path / rel for rel in rels], tasks,
                              field=OPTION[EVALS].format(role=role))
        out.setdefault(role, {})[EVALS] = [{"model": log.model_name, "lm_eval": log.lm_eval_version,
                                            "tasks": sorted(log.tasks), "seeds": log.seeds, "limit": log.limit,
                                            **log.facts} for log in logs]
    for role, rels in bench.items():
        out.setdefault(role, {})[BENCH] = [{"file": Path(rel).name, "tool": r.tool, **r.facts, "unknown": r.unknown}
                                           for rel in rels for r in read_bench_file(ctx.run.path / rel)]
    return out


def _copied(ctx: StageContext, role: str, kind: str, src: Path, dst: Path) -> EvidenceFile:
    digest = folder_record.copy_hashed(src, dst)
    rel = str(dst.relative_to(ctx.run.path))
    ctx.add_artifact(rel, f"evidence-{role}-{kind}")
    return EvidenceFile(role=role, kind=kind, source=str(src), copied=rel, size=digest["size"], sha256=digest["sha256"])
