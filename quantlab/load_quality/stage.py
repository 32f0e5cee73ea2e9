"""Quality at load: the quality suites' pass/fail tasks, a paired slice of them, asked of
baseline and candidate at each performance point's concurrency or arrival rate and at
concurrency 1, scored as the quality stage scores them, each request timed; gated (the
candidate at load against the baseline at load, and against itself at concurrency 1), with
correct-answer goodput and the batch noise floor (each role's flips between c1 and load).

The points' evaluations go one at a time (a load on one server while the other is idle, as
the performance stage measures), the baseline and the candidate alternating who goes first at
each point so drift cancels over the points; the two at concurrency 1 go together where both
servers run side by side on cores of their own."""

from __future__ import annotations

import time
from typing import Any

from quantlab.core.errors import RecipeError
from quantlab.core.layout import LOAD_QUALITY_DIR
from quantlab.core.progress import step
from quantlab.core.roles import ROLES
from quantlab.core.stage_context import StageContext
from quantlab.load_quality import judge
from quantlab.load_quality.answers import RunAnswers
from quantlab.load_quality.evaluate import RECORDS_FILE, Load, evaluate
from quantlab.load_quality.work import C1, documents, loads, sliced_tasks
from quantlab.serving import stage as serve_stage

NAME = "load_quality"
OUT_DIR = LOAD_QUALITY_DIR


def enabled(ctx: StageContext) -> bool:
    return getattr(ctx.recipe, "load_quality", None) is not None


def needs_baseline(ctx: StageContext) -> bool:
    return True


def inputs(ctx: StageContext) -> dict[str, Any]:
    from quantlab.quality.work import suites_of

    recipe = ctx.recipe
    return {
        "load_quality": recipe.load_quality.model_dump(mode="json") if recipe.load_quality else None,
        "quality": recipe.quality.model_dump(mode="json", include={"suites", "tasks", "limit", "seed",
                                                                   "request_timeout_s", "max_retries",
                                                                   "allow_code_execution", "code_sandbox"})
        if recipe.quality else None,
        "suites": [s.sha256 for s in suites_of(ctx)] if recipe.quality else [],
        "workloads": [w.model_dump(mode="json") for w in recipe.performance.workloads] if recipe.performance else [],
        "slo": recipe.performance.slo.model_dump(mode="json") if recipe.performance else None,
        "price_per_hour": recipe.performance.price_per_hour if recipe.performance else None,
        "serving": serve_stage.inputs(ctx),
    }


def preflight(ctx: StageContext) -> None:
    if ctx.recipe.quality is None or ctx.recipe.performance is None:
        raise RecipeError("load_quality slices the quality suites and loads them at the performance points: the "
                          "recipe needs both a quality and a performance section", file=str(ctx.loaded.path),
                          field="load_quality")
    sliced = sliced_tasks(ctx, max_len=ctx.recipe_max_model_len())
    if not loads(ctx):
        raise RecipeError("load_quality.points names no performance point", file=str(ctx.loaded.path),
                          field="load_quality.points")
    n, line = judge.planned(ctx, sliced)
    ctx.progress(f"load_quality plan: {n} paired documents a point over {len(sliced.tasks)} task(s); {line}")


def plan(ctx: StageContext) -> list[str]:
    """The dry run's hook: the slice's size, what it can detect, and where its discordance
    comes from (this host's measured batch noise floor, else the planner's assumption)."""
    sliced = sliced_tasks(ctx, max_len=ctx.recipe_max_model_len())
    n, line = judge.planned(ctx, sliced)
    points = [load.name for _, load in loads(ctx)]
    return [f"{n} paired documents a point over {len(sliced.tasks)} task(s), at {', '.join(points)} and at "
            f"concurrency 1: {line}"]


def _order(points: list[Load]) -> list[tuple[Load, str]]:
    """Concurrency 1 first for both roles, then each point, who goes first swapped each time."""
    order = [(C1, role) for role in ROLES]
    for i, load in enumerate(p for p in points if p.name != C1.name and p.concurrency != 1):
        order += [(load, role) for role in (ROLES if i % 2 else ROLES[::-1])]
    return order


def _side_by_side(ctx: StageContext) -> bool:
    """Both servers launched by quantlab and up, each on cores of its own, and the recipe lets
    both be asked at once (quality.concurrent_roles): the two evaluations at concurrency 1 then
    go together, since they judge answers (a load at c1 is one request per server) and their
    time is not gated. Not for endpoints: two roles may be one server, and c1 would be two."""
    serve = ctx.recipe.serve
    return serve.mode == "launch" and serve.side_by_side and ctx.recipe.quality.concurrent_roles


def run(ctx: StageContext):
    from quantlab.core.together import run_together

    out = ctx.run.path / OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    sliced = sliced_tasks(ctx, max_len=ctx.served_max_model_len())
    n, plan_line = judge.planned(ctx, sliced)
    docs = documents(sliced.available, n)
    order = _order([load for _, load in loads(ctx)])
    answers: dict[tuple[str, str], RunAnswers] = {}
    evaluated: dict[tuple[str, str], float] = {}
    raw: dict[str, list[str]] = {}
    notes: list[str] = []
    total_docs = sum(d.size or 0 for d in docs.values())
    with step(ctx.progress, f"load_quality: {total_docs} documents at {len(order) // 2} load(s) on both models",
              total=len(order), unit="evaluations") as bar:
        def one(load: Load, role: str, stop=None) -> None:
            bar.detail(f"load_quality {role}: {load.name} ({load.label})")
            started = time.monotonic()
            folder = out / role / load.name.replace("/", "_")
            answers[(role, load.name)] = evaluate(
                ctx, role, sliced.work, docs, load, folder, tasks=sliced.tasks, log_path=out / f"{role}-lmeval.log",
                said=lambda line: bar.detail(f"load_quality {role} at {load.name}: {line}"), stop=stop)
            evaluated[(role, load.name)] = time.monotonic() - started
            raw.setdefault(load.name, []).extend(_artifacts(ctx, folder, role))
            bar.advance()

        rest = order
        if _side_by_side(ctx):
            for role in ROLES:  # both got here, not from two threads at once
                ctx.engine(role)
            run_together({role: (lambda stop, _r=role: one(C1, _r, stop)) for role in ROLES})
            rest = order[len(ROLES):]
            notes.append("concurrency 1: baseline and candidate were asked at the same time, each server on its own "
                         "cores (serve.side_by_side); the points' loads went one server at a time")
        for load, role in rest:
            one(load, role)
    seconds = {role: sum(t for (r, _), t in evaluated.items() if r == role) for role in ROLES}
    result = judge.result(ctx, loads(ctx), answers, docs=docs, seconds=seconds, plan_line=plan_line, n=n,
                          evaluated=evaluated, raw=raw)
    result.notes[:0] = notes
    return result


def _artifacts(ctx: StageContext, folder, role: str) -> list[str]:
    """An evaluation's samples and timed requests, recorded as the run's artifacts."""
    rels = []
    for path in sorted(folder.glob("*.jsonl")):
        rel = str(path.relative_to(ctx.run.path))
        ctx.add_artifact(rel, f"load-quality-{role}-{'requests' if path.name == RECORDS_FILE else 'samples'}")
        rels.append(rel)
    return rels

