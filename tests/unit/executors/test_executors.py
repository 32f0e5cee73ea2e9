"""The executor seam: the registry names each executor; building one joins and creates
nothing; the search's rounds hand their trials to whatever executor they are given (a
fake one here: no server, no cluster) and read its comparison back."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RECIPES

from quantlab.cli.executor_option import executor_for
from quantlab.core.errors import RecipeError
from quantlab.executors import EXECUTORS, LocalExecutor, RayExecutor, build
from quantlab.pipeline.candidates.members import Comparison
from quantlab.reports.comparison_records import Choice
from quantlab.pipeline.candidates.servers import HeldBaseline
from quantlab.pipeline.scheme_search import run_schemes
from quantlab.pipeline.search_rounds import compare_trials
from quantlab.recipe.family import Family
from quantlab.recipe.file import load_recipe
from quantlab.search.schemes import SchemeTrial


class FakeExecutor:
    """Records what it is asked to run; every member is released, the first chosen."""

    name = "fake"

    def __init__(self, folder: Path) -> None:
        self.folder, self.calls, self.entered = folder, [], 0

    def __enter__(self) -> FakeExecutor:
        self.entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.entered -= 1

    def hold_baseline(self, at_least: int) -> HeldBaseline | None:
        return None

    def run(self, members, runs_root, *, progress=print, verbose=False, family=None, held=None,
            allow_single=False) -> Comparison:
        self.calls.append({"members": list(members), "runs_root": runs_root, "family": family, "held": held,
                           "allow_single": allow_single})
        names = [m.recipe.name for m in members]
        rows = [{"name": n, "decision": "release", "failed_gates": [], "output_tokens_per_s": 50.0} for n in names]
        return Comparison(folder=self.folder, candidates=[], choice=Choice(names[0], "the fake's first", names),
                          table_md="", exit_code=0,
                          data={"candidates": rows, "baseline": {"output_tokens_per_s": 100.0}})


@pytest.fixture
def trials():
    loaded = load_recipe(RECIPES / "gptq-w4a16.yaml")
    return [loaded.variant(f"{loaded.recipe.name}-t{i}") for i in (1, 2)]


def test_the_registry_names_local_and_ray():
    assert {"local", "ray"} <= set(EXECUTORS)
    assert isinstance(build("local"), LocalExecutor) and build("local").name == "local"
    with pytest.raises(RecipeError, match="no executor named 'slurm'; there are: local, ray"):
        build("slurm")


def test_building_an_executor_joins_and_creates_nothing(tmp_path):
    executor = executor_for("local", None, tmp_path / "runs", cpus=2)
    assert isinstance(executor, RayExecutor) and executor.name == "ray" and executor.cpus == 2
    assert executor.hold_baseline(3) is None  # each task serves its own baseline
    assert not list(tmp_path.iterdir())  # no runs folder, no storage folder, no cluster
    with pytest.raises(RuntimeError, match="inside `with executor:`"):
        executor.run([], tmp_path)
    assert isinstance(executor_for(None, None, tmp_path), LocalExecutor)
    held = build("local").hold_baseline(3)
    assert isinstance(held, HeldBaseline) and held.at_least == 3 and held.server is None


def test_a_registered_executor_receives_the_rounds_trials(monkeypatch, tmp_path, trials):
    monkeypatch.setitem(EXECUTORS, "fake", FakeExecutor)
    executor = build("fake", folder=tmp_path / "compare")
    family = Family(size=4, kind="search", id="s1")
    outcomes, info = compare_trials(trials, tmp_path, lambda *_: None, False, executor, family)
    (call,) = executor.calls
    assert call["members"] == trials and call["runs_root"] == tmp_path / "rounds"
    assert call["family"] is family and call["allow_single"] and call["held"] is None
    assert [o["name"] for o in outcomes] == [t.recipe.name for t in trials]
    assert {o["decision"] for o in outcomes} == {"release"} and outcomes[0]["throughput_ratio"] == 0.5
    assert info["chosen"] == trials[0].recipe.name and info["comparison"] == str(tmp_path / "compare")


def test_the_scheme_phase_hands_each_round_to_the_executor(tmp_path, trials):
    executor = FakeExecutor(tmp_path / "compare")
    schemes = [SchemeTrial(f"s{i}", t, predicted_bytes=1000 * i) for i, t in enumerate(trials, 1)]
    outcomes, rounds, chosen = run_schemes(schemes, tmp_path, width=1, budget_left=2, progress=lambda *_: None,
                                           verbose=False, executor=executor, family=Family(size=2), held=None,
                                           past_budget=lambda rounds: False)
    assert [c["members"] for c in executor.calls] == [[trials[0]]]  # the first round released one: the search stops
    assert chosen == trials[0].recipe.name and rounds[0]["schemes"] == ["s1"]


def test_a_worker_setup_hook_is_given_to_ray_only_when_named_and_said(monkeypatch, tmp_path):
    """Unset: no runtime_env (Ray's default). Named: Ray's string hook, its module's folder
    on the workers' PYTHONPATH, and the driver's line saying so; a name not importable
    here is refused before Ray starts."""
    from quantlab.executors.ray_cluster import SETUP_HOOK_ENV, worker_setup

    said: list[str] = []
    monkeypatch.delenv(SETUP_HOOK_ENV, raising=False)
    assert worker_setup(said.append) is None and not said
    (tmp_path / "my_hooks.py").write_text("def setup():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(SETUP_HOOK_ENV, "my_hooks.setup")
    assert worker_setup(said.append) == {"worker_process_setup_hook": "my_hooks.setup",
                                         "env_vars": {"PYTHONPATH": f"{tmp_path}:${{PYTHONPATH}}"}}
    assert said == [f"ray: every worker of this job runs my_hooks.setup before its tasks ({SETUP_HOOK_ENV}; "
                    f"{tmp_path} first on its PYTHONPATH)"]
    for bad in ("my_hooks", "no_such_module.setup", "my_hooks.not-a-name"):
        monkeypatch.setenv(SETUP_HOOK_ENV, bad)
        with pytest.raises(RecipeError, match=f"{SETUP_HOOK_ENV}={bad}: expected module.function"):
            worker_setup(said.append)
