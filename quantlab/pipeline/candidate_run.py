"""One candidate's run, from its run folder to its finished record: the lifecycle the
single run (pipeline/loop.py), the dry run (pipeline/commands.py), each member of a
comparison and so each search trial (pipeline/candidates/run.py), each Ray task and the
driver's adoption of its folder (executors/ray_node.py, ray_driver.py) all go through.

    open -> plan (the stages to run and why) -> preflight -> register -> run_stages
         -> close -> decide -> release -> finish (status, reports, the attempt's time)

What the stages read on their context beside the recipe and the engines (the stages
enabled and to run, whether the baseline server is needed, the stream position, the
comparison's choice) is set here and nowhere else, and a stage's record is made here
(StageRecord) whoever ran the stage: a caller orders the steps (a comparison runs slices
of the stages over its members) and says what a failure means to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from quantlab.core import checks as check_table
from quantlab.core.engine_time import engine_seconds
from quantlab.core.evidence import Evidence
from quantlab.core.errors import QuantlabError, RecipeError
from quantlab.core.progress import Progress
from quantlab.core.run import AttemptTime, RunDir
from quantlab.pipeline import streams
from quantlab.pipeline.context import RunContext
from quantlab.pipeline.stage_run import (StageClock, guard_checkpoint, mark_ended, put_record, run_stage,
                                         unlock_checkpoint)
from quantlab.pipeline.stages import CHECKPOINT_STAGES, baseline_needed, enabled, stages_for, stages_to_run
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe
from quantlab.release import stage as release_stage
from quantlab.release.decision import Decided
from quantlab.release.registration import register

Clock = tuple[float, float]  # an attempt's start: (perf_counter, engine seconds)


class CandidateRun:
    """One candidate's run folder and the context its stages see (built here only).
    `shared_baseline`: a comparison's member, whose baseline server is up whatever the
    cache holds; otherwise the serve stage starts it only when an enabled check needs it."""

    def __init__(self, loaded: LoadedRecipe, run: RunDir, progress: Progress = print, *, verbose: bool = False,
                 checkpoint: Path | None = None, family: Family | None = None,
                 stages: list[ModuleType] | None = None, shared_baseline: bool = False,
                 evidence: Evidence | None = None):
        self.ctx = RunContext(loaded, run, progress, verbose=verbose, import_from=checkpoint, family=family,
                              stages=stages if stages is not None else stages_for(checkpoint,
                                                                                 imported=evidence is not None),
                              evidence=evidence)
        if not shared_baseline:
            self.ctx.needs_baseline = lambda: baseline_needed(self.ctx)
        self.todo: dict[str, str] = {}  # the stages this invocation runs, each with why
        self._resumed: tuple = (None, None)  # a resumed run's stream position and its register entry

    @classmethod
    def create(cls, loaded: LoadedRecipe, parent: Path, progress: Progress = print, **kw: Any) -> CandidateRun:
        """A new run folder under `parent`."""
        return cls(loaded, RunDir.create(loaded, parent), progress, **kw)

    @classmethod
    def open(cls, loaded: LoadedRecipe, runs_root: Path, resume: Path | None, progress: Progress = print,
             **kw: Any) -> CandidateRun:
        """A new run folder under `runs_root`, or the run `resume` names (open_run)."""
        run = open_run(loaded, runs_root, resume)
        if resume is not None and "evidence" in run.record.stages and kw.get("evidence") is None:
            raise RecipeError(f"cannot resume {resume}: it is a decision on imported evidence (quantlab decide), which "
                              "serves nothing and has no stages of a run to resume. Decide again, or start a new run "
                              "(drop --resume)", file=str(loaded.path), field="--resume")
        return cls(loaded, run, progress, **kw)

    @property
    def run(self) -> RunDir:
        return self.ctx.run

    @property
    def progress(self) -> Progress:
        return self.ctx.progress

    # --- before any work -------------------------------------------------------------------

    def plan(self) -> dict[str, str]:
        """Which stages this invocation runs and why (a recipe without a check is refused)."""
        self.todo = stages_to_run(self.ctx)
        self.ctx.will_run = set(self.todo)
        return self.todo

    def adopt(self, todo: dict[str, str]) -> None:
        """A run folder whose other stages ran elsewhere (a Ray task's): only `todo` is due here."""
        self.ctx.enabled_stages = {s.NAME for s in self.ctx.stages if enabled(s, self.ctx)}
        self.todo = todo
        self.ctx.will_run = set(todo)

    def drop_stale(self) -> None:
        """A resumed run's results of stages the recipe no longer asks for."""
        for name in [n for n in self.run.record.stages if n not in self.ctx.enabled_stages]:
            self.progress(f"stage {name}: no longer in the recipe, its earlier result is dropped")
            del self.run.record.stages[name]

    def preflight(self, names: Iterable[str] | None = None) -> None:
        """The preflight of every stage to run (or of those `names`), in the stages' order."""
        wanted = set(self.todo if names is None else names)
        for stage in self.ctx.stages:
            if stage.NAME in wanted:
                stage.preflight(self.ctx)

    def register(self, family: Family | None = None) -> None:
        """The gate set it will be decided under, signed before any engine starts. `family`:
        judged as a member of it from here on (a comparison's, once its refused are known)."""
        if family is not None:
            self.ctx.family = family
        self.run.record.registration = register(self.ctx)
        self.run.save()

    # --- its place in the stream of decisions against its baseline (a single run's) -----------

    def resume_position(self) -> None:
        """A resume's decision, checked against the register: its stages' inputs were hashed at its level."""
        self._resumed = streams.resumed_position(self.ctx)
        self.ctx.stream = self._resumed[0]

    def take_position(self, *, alone: bool) -> None:
        """Its level, taken before the gate set is registered; a resume given a new one judges
        on fresh checks (their stages to run again, their preflights done)."""
        self.ctx.stream = streams.decide_position(self.ctx, alone=alone, resumed=self._resumed,
                                                  will_run=self.ctx.will_run)
        saved, entry = self._resumed
        why = streams.renewal(saved, entry, self.ctx.stream)
        if why is None and self.ctx.stream == saved:
            return
        if why is not None:
            self.progress(f"stream: a new position for this run: {why}; its checks run again")
            for name in streams.rejudging():
                self.run.record.stages.pop(name, None)
        again = stages_to_run(self.ctx)  # the level changed: the checks' inputs with it
        self.preflight([name for name in again if name not in self.todo])
        self.todo = again
        self.ctx.will_run = set(again)

    def plan_position(self) -> None:
        """The level it would take now, taken by nobody (the dry run's plans are made at it)."""
        self.ctx.stream = streams.decide_position(self.ctx, claim=False)

    def close_position(self, released: bool, void: bool = False) -> None:
        """The decision's outcome into the register; a failure there (its file removed, the
        secret rotated) is said and noted on the run, never allowed to leave the record unsaved."""
        try:
            streams.close_decision(self.ctx.stream, released, streams.candidate_of(self.ctx), void=void)
        except (QuantlabError, OSError, ValueError) as err:
            note = f"the stream's register could not record this decision's outcome: {err}"
            self.progress(f"stream: {note}")
            self.run.record.stream_note = note

    def close_void(self) -> None:
        """A run that ends with no check verdict decided nothing: its position is closed void,
        so crashes do not push later decisions to smaller shares. One with verdicts stays open
        (released nothing, passes nothing on)."""
        if not any(self.run.record.result(name) is not None for name in check_table.evidence_names()):
            self.close_position(False, void=True)

    # --- the stages --------------------------------------------------------------------------

    def due(self, stage: ModuleType) -> bool:
        return enabled(stage, self.ctx) and stage.NAME in self.todo

    def run_stages(self, stages: list[ModuleType] | None = None, *, member: str | None = None,
                   said_skipped: bool = False, failed: Callable[[str, QuantlabError], None] | None = None,
                   until: Callable[[str], str | None] | None = None) -> str | None:
        """Each enabled stage of `stages` (all of the run's by default) in order, run when due;
        after the stage that makes or takes in the checkpoint, its folder is guarded. Said as
        'stage X: why', or as a comparison's `member`; `said_skipped`: a stage done earlier is
        said skipped. `failed(name, err)`: a QuantlabError ends these stages for this run alone
        instead of being raised. `until(name)`: why to stop after that stage (a Ray task's
        racing), returned."""
        for stage in self.ctx.stages if stages is None else stages:
            if not enabled(stage, self.ctx):
                continue
            try:
                self._step(stage, member, said_skipped)
            except QuantlabError as err:
                if failed is None:
                    raise
                failed(stage.NAME, err)
                return None
            why = until(stage.NAME) if until is not None else None
            if why:
                return why
        return None

    def _step(self, stage: ModuleType, member: str | None, said_skipped: bool) -> None:
        if stage.NAME in self.todo:
            self.progress(f"candidate {member}: stage {stage.NAME}" if member is not None
                          else f"stage {stage.NAME}: {self.todo[stage.NAME]}")
            run_stage(self.ctx, stage)
        elif said_skipped:
            self.progress(f"stage {stage.NAME}: done earlier with the same inputs, skipped")
        if stage.NAME in CHECKPOINT_STAGES:  # hashed here only when a check will read it: the release hashes it anyway
            checks_due = bool(set(self.todo) - {release_stage.NAME})
            guard_checkpoint(self.ctx, made_now=stage.NAME in self.todo or not checks_due)

    def begin_stage(self) -> None:
        """A stage run elsewhere (a comparison's shared load) collects its artifacts from here."""
        self.ctx.artifacts = []

    def record_stage(self, stage: ModuleType, clock: StageClock, status: str, **kw: Any) -> None:
        """The record of a stage run elsewhere (a comparison's shared load): `result` when it
        ended ok (its plots drawn), else `error`."""
        put_record(self.ctx, stage, clock, status, **kw)

    # --- after the stages ----------------------------------------------------------------------

    def close(self) -> None:
        """Its servers stopped and its checkpoint's ordinary modes back, whatever the outcome."""
        self.ctx.close_engines()
        unlock_checkpoint(self.ctx)

    def decide(self) -> Decided:
        return release_stage.decide_run(self.ctx)  # an optional target's failures block that target only

    def release(self, comparison: dict[str, Any], **how: Any) -> None:
        """The release stage, with a comparison's choice for its manifest (`how`: run_stages')."""
        self.ctx.comparison = comparison
        self.run_stages([release_stage], **how)

    def end(self, err: BaseException | None = None, *, if_running: bool = False) -> None:
        """Its record ended by `err`: interrupted (Ctrl-C, SIGTERM) or failed; `if_running`:
        only a record still running is ended. Saved."""
        if if_running and self.run.record.status != "running":
            self.run.save()
        else:
            mark_ended(self.run, err)

    def finish(self, clock: Clock, decided: Decided | None) -> None:
        """Its status (the decision's; a run without one that is still running failed), then
        its reports and record with the attempt's time."""
        if decided is not None:
            self.run.record.status = "blocked" if decided.blocked else "ok"
        elif self.run.record.status == "running":
            self.run.record.status = "failed"
        self.save(clock)

    def save(self, clock: Clock) -> None:
        """Reports first (they are part of the attempt's time), then the record with the time."""
        self.run.record.attempt = attempt_time(clock)
        write_run_reports(self.run, self.progress)
        self.run.record.attempt = attempt_time(clock)
        self.run.save()


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


def start_clock() -> Clock:
    return time.perf_counter(), engine_seconds()


def attempt_time(clock: Clock) -> AttemptTime:
    return AttemptTime(wall_s=round(time.perf_counter() - clock[0], 3), engine_s=round(engine_seconds() - clock[1], 3))


def write_run_reports(run: RunDir, progress: Progress) -> dict[str, Path]:
    """Markdown, HTML and JUnit next to run.json. A report that cannot be written is
    said, never allowed to hide the run's own outcome."""
    from quantlab.reports.report import write_reports

    try:
        return write_reports(run.path, run.record)
    except Exception as err:  # noqa: BLE001 - the run's result matters more than its report
        progress(f"the report could not be written: {type(err).__name__}: {err}")
        return {}
