"""Performance stage: the recipe's workloads on the served baseline and candidate,
measured alternately (A, B, A, B, ... when both servers can be up at once), with
per-request rows on file, metrics per workload point, ratios with their run-to-run
spread, engine and process samples, memory, cost, gates and plots. The measuring itself
is performance/measure_loop.py's, with this run's one candidate."""

from __future__ import annotations

import json
from typing import Any

from quantlab.core.layout import PERF_DIR  # noqa: F401 (also read from here)
from quantlab.core.stage_context import StageContext
from quantlab.core.roles import CANDIDATE, ROLES
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import sha256_file
from quantlab.performance import gates as perf_gates
from quantlab.performance import noise_store, server_history
from quantlab.performance.placement import Placement, swapped as placement_swapped
from quantlab.recipe.performance import PerformanceSpec, Workload, max_length
from quantlab.core.results import PerfResult
from quantlab.serving import stage as serve_stage
from quantlab.performance.measure_loop import (Member, Sweep, error_rate_failed, looks_for, measure_blocks,
                                               more_repeats)
from quantlab.performance.result import Measured, load_points, result_of

NAME = "performance"
OUT_DIR = PERF_DIR


def enabled(ctx: StageContext) -> bool:
    return ctx.recipe.performance is not None


def needs_baseline(ctx: StageContext) -> bool:
    return True


def inputs(ctx: StageContext) -> dict[str, Any]:
    spec = ctx.recipe.performance
    return {
        "performance": spec.model_dump(mode="json") if spec else None,
        "datasets": [sha256_file(ctx.loaded.resolve(w.dataset)) for w in spec.workloads if w.dataset]
        if spec else [],
        "serving": serve_stage.inputs(ctx),
    }


def _max_model_len(ctx: StageContext) -> int | None:
    explicit = ctx.recipe.serve.engine_args.get("max_model_len")
    if isinstance(explicit, int):
        return explicit
    try:
        cfg = json.loads((ctx.baseline_model().path / "config.json").read_text())
        return cfg.get("max_position_embeddings")
    except (OSError, ValueError):
        return None


def preflight(ctx: StageContext) -> None:
    spec: PerformanceSpec = ctx.recipe.performance
    limit = _max_model_len(ctx)
    for i, w in enumerate(spec.workloads):
        need = max_length(w.prompt_tokens) + max_length(w.output_tokens)
        if limit is not None and need > limit:
            raise RecipeError(
                f"workload '{w.name}' asks for up to {max_length(w.prompt_tokens)} prompt + "
                f"{max_length(w.output_tokens)} output tokens = {need}, more than the served max_model_len "
                f"{limit}: shorten the workload or raise serve.engine_args.max_model_len",
                file=str(ctx.loaded.path), field=f"performance.workloads.{i}")


def plan(ctx: StageContext) -> list[str]:
    """What the dry run says of the performance gates: per workload point, which noise model
    will judge its ratios (the host's calibration pooled with the run's repeats, or the
    run's own repeats alone)."""
    spec: PerformanceSpec = ctx.recipe.performance
    own = max(spec.repeats - 1, 0)
    if not spec.host_noise:
        return [f"performance.host_noise is false: every point is judged on the run's own repeats ({own} df)"]
    gated = {perf_gates.PERF_GATES[g][0] for g in perf_gates.judged_by_interval(spec.gates)
             if perf_gates.PERF_GATES[g][1] == "ratio"}
    if not gated:
        return []
    found = noise_store.for_run(ctx, spec)
    lines = []
    for w in spec.workloads:
        for point, _, _ in load_points(w):
            noise = [found.get((w.name, point), {}).get(m) for m in sorted(gated)]
            if all(n is not None for n in noise):
                least = min(noise, key=lambda n: n.df)
                lines.append(f"{w.name}/{point}: host calibration: {least.df} df from {'; '.join(least.sources)}, "
                             f"pooled with the run's own {own}" + _bands(spec, w, found[(w.name, point)]))
            else:
                lines.append(f"{w.name}/{point}: the run's own repeats: {own} df; run `quantlab calibrate "
                             f"{ctx.loaded.path}` to calibrate this host")
    return lines


