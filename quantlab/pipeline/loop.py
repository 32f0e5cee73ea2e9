"""A single run: `quantlab run RECIPE` (and `quantlab validate`) as one CandidateRun
(pipeline/candidate_run.py) from its run folder to its exit: every preflight before the
first stage, its stream position and registered gate set, the stages of
pipeline/stages.STAGES in order, the decision, the report, and a blocked release said
gate by gate. The CLI's other commands are in pipeline/commands.py.
"""

from __future__ import annotations

from pathlib import Path

from quantlab.core.errors import GateFailure
from quantlab.core.evidence import Evidence
from quantlab.core.progress import Progress
from quantlab.core.run import RunDir
from quantlab.core.verdicts import gate_id
from quantlab.pipeline import streams
from quantlab.pipeline.candidate_run import CandidateRun, Clock, attempt_time, start_clock
from quantlab.pipeline.stage_run import as_quantlab_error
from quantlab.quantize import checkpoint_stage
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe
from quantlab.release.decision import Decided, importance


def run_pipeline(loaded: LoadedRecipe, runs_root: Path, *, resume: Path | None = None,
                 progress: Progress = print, verbose: bool = False, checkpoint: Path | None = None,
                 family: Family | None = None, alone: bool = False, evidence: Evidence | None = None) -> RunDir:
    """Run (or resume) the pipeline; with `checkpoint`, validate that existing checkpoint
    instead of quantizing; `family`: judged as a member of a declared family
    (pipeline/families.py); `alone`: judged at the recipe's alpha, outside the stream of
    decisions against its baseline (pipeline/streams.py), as the user asked; `evidence`: decided
    on files made elsewhere (quantlab decide: pipeline/stages.DECIDE_STAGES). Any error raised
    after the run folder exists carries it as `.run_dir`, so the caller can summarise the run
    whatever its outcome."""
    clock = start_clock()
    if checkpoint is not None:  # a missing folder or an outside link: refused before a run folder exists
        checkpoint_stage.check_source(checkpoint)
    one = CandidateRun.open(loaded, runs_root, resume, progress, verbose=verbose, checkpoint=checkpoint, family=family,
                            evidence=evidence)
    try:
        return _run(one, clock, alone)
    except BaseException as err:
        err.run_dir = one.run.path  # type: ignore[attr-defined]
        raise


def _run(one: CandidateRun, clock: Clock, alone: bool) -> RunDir:
    one.progress(f"run directory: {one.run.path}")
    family = one.ctx.family
    if family is not None:
        one.progress(f"family '{family.id}': member {family.joined} of at most {family.size}, every interval gate "
                     f"at confidence 1 - (1 - c) / {family.size}")
    _before_any_engine(one, clock, alone)
    try:
        one.run_stages(said_skipped=True)
    except BaseException as err:
        one.close()
        one.close_void()
        one.end(err, if_running=True)  # a failure outside a stage (a resumed run's checkpoint check) ends it too
        one.save(clock)  # a failed run gets its report too
        raise
    one.close()  # servers live across the check stages, never past the run
    decided = one.decide()
    one.close_position(decided.record.decision == "release")
    one.finish(clock, decided)
    if decided.blocked:
        raise GateFailure(blocked_message(one.run, decided))
    return one.run


def _before_any_engine(one: CandidateRun, clock: Clock, alone: bool) -> None:
    """Its stages to run and their preflights, its stream position, its gate set registered;
    a failure here ends the run before any engine starts (its position closed void)."""
    try:
        one.resume_position()  # a resume's decision, checked against the register
        one.plan()
        one.drop_stale()
        one.preflight()
        one.take_position(alone=alone)  # its level, before the gate set is registered
        one.progress(streams.position_line(one.ctx.stream, one.ctx.loaded.recipe))
        one.register()  # the gate set, signed before any engine starts
    except BaseException as err:
        one.run.record.attempt = attempt_time(clock)
        one.close_void()
        one.end(err)
        wrapped = as_quantlab_error(err, one.run, "preflight")
        if wrapped is None:
            raise
        raise wrapped from None


def blocked_message(run: RunDir, decided: Decided) -> str:
    """The blocked or not shown release, said with its first gates by importance."""
    release = run.record.result("release")
    fallback = f"; fallback: {release.fallback}" if release is not None and release.fallback else ""
    failed = [v for v in decided.blocking if v.verdict == "fail"]
    unshown = [v for v in decided.blocking if v.verdict != "fail"]
    head = (f"release blocked: {len(failed)} gate(s) failed" if failed else "release not shown: "
            f"{len(unshown)} required gate(s) could not decide") + (
        f" and {len(unshown)} could not decide" if failed and unshown else "")
    lines = [blocking_line(v) for v in by_importance(failed) + by_importance(unshown)]
    more = f"\n  ... and {len(lines) - MAX_LISTED} more in the report" if len(lines) > MAX_LISTED else ""
    return (f"{head}{fallback}; each gate's figures and interval: {run.path / 'report.md'}:\n  - "
            + "\n  - ".join(lines[:MAX_LISTED]) + more)


MAX_LISTED = 5  # gates named when a run ends blocked; every one is in the report


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
