"""A check's plots, drawn by the run loop from the check's result once the stage has
returned: the checks record numbers, and only this package draws them. A plot is a
convenience, never a failed stage: one that cannot be drawn is a note."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantlab.core import checks as check_table
from quantlab.release.check_hooks import hook
from quantlab.core.layout import LOAD_QUALITY_DIR, PERF_DIR, QUALITY_DIR  # noqa: F401 (also read from here)
from quantlab.core.stage_context import StageContext


def draw(stage: str, ctx: StageContext, result: Any) -> None:
    """Draw the plots of `stage`'s result into its folder (its row's `plots` hook in
    core/checks.py), record them as artifacts and in result.plots (a stage without plots
    is left as it is). Never raises: a plot that cannot be drawn is a note, and the
    stage's result is recorded all the same."""
    check = check_table.find(stage)
    if check is None or not check.plots:
        return
    try:
        result.plots = hook(check.plots)(ctx, result)
    except Exception as err:  # noqa: BLE001 - matplotlib raises more kinds than the helpers catch
        result.notes.append(f"plots not drawn: {type(err).__name__}: {err}")


def quality_plots(ctx: StageContext, result: Any) -> list[str]:
    from quantlab.reports.plots import quality_deltas

    try:
        made = quality_deltas(list(result.tasks) + list(result.slices),
                              ctx.run.path / QUALITY_DIR / "quality-deltas.png", ctx.recipe.name)
    except (ImportError, OSError, ValueError) as err:
        result.notes.append(f"quality plot not drawn: {type(err).__name__}: {err}")
        return []
    if made is None:
        return []
    rel = str(made.relative_to(ctx.run.path))
    ctx.add_artifact(rel, "quality-plot")
    return [rel]


def performance_plots(ctx: StageContext, result: Any) -> list[str]:
    from quantlab.reports.plots import latency_cdfs, versus_concurrency

    label = (result.workload_context or {}).get("label", "")
    made = []
    try:
        made.append(latency_cdfs(ctx.run.path, result.points, ctx.run.path / PERF_DIR / "latency-cdf.png", label))
        vc = versus_concurrency(result.points, ctx.run.path / PERF_DIR / "throughput-ttft-vs-concurrency.png", label)
        if vc is not None:
            made.append(vc)
    except (ImportError, OSError, ValueError) as err:
        result.notes.append(f"plots not drawn: {type(err).__name__}: {err}")
    rels = [str(Path(p).relative_to(ctx.run.path)) for p in made]
    for rel in rels:
        ctx.add_artifact(rel, "perf-plot")
    return rels


def load_quality_plots(ctx: StageContext, result: Any) -> list[str]:
    from quantlab.reports.plots import accuracy_vs_load

    made = accuracy_vs_load(result.points, ctx.run.path / LOAD_QUALITY_DIR / "accuracy-vs-concurrency.png",
                            ctx.recipe.name)
    if made is None:
        return []
    rel = str(made.relative_to(ctx.run.path))
    ctx.add_artifact(rel, "load-quality-plot")
    return [rel]
