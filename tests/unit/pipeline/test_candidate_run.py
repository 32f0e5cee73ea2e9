"""One candidate's run (pipeline/candidate_run.CandidateRun) on fake stage modules: no model,
no server. The stages to run and why, the preflights in order before any stage, each stage's
record (ok, failed, or made elsewhere), a resume that skips what was done with the same
inputs, a member's failure kept to itself, and a single run (loop.run_pipeline) running a
stage added to STAGES."""

from __future__ import annotations

from types import ModuleType

import pytest
from conftest import shipped, write_recipe

from quantlab.core.digest import inputs_hash
from quantlab.core.errors import CheckError, GateFailure
from quantlab.core.run import RunDir
from quantlab.pipeline import stages as stage_list
from quantlab.pipeline.candidate_run import CandidateRun, start_clock
from quantlab.pipeline.loop import run_pipeline
from quantlab.pipeline.stage_run import StageClock, UnexpectedError
from quantlab.recipe.file import load_recipe

# "stability" is a check whose gates are evidence: a run of these stages is not refused for having none
NAMES = ("prepare", "stability", "dummy")


class Fakes:
    """Fake stage modules that note each call; `inputs` and `fails` may be changed between runs."""

    def __init__(self, names=NAMES):
        self.calls: list[tuple[str, str]] = []
        self.inputs: dict[str, int] = dict.fromkeys(names, 1)
        self.fails: dict[str, BaseException] = {}
        self.modules = [self._module(n) for n in names]

    def _module(self, name: str) -> ModuleType:
        stage = ModuleType(f"fake_{name}")
        stage.NAME = name
        stage.inputs = lambda ctx: {"stage": name, "version": self.inputs[name]}
        stage.preflight = lambda ctx: self.calls.append(("preflight", name))

        def run(ctx):
            self.calls.append(("run", name))
            if name in self.fails:
                raise self.fails[name]

        stage.run = run
        return stage

    def ran(self) -> list[str]:
        return [n for what, n in self.calls if what == "run"]


@pytest.fixture
def loaded(tmp_path):
    return load_recipe(write_recipe(tmp_path, shipped("gptq-w4a16")))


def new_run(loaded, tmp_path, fakes, said=None, **kw) -> CandidateRun:
    return CandidateRun.create(loaded, tmp_path / "runs", (said if said is not None else []).append,
                               stages=fakes.modules, **kw)


def planned_failing(loaded, tmp_path, stage: str, err: Exception, said=None, **kw) -> tuple[Fakes, CandidateRun]:
    """A planned run of the fake stages whose `stage` raises `err`."""
    fakes = Fakes()
    fakes.fails[stage] = err
    one = new_run(loaded, tmp_path, fakes, said, **kw)
    one.plan()
    return fakes, one


def statuses(run: RunDir) -> dict[str, str]:
    return {n: r.status for n, r in RunDir.open(run.path).record.stages.items()}


def test_every_preflight_in_order_before_any_stage_then_each_stage_recorded(loaded, tmp_path):
    fakes, said = Fakes(), []
    one = new_run(loaded, tmp_path, fakes, said)
    assert one.plan() == {"prepare": "not run yet", "stability": "an earlier stage is redone",
                          "dummy": "an earlier stage is redone"}
    assert one.ctx.will_run == set(NAMES) and one.ctx.enabled_stages == set(NAMES)
    one.preflight()
    assert fakes.calls == [("preflight", n) for n in NAMES]
    assert one.run_stages() is None
    assert fakes.ran() == list(NAMES)
    assert said == [f"stage {n}: {one.todo[n]}" for n in NAMES]
    record = RunDir.open(one.run.path).record  # each record saved as its stage ended
    assert {n: r.status for n, r in record.stages.items()} == dict.fromkeys(NAMES, "ok")
    for stage in fakes.modules:
        assert record.stages[stage.NAME].inputs_sha256 == inputs_hash(stage.inputs(one.ctx))


def test_a_failed_stage_is_recorded_then_raised_and_nothing_after_it_runs(loaded, tmp_path):
    fakes, one = planned_failing(loaded, tmp_path, "stability", CheckError("the probe could not run"))
    with pytest.raises(CheckError, match="the probe could not run"):
        one.run_stages()
    assert fakes.ran() == ["prepare", "stability"]
    assert statuses(one.run) == {"prepare": "ok", "stability": "failed"}
    record = RunDir.open(one.run.path).record
    assert record.status == "failed" and record.stages["stability"].error == "the probe could not run"


