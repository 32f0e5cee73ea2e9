"""The stage contract: what every stage module is given and what it offers the run
loop. Defined on the floor so that stages (below the orchestration) and the run loop
(above them) agree without importing each other; the run loop's RunContext is the
one implementation. Types from higher floors (the recipe, plans, servers) are `Any`
here on purpose: the floor imports nothing above it."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from quantlab.core.progress import Progress
from quantlab.core.run import RunDir


T = TypeVar("T")


class StageContext(Protocol):
    loaded: Any  # recipe.file.LoadedRecipe
    run: RunDir
    progress: Progress
    verbose: bool
    import_from: Path | None  # quantlab validate: the existing checkpoint
    evidence: Any  # core.evidence.Evidence: quantlab decide's imported files (None: a run that measures its own)
    will_run: set[str]  # the stages this invocation runs
    enabled_stages: set[str]  # the stages the recipe asks for
    comparison: dict[str, Any] | None  # several candidates: the choice
    family: Any  # recipe.family.Family: the candidates judged on the same items (None: this one alone)
    stream: Any  # recipe.stream.StreamDecision: its place among the decisions against the same baseline answers
    memo: dict[str, Any]  # what is built once per run (once() below)

    @property
    def recipe(self) -> Any: ...  # recipe.file.Recipe

    @property
    def checkpoint_dir(self) -> Path: ...

    def needs_baseline(self) -> bool: ...

    def baseline_model(self) -> Any: ...  # models.source.ResolvedModel

    def baseline_identity(self) -> dict[str, Any]: ...

    def serving_probe(self) -> dict[str, Any]: ...

    def serving_plan(self, *, predicted: bool = False) -> Any: ...  # serving.plan.ServingPlan

    def target_plans(self, *, predicted: bool = False) -> dict[str, Any]: ...

    def served_max_model_len(self) -> int | None: ...

    def recipe_max_model_len(self) -> int | None: ...

    def engine(self, role: str, target: str = ...) -> Any: ...  # a running server

    def start_engines(self, roles: list[str]) -> None: ...

    def engine_if_running(self, role: str, target: str = ...) -> Any: ...

    def running_engines(self) -> list[str]: ...

    def running_engine_keys(self) -> list[tuple[str, str]]: ...

    def stop_engine(self, role: str, target: str = ...) -> None: ...

    def close_engines(self) -> None: ...

    def add_artifact(self, relative: str, role: str) -> None: ...


class StageModule(Protocol):
    """A stage: a module with these names (quantize, serve, quality, ... release), and
    any of the OPTIONAL_HOOKS below. tests/unit/test_stage_contract.py checks every stage
    of STAGES and VALIDATE_STAGES against it."""

    NAME: str

    def inputs(self, ctx: StageContext) -> dict[str, Any]: ...  # hashed: a resume redoes the stage when they change

    def preflight(self, ctx: StageContext) -> None: ...  # before any stage runs: bad input refused, nothing made

    def run(self, ctx: StageContext) -> Any: ...  # its typed result (core/results.py), put in the run record


# The hooks a stage may offer, each `(ctx) -> its type`, and what asks for it; a stage
# module's other names (its imports among them) are never taken for a hook.
OPTIONAL_HOOKS: dict[str, str] = {
    "enabled": "bool: whether the recipe asks for it (absent: always); the run loop",
    "needs_baseline": "bool: whether it needs the baseline server; the serve stage asks every enabled check",
    "reuses": "str | None: what a run would take from the cache instead of computing; the dry run",
    "plan": "list[str]: what it will do and can detect, before any engine starts; the dry run",
}
REQUIRED = ("NAME", "inputs", "preflight", "run")


def stage_hook(stage: Any, name: str) -> Callable[[StageContext], Any] | None:
    """The stage's own `name` hook, or None. Only a declared hook, and never a function of
    that name the stage module imported from another module (not its hook)."""
    if name not in OPTIONAL_HOOKS:
        raise KeyError(f"{name!r} is not a stage hook: declare it in core/stage_context.OPTIONAL_HOOKS")
    hook = vars(stage).get(name)
    if hook is None or not callable(hook):
        return None
    home = getattr(hook, "__module__", None)
    imported = home != stage.__name__ and getattr(hook, "__name__", None) == name
    return None if imported else hook


def once(ctx: StageContext, key: str, build: Callable[[], T]) -> T:
    """`build()` the first time `key` is asked for in this run, the same object after
    (the suites are read, hashed and checked once per run, as the serving plan is
    planned once). A context without a memo builds every time."""
    memo = getattr(ctx, "memo", None)
    if memo is None:
        return build()
    if key not in memo:
        memo[key] = build()
    return memo[key]