def _bands(spec: PerformanceSpec, w: Workload, noise: dict) -> str:
    """Per ratio gate, the ratio it needs to decide at `repeats` (no adaptive repeat), at the
    levels the stage judges: the pass side at 1 - confidence, the fail side at its share of
    the run's false-block budget over every gated figure and point (result.points_of)."""
    ratio_gates = [g for g in perf_gates.judged_by_interval(spec.gates) if perf_gates.PERF_GATES[g][1] == "ratio"]
    n_points = sum(len(load_points(w)) for w in spec.workloads)
    family = max(1, len(perf_gates.judged_by_interval(spec.gates)) * n_points)
    fail_alpha = perf_gates.FAIL_SHARE * (1 - spec.confidence) / family
    parts = []
    for gate in ratio_gates:
        key, _, direction = perf_gates.PERF_GATES[gate]
        host = noise.get(key)
        if host is None or not host.df:
            continue
        limit = getattr(spec.gates, gate)
        pass_at, fail_at = perf_gates.decision_band(limit, direction, variance=host.ss / host.df,
                                                    df=host.df + max(spec.repeats - 1, 0), repeats=spec.repeats,
                                                    pass_alpha=1 - spec.confidence, fail_alpha=fail_alpha)
        sign = (">=", "<=") if direction == "min" else ("<=", ">=")
        if ".p99" in key and w.num_requests < perf_gates.MIN_P99_REQUESTS:  # gates._tail_needs_requests
            parts.append(f"{key} ratio fails {sign[1]} {fail_at:.3g}, never passes ({w.num_requests} requests a "
                         f"repeat, a pass needs {perf_gates.MIN_P99_REQUESTS})")
            continue
        parts.append(f"{key} ratio passes {sign[0]} {pass_at:.3g}, fails {sign[1]} {fail_at:.3g}")
    return ("; at " + str(spec.repeats) + " repeats " + ", ".join(parts) + " (between: not shown)") if parts else ""


def _schedule(ctx: StageContext, repeats: int) -> tuple[list[tuple[int, str]], bool]:
    """(repeat, role) blocks in measuring order. Both servers up: alternate, swapping who
    goes first each repeat (A B B A ...). One at a time: all of the running one first."""
    if ctx.recipe.serve.side_by_side:
        order = []
        for rep in range(repeats):
            order += [(rep, r) for r in (ROLES if rep % 2 == 0 else ROLES[::-1])]
        return order, True
    first = ctx.running_engines()[0] if ctx.running_engines() else "baseline"
    second = "candidate" if first == "baseline" else "baseline"
    return [(rep, first) for rep in range(repeats)] + [(rep, second) for rep in range(repeats)], False


def _tokenizer(ctx: StageContext):
    from quantlab.models.tokenizer import load_tokenizer

    folder = ctx.checkpoint_dir if (ctx.checkpoint_dir / "tokenizer_config.json").is_file() \
        else ctx.baseline_model().path
    return load_tokenizer(folder, trust_remote_code=ctx.recipe.model.trust_remote_code)


def run(ctx: StageContext) -> PerfResult:
    from quantlab.performance.loadgen import measure_client_ceiling

    spec: PerformanceSpec = ctx.recipe.performance
    plan = ctx.serving_plan()
    (ctx.run.path / OUT_DIR).mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    client = None
    if spec.client_check:
        ctx.progress("performance: measuring the load generator's own ceiling against a stub server")
        client = measure_client_ceiling()
    order, interleaved = _schedule(ctx, spec.repeats)
    if not interleaved:
        notes.append("serve.side_by_side is false, so one server ran at a time: all repeats of one model were "
                      "measured before the other's, and machine drift between the two blocks is not cancelled. "
                      "Set serve.side_by_side: true for alternating A/B measurements")
    requests = requests_for(ctx, spec)
    measured = Measured(host_noise=noise_store.for_run(ctx, spec, plan=plan))
    notes += server_history.notes(ctx)  # what each server answered before the load: it may move its speed
    if interleaved:
        ctx.start_engines(list(ROLES))  # a resumed run skipped serve: both start at once, not one by one
        measured.placement = Placement.of({role: ctx.engine(role) for role in ROLES})
    sweep = Sweep(spec, requests, {CANDIDATE: Member(ctx, measured)}, server=ctx.engine,
                  block_of=_paired_block, device=plan.device, progress=ctx.progress, warmed=measured.warmed,
                  place=lambda rep: _place(measured, rep))
    try:
        measure_blocks(sweep, order)
        looks = looks_for(spec, interleaved, notes)
        if looks > 1:
            order = _adaptive_repeats(sweep, order, looks, notes)
    finally:
        if measured.placement is not None:
            measured.placement.put(False)  # the later stages find the engines where they were launched
    notes += _placement_notes(measured)
    notes += _store_noise(ctx, spec, measured, plan)
    return result_of(ctx, spec, measured, client, notes, looks=looks, interleaved=interleaved,
                     order=[f"{role}#{rep + 1}" for rep, role in order])