def test_an_unexpected_error_is_a_run_failure_with_its_traceback_on_file(loaded, tmp_path):
    fakes, one = planned_failing(loaded, tmp_path, "prepare", KeyError("missing_key"))
    with pytest.raises(UnexpectedError, match="unexpected error in prepare: KeyError: 'missing_key'"):
        one.run_stages()
    stage = RunDir.open(one.run.path).record.stages["prepare"]
    assert stage.status == "failed" and "Traceback" in (one.run.path / stage.error_log).read_text()


def test_a_members_failure_is_its_own_and_said_by_its_name(loaded, tmp_path):
    """As a comparison runs a slice of the stages over a member: `failed` takes the error, the
    member's later stages do not run, nothing is raised."""
    said, failures = [], []
    fakes, one = planned_failing(loaded, tmp_path, "stability", CheckError("broke"), said, shared_baseline=True)
    one.run_stages(fakes.modules[:2], member="a", failed=lambda name, err: failures.append((name, str(err))))
    assert failures == [("stability", "broke")] and fakes.ran() == ["prepare", "stability"]
    assert said == ["candidate a: stage prepare", "candidate a: stage stability"]
    for stage in fakes.modules:  # every check could do without the baseline (its answers cached) ...
        stage.needs_baseline = lambda ctx: False
    assert one.ctx.needs_baseline()  # ... yet a comparison's shared baseline is up whatever the cache holds
    alone = new_run(loaded, tmp_path, fakes)
    alone.plan()
    assert not alone.ctx.needs_baseline()  # a single run then starts no baseline server


def test_until_stops_after_a_stage_with_its_reason(loaded, tmp_path):
    fakes = Fakes()
    one = new_run(loaded, tmp_path, fakes)
    one.plan()
    assert one.run_stages(until=lambda name: "blocked early" if name == "stability" else None) == "blocked early"
    assert fakes.ran() == ["prepare", "stability"]


def test_a_resume_skips_what_was_done_with_the_same_inputs_and_redoes_what_follows_a_change(loaded, tmp_path):
    fakes = Fakes()
    first = new_run(loaded, tmp_path, fakes)
    first.plan()
    first.run_stages()
    said: list[str] = []
    again = CandidateRun.open(loaded, tmp_path / "runs", first.run.path, said.append, stages=fakes.modules)
    assert again.run.path == first.run.path and again.plan() == {}
    fakes.calls.clear()
    again.run_stages(said_skipped=True)
    assert fakes.ran() == [] and said == [f"stage {n}: done earlier with the same inputs, skipped" for n in NAMES]

    fakes.inputs["stability"] = 2  # its inputs changed: it and what follows it are redone
    assert again.plan() == {"stability": "its inputs changed", "dummy": "an earlier stage is redone"}
    again.preflight()
    assert fakes.calls == [("preflight", "stability"), ("preflight", "dummy")]
    again.run_stages()
    assert fakes.ran() == ["stability", "dummy"]


def test_a_stage_the_recipe_does_not_ask_for_is_not_planned_and_its_old_result_dropped(loaded, tmp_path):
    fakes, said = Fakes(), []
    first = new_run(loaded, tmp_path, fakes)
    first.plan()
    first.run_stages()
    fakes.modules[2].enabled = lambda ctx: False
    again = CandidateRun.open(loaded, tmp_path / "runs", first.run.path, said.append, stages=fakes.modules)
    assert again.plan() == {} and "dummy" not in again.ctx.enabled_stages
    again.drop_stale()
    assert "dummy" not in again.run.record.stages
    assert said == ["stage dummy: no longer in the recipe, its earlier result is dropped"]


def test_a_record_made_elsewhere_is_put_as_a_stage_ran_here_would_be(loaded, tmp_path):
    """A comparison's shared load measures several members at once; each member's record is still
    made by its CandidateRun."""
    fakes = Fakes()
    one = new_run(loaded, tmp_path, fakes)
    one.plan()
    clock = StageClock.start()
    one.begin_stage()
    one.record_stage(fakes.modules[2], clock, "failed", error="its server died")
    record = RunDir.open(one.run.path).record.stages["dummy"]
    assert record.status == "failed" and record.error == "its server died" and record.duration_s >= 0
    assert record.started_at == clock.started and record.inputs_sha256 == inputs_hash(fakes.modules[2].inputs(one.ctx))


