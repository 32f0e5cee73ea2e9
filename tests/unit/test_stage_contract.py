"""Every stage of STAGES, VALIDATE_STAGES and DECIDE_STAGES keeps the stage contract
(core/stage_context.StageModule): its required names with the right arity, and its
optional hooks only those declared (OPTIONAL_HOOKS), each a function of its own, so the
run loop and the dry run find a hook by what the stage defines, never by a name it imports."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest

from quantlab.core.stage_context import OPTIONAL_HOOKS, REQUIRED, stage_hook
from quantlab.pipeline.stages import DECIDE_STAGES, STAGES, VALIDATE_STAGES

ALL = list(dict.fromkeys([*STAGES, *VALIDATE_STAGES, *DECIDE_STAGES]))


@pytest.mark.parametrize("stage", ALL, ids=lambda s: s.NAME)
def test_each_stage_keeps_the_contract(stage):
    assert all(hasattr(stage, name) for name in REQUIRED), [n for n in REQUIRED if not hasattr(stage, n)]
    assert isinstance(stage.NAME, str) and stage.NAME
    for name in ("inputs", "preflight", "run", *OPTIONAL_HOOKS):
        fn = vars(stage).get(name)
        if fn is None or (name in OPTIONAL_HOOKS and stage_hook(stage, name) is None):
            continue
        assert inspect.isfunction(fn) and fn.__module__ == stage.__name__, f"{stage.NAME}.{name} is not its own"
        assert len(inspect.signature(fn).parameters) == 1, f"{stage.NAME}.{name} takes (ctx) only"


@pytest.mark.parametrize("stage", ALL, ids=lambda s: s.NAME)
def test_a_name_a_stage_imports_is_not_its_hook(stage):
    """Before, quality/stage.py's imported `plan` served as its dry-run hook by accident."""
    for name in OPTIONAL_HOOKS:
        value = vars(stage).get(name)
        if callable(value) and getattr(value, "__module__", None) != stage.__name__:
            assert stage_hook(stage, name) is None


def test_the_stages_offer_the_hooks_the_dry_run_shows():
    by_name = {s.NAME: s for s in [*STAGES, *VALIDATE_STAGES]}  # decide has no dry run: its stages plan nothing
    assert stage_hook(by_name["quality"], "plan") is not None and stage_hook(by_name["performance"], "plan")
    assert stage_hook(by_name["serve"], "plan") and stage_hook(by_name["quantize"], "reuses")
    assert stage_hook(by_name["release"], "enabled") is None  # the release always runs


def test_an_undeclared_hook_is_refused_and_an_imported_function_ignored():
    from quantlab.quality.gate_plan import plan

    stage = ModuleType("quantlab.fake_stage")
    stage.NAME = "fake"
    stage.plan = plan  # `from quantlab.quality.gate_plan import plan`: imported, not its own
    assert stage_hook(stage, "plan") is None
    stage.plan = lambda ctx: ["its own"]  # set on the module (as tests' fake stages do)
    assert stage_hook(stage, "plan")(None) == ["its own"]
    with pytest.raises(KeyError, match="OPTIONAL_HOOKS"):
        stage_hook(stage, "after_release")
