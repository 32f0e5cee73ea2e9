"""Runs the stages of a recipe in order and writes the run record after each one (the
CLI's other commands are in pipeline/commands.py).

Resume: a stage is redone when it has no `ok` record, when the hash of its inputs
changed (each stage's `inputs`, core/stage_context.py), or when a stage before it was redone. So an
edited serve section re-serves and keeps the checkpoint, an edited quantization
section starts again from quantize, and an edited description changes nothing.
Before the first stage runs, every stage that will run gets its preflight.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from quantlab.core import checks as check_table
from quantlab.core.digest import inputs_hash
from quantlab.core.progress import Progress
from quantlab.core.verdicts import gate_id
from quantlab.pipeline import streams
from quantlab.pipeline.context import RunContext
from quantlab.release.decision import importance
from quantlab.reports.stage_plots import draw as draw_plots
from quantlab.core.engine_time import engine_seconds
from quantlab.core.errors import EngineError, GateFailure, QuantlabError, RecipeError
from quantlab.core import folder_record
from quantlab.core.fsutil import write_text_atomic
from quantlab.core.layout import ERROR_DIR
from quantlab.recipe.family import Family
from quantlab.release.registration import register
from quantlab.recipe.file import LoadedRecipe
from quantlab.core.run import AttemptTime, RunDir, StageRecord, now_iso
from quantlab.quantize import checkpoint_stage
from quantlab.performance import stage as perf_stage
from quantlab.quality import stage as quality_stage
from quantlab.quantize import stage as quantize_stage
from quantlab.release import stage as release_stage
from quantlab.serving import stage as serve_stage
from quantlab.stability import stage as stability_stage
from quantlab.targets import stage as targets_stage

STAGES: list[ModuleType] = [quantize_stage, serve_stage, quality_stage, perf_stage, stability_stage, targets_stage,
                            release_stage]
# quantlab validate: an existing checkpoint instead of quantizing
VALIDATE_STAGES: list[ModuleType] = [checkpoint_stage, serve_stage, quality_stage, perf_stage, stability_stage,
                                     targets_stage, release_stage]


def enabled(stage: ModuleType, ctx: RunContext) -> bool:
    """Check stages run only when the recipe has their section."""
    check = getattr(stage, "enabled", None)
    return check is None or check(ctx)


class UnexpectedError(EngineError):
    """A bug or an unforeseen engine failure: a run failure (exit 3) with its traceback on file."""

    def __init__(self, message: str, traceback_file: Path | None):
        self.traceback_file = traceback_file
        super().__init__(message)


def baseline_needed(ctx: RunContext) -> bool:
    """Whether the serve stage starts the baseline server: yes unless every enabled check
    says it can do without (the quality stage with cached baseline results)."""
    checks = [s for s in ctx.stages if s.NAME in ctx.enabled_stages and hasattr(s, "needs_baseline")]
    return not checks or any(s.needs_baseline(ctx) for s in checks)


def require_evidence(ctx: RunContext) -> None:
    """A run decides on its checks' gates: a recipe without any would serve both models
    and decide nothing (it used to sign a release on no evidence). Refused before any work."""
    if not ctx.enabled_stages & set(check_table.evidence_names()):
        sections = [c.section for c in check_table.CHECKS if c.evidence]
        raise RecipeError(f"the recipe has no check section ({', '.join(sections[:-1])} or {sections[-1]}): "
                          "`quantlab run` would serve both models and show nothing, and nothing is released "
                          "without evidence. Add a check section (see recipes/gptq-w4a16.yaml), or only quantize "
                          f"with `quantlab quantize {ctx.loaded.path.name}`", file=str(ctx.loaded.path),
                          field="quality")


def stages_to_run(ctx: RunContext) -> dict[str, str]:
    """Which stages this invocation runs, each with the reason. A recipe without a check
    section is refused (require_evidence)."""
    plan: dict[str, str] = {}
    upstream_redone = False
    ctx.stages = ctx.stages or STAGES
    ctx.enabled_stages = {stage.NAME for stage in ctx.stages if enabled(stage, ctx)}
    require_evidence(ctx)
    for stage in ctx.stages:
        if stage.NAME not in ctx.enabled_stages:
            continue
        done = ctx.run.record.stages.get(stage.NAME)
        if upstream_redone:
            plan[stage.NAME] = "an earlier stage is redone"
        elif done is None:
            plan[stage.NAME] = "not run yet"
        elif done.status != "ok":
            plan[stage.NAME] = f"last attempt {done.status}"
        elif done.inputs_sha256 != inputs_hash(stage.inputs(ctx)):
            plan[stage.NAME] = "its inputs changed"
        else:
            continue
        upstream_redone = True
    return plan


def open_run(loaded: LoadedRecipe, runs_root: Path, resume: Path | None) -> RunDir:
    if resume is None:
        return RunDir.create(loaded, runs_root)
    run = RunDir.open(resume)
    if run.record.recipe_name != loaded.recipe.name:
        raise RecipeError(f"cannot resume {resume}: it is a run of recipe '{run.record.recipe_name}', this recipe "
                          f"is named '{loaded.recipe.name}'. Start a new run (drop --resume)", file=str(loaded.path))
    run.adopt_recipe(loaded)
    run.record.status = "running"
    return run


def run_pipeline(loaded: LoadedRecipe, runs_root: Path, *, resume: Path | None = None,
                 progress: Progress = print, verbose: bool = False, checkpoint: Path | None = None,
                 family: Family | None = None, alone: bool = False) -> RunDir:
    """Run (or resume) the pipeline; with `checkpoint`, validate that existing checkpoint
    instead of quantizing; `family`: judged as a member of a declared family
    (pipeline/families.py); `alone`: judged at the recipe's alpha, outside the stream of
    decisions against its baseline (pipeline/streams.py), as the user asked. Any error raised after the run folder exists carries it as
    `.run_dir`, so the caller can summarise the run whatever its outcome."""
    clock = (time.perf_counter(), engine_seconds())
    if checkpoint is not None:  # a missing folder or an outside link: refused before a run folder exists
        checkpoint_stage.check_source(checkpoint)
    run = open_run(loaded, runs_root, resume)
    try:
        return _run_stages(loaded, run, progress, verbose, checkpoint, clock, family, alone)
    except BaseException as err:
        err.run_dir = run.path  # type: ignore[attr-defined]
        raise


def _attempt_time(clock: tuple[float, float]) -> AttemptTime:
    return AttemptTime(wall_s=round(time.perf_counter() - clock[0], 3),
                       engine_s=round(engine_seconds() - clock[1], 3))


def save_with_time(run: RunDir, clock: tuple[float, float], progress: Progress) -> None:
    """Reports first (they are part of the attempt's time), then the record with the time."""
    run.record.attempt = _attempt_time(clock)
    write_run_reports(run, progress)
    run.record.attempt = _attempt_time(clock)
    run.save()


def _run_stages(loaded: LoadedRecipe, run: RunDir, progress: Progress, verbose: bool,
                checkpoint: Path | None, clock: tuple[float, float], family: Family | None = None,
                alone: bool = False) -> RunDir:
    ctx = RunContext(loaded, run, progress, verbose=verbose, import_from=checkpoint, family=family,
                     stages=VALIDATE_STAGES if checkpoint is not None else STAGES)
    progress(f"run directory: {run.path}")
    if family is not None:
        progress(f"family '{family.id}': member {family.joined} of at most {family.size}, every interval gate at "
                 f"confidence 1 - (1 - c) / {family.size}")
    try:
        resumed = streams.resumed_position(ctx)  # a resume's decision, checked against the register
        ctx.stream = resumed[0]  # its stages' inputs were hashed at its level
        todo = stages_to_run(ctx)
        ctx.will_run = set(todo)
        for name in [n for n in run.record.stages if n not in ctx.enabled_stages]:
            progress(f"stage {name}: no longer in the recipe, its earlier result is dropped")
            del run.record.stages[name]
        for stage in ctx.stages:
            if stage.NAME in todo:
                stage.preflight(ctx)
        ctx.needs_baseline = lambda: baseline_needed(ctx)
        # its level, before the gate set is registered
        ctx.stream = streams.decide_position(ctx, alone=alone, resumed=resumed, will_run=ctx.will_run)
        todo = _after_renewal(ctx, resumed, todo)
        progress(streams.position_line(ctx.stream, ctx.loaded.recipe))
        run.record.registration = register(ctx)  # the gate set, signed before any engine starts
        run.save()
    except BaseException as err:
        run.record.attempt = _attempt_time(clock)
        _close_void(ctx, progress)
        _finish(run, err)
        wrapped = _as_quantlab_error(err, run, "preflight")
        if wrapped is None:
            raise
        raise wrapped from None
    try:
        for stage in ctx.stages:
            if not enabled(stage, ctx):
                continue
            if stage.NAME not in todo:
                progress(f"stage {stage.NAME}: done earlier with the same inputs, skipped")
            else:
                progress(f"stage {stage.NAME}: {todo[stage.NAME]}")
                run_stage(ctx, stage)
            if stage.NAME in CHECKPOINT_STAGES:
                guard_checkpoint(ctx, made_now=stage.NAME in todo)
    except BaseException:
        ctx.close_engines()
        unlock_checkpoint(ctx)
        _close_void(ctx, progress)
        save_with_time(run, clock, progress)  # a failed run gets its report too
        raise
    ctx.close_engines()  # servers live across the check stages, never past the run
    unlock_checkpoint(ctx)
    decided = release_stage.decide_run(ctx)  # an optional target's failures block that target only
    _close(ctx, progress, decided.record.decision == "release")
    run.record.status = "blocked" if decided.blocked else "ok"
    save_with_time(run, clock, progress)
    if decided.blocked:
        release = run.record.result("release")
        fallback = f"; fallback: {release.fallback}" if release is not None and release.fallback else ""
        failed = [v for v in decided.blocking if v.verdict == "fail"]
        unshown = [v for v in decided.blocking if v.verdict != "fail"]
        head = (f"release blocked: {len(failed)} gate(s) failed" if failed else "release not shown: "
                f"{len(unshown)} required gate(s) could not decide") + (
            f" and {len(unshown)} could not decide" if failed and unshown else "")
        lines = [blocking_line(v) for v in by_importance(failed) + by_importance(unshown)]
        more = f"\n  ... and {len(lines) - MAX_LISTED} more in the report" if len(lines) > MAX_LISTED else ""
        raise GateFailure(f"{head}{fallback}; each gate's figures and interval: {run.path / 'report.md'}:\n  - "
                          + "\n  - ".join(lines[:MAX_LISTED]) + more)
    return run


def _after_renewal(ctx: RunContext, resumed: tuple, todo: dict[str, str]) -> dict[str, str]:
    """A resume that took a new stream position judges on fresh checks: the earlier ones
    belong to the decision already made. The stages to run again, their preflights done."""
    why = streams.renewal(resumed[0], resumed[1], ctx.stream)
    if why is None and ctx.stream == resumed[0]:
        return todo
    if why is not None:
        ctx.progress(f"stream: a new position for this run: {why}; its checks run again")
        for name in streams.rejudging():
            ctx.run.record.stages.pop(name, None)
    again = stages_to_run(ctx)  # the level changed: the checks' inputs with it
    for stage in ctx.stages:
        if stage.NAME in again and stage.NAME not in todo:
            stage.preflight(ctx)
    ctx.will_run = set(again)
    return again


def _close_void(ctx: RunContext, progress: Progress) -> None:
    """A run that ends with no check verdict decided nothing: its position is closed void,
    so crashes do not push later decisions to smaller shares. One with verdicts stays open
    (released nothing, passes nothing on)."""
    if any(ctx.run.record.result(name) is not None for name in check_table.evidence_names()):
        return
    _close(ctx, progress, False, void=True)


def _close(ctx: RunContext, progress: Progress, released: bool, void: bool = False) -> None:
    """The decision's outcome into the register; a failure there (its file removed, the
    secret rotated) is said and noted on the run, never allowed to leave the record unsaved."""
    try:
        streams.close_decision(ctx.stream, released, streams.candidate_of(ctx), void=void)
    except (QuantlabError, OSError, ValueError) as err:
        note = f"the stream's register could not record this decision's outcome: {err}"
        progress(f"stream: {note}")
        ctx.run.record.stream_note = note


MAX_LISTED = 5  # gates named when a run ends blocked; every one is in the report
CHECKPOINT_STAGES = (quantize_stage.NAME, checkpoint_stage.NAME)  # where the candidate's files are recorded


def lock_checkpoint(ctx: RunContext) -> None:
    """The recorded checkpoint read-only (files 0444, folders 0555) through the checks: a check
    that could write there (a completion run by a code task) finds no room. The release stage
    compares every file with the record before signing whatever the modes held."""
    if ctx.checkpoint_dir.is_dir():
        folder_record.lock(ctx.checkpoint_dir)


def guard_checkpoint(ctx: RunContext, made_now: bool) -> None:
    """After the stage that makes or takes in the candidate: its folder locked for the checks
    and, when it was made by an earlier invocation (a resume, a retried Ray task), hashed
    and compared with its record before any server reads it (IntegrityError naming each
    file that differs): a folder edited between runs is never evaluated, let alone signed."""
    if not made_now:
        release_stage.checked_checkpoint(ctx, before="the checks of a resumed run")
    lock_checkpoint(ctx)


def unlock_checkpoint(ctx: RunContext) -> None:
    """Ordinary modes again (files 0644, folders 0755) when the run ends, whatever its outcome."""
    if ctx.checkpoint_dir.is_dir():
        folder_record.release_modes(ctx.checkpoint_dir)


def by_importance(verdicts: list) -> list:
    return sorted(verdicts, key=lambda v: importance(gate_id(v)))


def blocking_line(v) -> str:
    """One short line a gate: its finding up to the first '; ' (the intervals and sample
    counts that follow are in run.json and the report)."""
    line = f"{v.check} {v.gate} at {v.scope}: {v.evidence.split('; ')[0]}"
    if v.verdict == "fail":
        return line
    need = f"; about {v.samples_to_verdict} samples would tell" if v.samples_to_verdict else ""
    return f"{line} (NOT SHOWN{need})"


def write_run_reports(run: RunDir, progress: Progress) -> dict[str, Path]:
    """Markdown, HTML and JUnit next to run.json. A report that cannot be written is
    said, never allowed to hide the run's own outcome."""
    from quantlab.reports.report import write_reports

    try:
        return write_reports(run.path, run.record)
    except Exception as err:  # noqa: BLE001 - the run's result matters more than its report
        progress(f"the report could not be written: {type(err).__name__}: {err}")
        return {}


def run_stage(ctx: RunContext, stage: ModuleType) -> None:
    run = ctx.run
    ctx.artifacts = []
    started, t0, e0 = now_iso(), time.perf_counter(), engine_seconds()
    digest = inputs_hash(stage.inputs(ctx))

    def record(status: str, **kw: Any) -> None:
        run.put_stage(StageRecord(name=stage.NAME, status=status, started_at=started, finished_at=now_iso(),
                                  duration_s=round(time.perf_counter() - t0, 3),
                                  engine_s=round(engine_seconds() - e0, 3), inputs_sha256=digest,
                                  artifacts=ctx.artifacts, **kw))

    try:
        result = stage.run(ctx)
    except BaseException as err:
        # Record the failure (also on Ctrl-C/SIGTERM) before passing it on.
        wrapped = _as_quantlab_error(err, run, stage.NAME)
        record("interrupted" if isinstance(err, KeyboardInterrupt) else "failed",
               error=str(wrapped) if wrapped is not None else "interrupted",
               cause=getattr(wrapped, "cause", None),
               error_log=_relative(run, getattr(wrapped, "traceback_file", None)))
        _finish(run, err)
        if wrapped is None:
            raise
        raise wrapped from None
    draw_plots(stage.NAME, ctx, result)
    record("ok", result=result)


def _finish(run: RunDir, err: BaseException) -> None:
    run.record.status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
    run.save()


def _relative(run: RunDir, path: Path | None) -> str | None:
    return str(path.relative_to(run.path)) if path is not None else None


def _as_quantlab_error(err: BaseException, run: RunDir, where: str) -> QuantlabError | None:
    """QuantlabErrors pass as they are; Ctrl-C gives None; anything else is unexpected:
    its traceback goes to a file in the run folder and it becomes a run failure."""
    if isinstance(err, QuantlabError):
        return err
    if isinstance(err, KeyboardInterrupt):
        return None
    path = run.path / ERROR_DIR / f"{where}-traceback.txt"
    write_text_atomic(path, "".join(traceback.format_exception(err)))
    line = "".join(traceback.format_exception_only(type(err), err)).strip().splitlines()[-1]
    return UnexpectedError(f"unexpected error in {where}: {line} (traceback in {path})", path)