def test_an_adopted_run_has_only_what_is_left_to_do_and_ends(loaded, tmp_path):
    """The Ray driver adopts the folder a task left: only the release is due here."""
    fakes = Fakes()
    first = new_run(loaded, tmp_path, fakes)
    adopted = CandidateRun(loaded, RunDir.open(first.run.path), stages=fakes.modules)
    adopted.adopt({"dummy": "the checks ran elsewhere"})
    assert adopted.ctx.enabled_stages == set(NAMES) and adopted.ctx.will_run == {"dummy"}
    assert adopted.due(fakes.modules[2]) and not adopted.due(fakes.modules[0])
    adopted.end(if_running=True)
    assert RunDir.open(first.run.path).record.status == "failed"
    adopted.run.record.status = "ok"
    adopted.end(if_running=True)  # ended already: kept as it is
    assert RunDir.open(first.run.path).record.status == "ok"
    adopted.run.record.status = "running"
    adopted.finish(start_clock(), None)  # no decision: a run still running failed, with its attempt's time
    record = RunDir.open(first.run.path).record
    assert record.status == "failed" and record.attempt is not None


def test_a_single_run_runs_a_stage_added_to_stages(loaded, tmp_path, monkeypatch):
    """The single run is one CandidateRun over STAGES as they are: a dummy stage added there
    is preflighted and run; with no gate at all the release is not shown (exit 1)."""
    fakes, said = Fakes(), []
    monkeypatch.setattr(stage_list, "STAGES", fakes.modules)
    with pytest.raises(GateFailure, match="release not shown") as err:
        run_pipeline(loaded, tmp_path / "runs", progress=said.append)
    assert fakes.calls == [("preflight", n) for n in NAMES] + [("run", n) for n in NAMES]
    assert "stage dummy: an earlier stage is redone" in said
    record = RunDir.open(err.value.run_dir).record
    assert record.status == "blocked" and record.registration is not None and record.attempt is not None
    assert statuses(RunDir.open(err.value.run_dir)) == dict.fromkeys(NAMES, "ok")


def test_a_resumed_run_whose_checkpoint_check_fails_ends_failed_not_running(loaded, tmp_path):
    """The guard after a skipped checkpoint stage raises outside any stage (here: no recorded
    checkpoint files to compare the folder with): the run's record is ended, not left running."""
    from quantlab.core.errors import IntegrityError
    from quantlab.pipeline.loop import _run

    fakes = Fakes(names=("quantize", "stability"))
    fakes.fails["stability"] = CheckError("broke")
    first = new_run(loaded, tmp_path, fakes)
    first.plan()
    with pytest.raises(CheckError):
        first.run_stages()
    del fakes.fails["stability"]
    again = CandidateRun.open(loaded, tmp_path / "runs", first.run.path, [].append, stages=fakes.modules)
    with pytest.raises(IntegrityError, match="holds no quantize or checkpoint result"):
        _run(again, start_clock(), alone=True)
    assert fakes.ran() == ["quantize", "stability"]  # nothing ran after the failed check
    assert RunDir.open(first.run.path).record.status == "failed"


def test_a_resume_with_only_the_release_left_hashes_the_checkpoint_once(loaded, tmp_path, monkeypatch):
    """The guard's hash before the checks is skipped when no check is due: the release stage
    hashes the folder against its record before signing in any case."""
    from quantlab.pipeline import candidate_run

    guarded = []
    monkeypatch.setattr(candidate_run, "guard_checkpoint", lambda ctx, made_now: guarded.append(made_now))
    fakes = Fakes(names=("quantize", "stability", "release"))
    first = new_run(loaded, tmp_path, fakes)
    first.plan()
    first.run_stages()
    fakes.inputs["release"] = 2  # only the release is redone
    again = CandidateRun.open(loaded, tmp_path / "runs", first.run.path, [].append, stages=fakes.modules)
    assert again.plan() == {"release": "its inputs changed"}
    again.run_stages()
    fakes.inputs["stability"] = 2  # a check is redone: the folder is hashed before it
    third = CandidateRun.open(loaded, tmp_path / "runs", first.run.path, [].append, stages=fakes.modules)
    third.plan()
    third.run_stages()
    assert guarded == [True, True, False]
