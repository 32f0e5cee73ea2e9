"""One stage run and recorded, whoever runs it (pipeline/candidate_run.CandidateRun, or a
comparison's shared load through it): the one place a stage's record (StageRecord) is
made, a failure wrapped (a QuantlabError as it is, Ctrl-C or SIGTERM as `interrupted`,
anything else with its traceback in `errors/<stage>-traceback.txt`, exit 3), and the
checkpoint guarded through the checks."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from quantlab.core import folder_record
from quantlab.core.digest import inputs_hash
from quantlab.core.engine_time import engine_seconds
from quantlab.core.errors import EngineError, QuantlabError
from quantlab.core.fsutil import write_text_atomic
from quantlab.core.layout import ERROR_DIR
from quantlab.core.run import RunDir, StageRecord, now_iso
from quantlab.pipeline.context import RunContext
from quantlab.release import stage as release_stage
from quantlab.reports.stage_plots import draw as draw_plots


@dataclass(frozen=True)
class StageClock:
    """When a stage started: its record's start, duration and engine time."""

    started: str
    t0: float
    e0: float

    @classmethod
    def start(cls) -> StageClock:
        return cls(now_iso(), time.perf_counter(), engine_seconds())


def put_record(ctx: RunContext, stage: ModuleType, clock: StageClock, status: str, *, digest: str | None = None,
               **kw: Any) -> None:
    """The one place a stage's record is made: `digest`, its inputs' hash when it started
    (by default, now); with an ok `result` its plots are drawn first."""
    if status == "ok":
        draw_plots(stage.NAME, ctx, kw["result"])
    ctx.run.put_stage(StageRecord(name=stage.NAME, status=status, started_at=clock.started, finished_at=now_iso(),
                                  duration_s=round(time.perf_counter() - clock.t0, 3),
                                  engine_s=round(engine_seconds() - clock.e0, 3),
                                  inputs_sha256=digest if digest is not None else inputs_hash(stage.inputs(ctx)),
                                  artifacts=ctx.artifacts, **kw))


def run_stage(ctx: RunContext, stage: ModuleType) -> None:
    """One stage run and recorded: its result, or its failure (also on Ctrl-C/SIGTERM)
    recorded before it is passed on, the run's status with it."""
    ctx.artifacts = []
    clock = StageClock.start()
    digest = inputs_hash(stage.inputs(ctx))
    try:
        result = stage.run(ctx)
    except BaseException as err:
        wrapped = as_quantlab_error(err, ctx.run, stage.NAME)
        put_record(ctx, stage, clock, "interrupted" if isinstance(err, KeyboardInterrupt) else "failed",
                   digest=digest, error=str(wrapped) if wrapped is not None else "interrupted",
                   cause=getattr(wrapped, "cause", None),
                   error_log=_relative(ctx.run, getattr(wrapped, "traceback_file", None)))
        mark_ended(ctx.run, err)
        if wrapped is None:
            raise
        raise wrapped from None
    put_record(ctx, stage, clock, "ok", digest=digest, result=result)


def mark_ended(run: RunDir, err: BaseException | None) -> None:
    run.record.status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
    run.save()


def _relative(run: RunDir, path: Path | None) -> str | None:
    return str(path.relative_to(run.path)) if path is not None else None


class UnexpectedError(EngineError):
    """A bug or an unforeseen engine failure: a run failure (exit 3) with its traceback on file."""

    def __init__(self, message: str, traceback_file: Path | None):
        self.traceback_file = traceback_file
        super().__init__(message)


def as_quantlab_error(err: BaseException, run: RunDir, where: str) -> QuantlabError | None:
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
