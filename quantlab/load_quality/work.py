"""What the load_quality stage evaluates, decided before any engine (pure of engines): the
quality suites' pass/fail tasks it slices, the documents of each (stratified, the first k of
each task, so every run asks the same ones), and the performance points it loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantlab.core.errors import RecipeError
from quantlab.core.stage_context import StageContext
from quantlab.load_quality.evaluate import Load
from quantlab.load_quality.slice import allocate
from quantlab.recipe.load_quality import selected_points
from quantlab.quality.compare import TRANSFORMS
from quantlab.quality.samples import Docs, task_samples
from quantlab.quality.suites import Suite
from quantlab.quality.work import runnable, suites_of

C1 = Load("c1", concurrency=1)


@dataclass
class SliceWork:
    work: list[tuple[Suite, Any]]  # the (suite, task) pairs sliced
    tasks: dict[str, tuple[str, str | None]]  # task -> (metric, filter)
    available: dict[str, int]  # task -> documents it can give


def sliced_tasks(ctx: StageContext, *, max_len: int | None) -> SliceWork:
    """The gated, higher-is-better, non-perplexity tasks of the quality suites (or the
    section's `tasks`), that run at the served length, with how many documents each has."""
    spec = ctx.recipe.load_quality
    quality = ctx.recipe.quality
    work, _ = runnable(suites_of(ctx), max_len)
    by_name = {task.task: (suite, task) for suite, task in work}
    if spec.tasks is not None:
        missing = [t for t in spec.tasks if t not in by_name]
        if missing:
            raise RecipeError(f"load_quality.tasks names {missing}, which the quality suites do not run here "
                              f"(runnable: {sorted(by_name)}): name tasks of the recipe's quality suites",
                              file=str(ctx.loaded.path), field="load_quality.tasks")
        chosen = [by_name[t] for t in spec.tasks]
    else:
        chosen = [(s, t) for s, t in work if t.gated and t.metric not in TRANSFORMS
                  and s.directions.get(t.task, t.higher_is_better) is not False]
    bad = [t.task for s, t in chosen if t.metric in TRANSFORMS or s.directions.get(t.task) is False]
    if bad:
        raise RecipeError(f"load_quality judges pass/fail answers; {bad} score a lower-is-better or perplexity "
                          "metric: leave them out of load_quality.tasks", file=str(ctx.loaded.path),
                          field="load_quality.tasks")
    if not chosen:
        raise RecipeError("load_quality found no gated pass/fail task in the quality suites to slice: add one, or "
                          "name them in load_quality.tasks", file=str(ctx.loaded.path), field="load_quality.tasks")
    available = {}
    for suite, task in chosen:
        items = task_samples(quality, suite, task).items
        available[task.task] = items if items is not None else spec.max_items
    return SliceWork(chosen, {t.task: (t.metric, t.filter) for _, t in chosen}, available)


def documents(available: dict[str, int], total: int) -> dict[str, Docs]:
    """Each task's share of `total` documents, from its first (load_quality/slice.allocate)."""
    return {task: Docs(0, k) for task, k in allocate(available, min(total, sum(available.values()))).items() if k}


def loads(ctx: StageContext) -> list[tuple[str, Load]]:
    """The performance points the section names, as (workload, Load named `<workload>/<point>`)."""
    return [(w.name, Load(name, concurrency=concurrency, rate=rate))
            for name, w, concurrency, rate in selected_points(ctx.recipe.load_quality, ctx.recipe.performance)]
