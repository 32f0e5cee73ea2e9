"""The table of checks (core/checks.py) is the one list: a row added there appears in the
decision's order, the recipe's release.policy names, the registered gate set, the evidence
a run needs, the manifest's summaries and error budget, and the report's sections and
plots; and the table agrees with the stages the pipeline runs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from quantlab.core import checks as check_table
from quantlab.release.check_hooks import hook
from quantlab.core.checks import Check
from quantlab.core.errors import RecipeError
from quantlab.core.run import RunRecord, StageRecord, now_iso
from quantlab.core.shipped import RECIPES
from quantlab.core.verdicts import GateVerdict, Want
from quantlab.pipeline import streams
from quantlab.pipeline.stages import STAGES, VALIDATE_STAGES, require_evidence
from quantlab.recipe.file import load_recipe
from quantlab.recipe.release import ReleasePolicySpec
from quantlab.release import registration
from quantlab.release.decision import DecisionPolicy, decide, first_gates
from quantlab.release.error_budget import ledger
from quantlab.release.registered_gates import gate_set_problems
from quantlab.release.stage import _check_summaries
from quantlab.reports.report import plots, render_markdown
from quantlab.reports.sections import sections
from quantlab.reports.stage_plots import draw
from tests.unit.test_import_graph import FLOORS, MODULES, package, rank

HERE = "tests.unit.test_checks_table"
DUMMY = Check("echo", "echo", "Echo probe", report=f"{HERE}:echo_section", summary=f"{HERE}:echo_summary",
              plots=f"{HERE}:echo_plots", budget=f"{HERE}:echo_budget", verify=f"{HERE}:echo_wants")
# the floor each hook is called from: release/ (summary, budget, registered), reports/ (report, plots)
CALLERS = {"summary": "release", "budget": "release", "registered": "release", "verify": "release", "wanted": "release",
           "report": "reports", "plots": "reports"}


# ------------------------------------------------------------------ the dummy check's hooks

def echo_summary(result) -> dict:
    return {"echoes": result.echoes}


def echo_budget(verdicts, section) -> dict:
    return {"tests": len(verdicts), "fail_alpha_family": 0.01, "pass_alpha": 0.05, "section": section}


def echo_section(result, results) -> tuple:
    return (["echoes"], [[str(result.echoes)]], ["an echo of the candidate"])


def echo_plots(ctx, result) -> list[str]:
    return ["echo/echo.png"]


def echo_wants(v, sections, manifest) -> list[Want] | str:
    section = sections.raw.get("echo")
    if section is None:
        return "the registration has no echo section"
    return [Want("limit", section["limit"], "echo.limit")]


def echo_verdict(verdict: str = "pass", test: str = "tango-score") -> GateVerdict:
    return GateVerdict(check="echo", gate="same", scope="all", verdict=verdict, value=1.0, limit=0.5, evidence="e",
                       test=test, confidence=0.9, fail_confidence=0.9)


@pytest.fixture
def with_echo(monkeypatch):
    monkeypatch.setattr(check_table, "CHECKS", (*check_table.CHECKS, DUMMY))
    return DUMMY


# ------------------------------------------------------------------ the table and the stages

def test_every_check_is_a_stage_and_every_check_stage_is_a_check():
    """A check stage is one whose package has a gates module (the decision reads its verdicts)."""
    for stages in (STAGES, VALIDATE_STAGES):
        names = {s.NAME for s in stages}
        assert set(check_table.names()) <= names, "a row of core/checks.py names no stage of pipeline/stages.STAGES"
        gated = {s.NAME for s in stages if f"{s.__name__.rpartition('.')[0]}.gates" in MODULES}
        assert gated == set(check_table.names()), "a stage with gates is missing from core/checks.py"
    assert len(set(check_table.names())) == len(check_table.CHECKS)


def test_each_hook_is_a_pure_function_on_a_floor_its_caller_may_import():
    """The hooks are imported by name when called, which the import-graph test cannot see:
    so here, each is held to the rules that test keeps for a statement."""
    for check in check_table.CHECKS:
        for field, caller in CALLERS.items():
            path = getattr(check, field)
            if path is None:
                continue
            module = path.partition(":")[0]
            assert module in MODULES and callable(hook(path)), f"{check.name}.{field}: {path}"
            assert rank(module) == 0, f"{check.name}.{field}: {module} is not pure"
            assert FLOORS[package(module)] <= FLOORS[caller], f"{check.name}.{field}: {module} is above {caller}/"


def test_the_places_are_distinct_and_the_sections_are_the_recipes():
    recipe = load_recipe(RECIPES / "gptq-w4a16.yaml").recipe
    for place in ("report_place", "manifest_place"):  # each order a permutation: no two rows share a place
        assert len({getattr(c, place) for c in check_table.CHECKS}) == len(check_table.CHECKS), place
    optional = {"targets", "load_quality"}  # sections this recipe does not have
    assert all(check_table.section_of(recipe, c) is not None for c in check_table.CHECKS if c.name not in optional)
    assert check_table.section_of(recipe, check_table.find("load_quality")) is None
    assert check_table.section_of(recipe, check_table.find("targets")) == []


# ------------------------------------------------------------------ a check added in one row

def test_a_new_check_comes_after_the_others_in_the_decision(with_echo):
    gates = ["echo.same@all", "targets.started@cpu", "quality.non_inferiority@pooled", "serve.kernel_path@primary"]
    assert first_gates(gates, chars=1000) == ("serve.kernel_path@primary, quality.non_inferiority@pooled, "
                                              "targets.started@cpu, echo.same@all")
    decided = decide([echo_verdict("fail")], DecisionPolicy())
    assert decided.record.decision == "blocked" and decided.record.failed_gates == ["echo.same@all"]


def test_a_new_check_is_a_release_policy_name(with_echo):
    policy = ReleasePolicySpec(checks={"echo": "warn"}, gates={"echo.same@all": "block"})
    assert policy.checks == {"echo": "warn"}


def test_without_its_row_the_policy_refuses_the_name():
    with pytest.raises(ValidationError, match="unknown check 'echo'"):
        ReleasePolicySpec(checks={"echo": "warn"})


def test_a_new_check_is_a_registered_section_and_evidence(with_echo):
    assert registration.sections() == ("serve", "quality", "performance", "stability", "targets", "load_quality",
                                       "echo", "policy")
    recipe = load_recipe(RECIPES / "gptq-w4a16.yaml").recipe
    gates = registration.gate_set(SimpleNamespace(recipe=recipe, family=None))
    assert "echo" in gates and gates["echo"] is None  # this recipe has no echo section
    assert set(registration.section_digests(gates)) == set(registration.sections())
    assert "echo" in streams.rejudging()
    require_evidence(SimpleNamespace(enabled_stages={"serve", "echo"}))  # the echo check's gates are evidence
    with pytest.raises(RecipeError, match=r"stability, serve.targets, load_quality or echo\)"):
        require_evidence(SimpleNamespace(enabled_stages={"serve"}, loaded=SimpleNamespace(path=Path("r.yaml"))))


def test_a_new_check_is_summarised_and_budgeted_in_the_manifest(with_echo):
    result = SimpleNamespace(echoes=3, gates=[echo_verdict()])
    assert _check_summaries({"echo": result, "release": None}) == {"echo": {"echoes": 3}}
    book = ledger([echo_verdict(), echo_verdict(test="threshold")], rule_version=3, echo={"n": 3})
    assert book["checks"]["echo"] == {"tests": 1, "fail_alpha_family": 0.01, "pass_alpha": 0.05,
                                      "section": {"n": 3}}
    assert book["run"]["false_block_bound"] == 0.01 and book["fixed_thresholds"]["gates"] == ["echo.same@all"]


def test_a_new_check_has_its_report_section_and_plots(with_echo):
    result = SimpleNamespace(echoes=3, gates=[echo_verdict()], plots=[], notes=[])
    draw("echo", SimpleNamespace(), result)
    assert result.plots == ["echo/echo.png"]
    record = RunRecord.model_construct(
        run_id="r", recipe_name="echo-recipe", recipe_sha256="0" * 64, quantlab_version="0", status="completed",
        attempt=None, stages={"echo": StageRecord.model_construct(
            name="echo", status="ok", started_at=now_iso(), finished_at=now_iso(), duration_s=1.0, engine_s=None,
            error=None, cause=None, result=result)})
    titles = [title for title, *_ in sections(record)]
    assert titles == ["Stages", "Gates", "Echo probe"]
    assert ("Echo probe", ["echoes"], [["3"]], ["an echo of the candidate"]) in sections(record)
    assert plots(record) == ["echo/echo.png"]
    assert "### Echo probe" in render_markdown(record) and "![echo](echo/echo.png)" in render_markdown(record)


def echo_manifest() -> SimpleNamespace:
    return SimpleNamespace(gates=[echo_verdict()], targets={}, results={}, run={},
                           decision=SimpleNamespace(decision="release", not_shown_policy=None))


def test_verify_holds_a_new_checks_gates_to_its_registered_section(with_echo):
    assert gate_set_problems(echo_manifest(), {"gates": {"echo": {"limit": 0.5}}}) == []
    assert gate_set_problems(echo_manifest(), {"gates": {"echo": {"limit": 0.6}}}) == [
        "gate echo.same@all: its limit is 0.5, the registered gate set gives 0.6 (echo.limit)"]
    assert gate_set_problems(echo_manifest(), {"gates": {}}) == [
        "gate echo.same@all is not in the registered gate set: the registration has no echo section"]


def test_without_its_row_verify_knows_no_such_check():
    assert gate_set_problems(echo_manifest(), {"gates": {"echo": {"limit": 0.5}}}) == [
        "gate echo.same@all: 'echo' is not a check quantlab gates"]