def _paired_block(rep: int, members: list[str]) -> list[tuple[int, str]]:
    """An adaptive repeat's blocks: the two servers, who goes first swapped each repeat."""
    return [(rep, r) for r in (ROLES if rep % 2 == 0 else ROLES[::-1])]


def _adaptive_repeats(sweep: Sweep, order: list[tuple[int, str]], looks: int,
                      notes: list[str]) -> list[tuple[int, str]]:
    """The adaptive repeats (measure_loop.more_repeats), said in notes. Returns the whole order."""
    spec = sweep.spec
    repeats = more_repeats(sweep, order, looks=looks)
    if repeats.stopped_at is not None:
        failed = error_rate_failed(perf_gates.verdicts(repeats.points[CANDIDATE], spec.gates))
        if failed:
            notes.append(f"adaptive repeats: stopped after {repeats.stopped_at} paired repeat(s): the error rate "
                         f"failed at {', '.join(failed)}, which no further repeat can undo")
    extra = len(repeats.order) // 2 - spec.repeats
    if extra:
        notes.append(f"adaptive repeats: {extra} more paired repeat(s) of the points not yet decided "
                     f"(performance.max_repeats {spec.max_repeats}); the fail side's alpha is split over {looks} looks")
    return repeats.order


def _store_noise(ctx: StageContext, spec: PerformanceSpec, measured: Measured, plan) -> list[str]:
    """This run's repeats into the host's noise store (an A/A run's ratios, else the
    baseline's repeats), said in a note; a store that cannot be written is said, not fatal."""
    try:
        kind, stored = noise_store.record_run(ctx, spec, measured.samples, plan=plan)
    except OSError as err:
        return [f"host noise: this run's repeats could not be stored ({err})"]
    if not stored:
        return []
    what = ("this A/A run's per-repeat ratios (the candidate is the baseline's weights)" if kind == noise_store.AA
            else "the baseline's per-repeat figures")
    return [f"host noise: {what} stored for {stored} point(s), for later runs on this host to pool"]


def requests_for(ctx: StageContext, spec: PerformanceSpec) -> dict[str, list]:
    """Each workload's requests, built once with the checkpoint's tokenizer."""
    from quantlab.performance.prompts import build_requests

    tokenizer = _tokenizer(ctx)
    return {w.name: build_requests(w, tokenizer, served_name="", count=w.num_requests,
                                   dataset=ctx.loaded.resolve(w.dataset) if w.dataset else None,
                                   field=f"performance.workloads.{i}")
            for i, w in enumerate(spec.workloads)}


def _placement_notes(measured: Measured) -> list[str]:
    if measured.placement is None:
        return ["placement: not swapped between repeats (no two quantlab-launched CPU engines on cores of their "
                "own); a ratio here holds the placement as well as the model"]
    lines = [f"placement: repeat {rep + 1}: {where}" for rep, where in sorted(measured.placed.items())]
    if not measured.swapped_repeats and len(measured.placed) > 1:
        lines.append("placement: the engines' threads could not be moved, so every repeat ran as launched")
    return lines


def _place(measured: Measured, rep: int) -> None:
    """Repeat `rep` on its crossover placement (performance/placement.py)."""
    p = measured.placement
    if p is None:
        return
    ok = p.put(placement_swapped(rep))
    where = p.line() + (" (cores swapped)" if p.is_swapped else "")
    if not ok:
        where += " (the swap could not move the engines' threads)"
    measured.placed.setdefault(rep, where)
    if p.is_swapped:
        measured.swapped_repeats.add(rep)
