"""Performance stage: the recipe's workloads on the served baseline and candidate,
measured alternately (A, B, A, B, ... when both servers can be up at once), with
per-request rows on file, metrics per workload point, ratios with their run-to-run
spread, engine and process samples, memory, cost, gates and plots."""

from __future__ import annotations

import json
from typing import Any

from quantlab.core.layout import PERF_DIR  # noqa: F401 (also read from here)
from quantlab.core.stage_context import StageContext
from quantlab.core.engine_time import engine_busy
from quantlab.core.roles import ROLES
from quantlab.core.errors import EngineError, RecipeError
from quantlab.core.fsutil import sha256_file, write_text_atomic
from quantlab.performance import gates as perf_gates
from quantlab.performance import noise_store
from quantlab.performance.metrics import summarize
from quantlab.performance.noise import RepeatSample
from quantlab.performance.placement import Placement, swapped as placement_swapped
from quantlab.recipe.performance import PerformanceSpec, Workload, max_length
from quantlab.core.progress import step
from quantlab.core.results import PerfPoint, PerfResult
from quantlab.serving import stage as serve_stage
from quantlab.performance.result import Measured, points_of, result_of
from quantlab.performance.result import load_points

NAME = "performance"
OUT_DIR = PERF_DIR
WARMUP_OUTPUT_TOKENS = 16


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
    if interleaved:
        measured.placement = Placement.of({role: ctx.engine(role) for role in ROLES})
    try:
        _measure_all(ctx, spec, order, requests, measured, device=plan.device)
        looks = looks_for(spec, interleaved, notes)
        if looks > 1:
            first = points_of(spec, measured, client, [], looks=looks)
            order = _more_repeats(ctx, spec, order, requests, measured, first, device=plan.device, looks=looks,
                                  notes=notes)
    finally:
        if measured.placement is not None:
            measured.placement.put(False)  # the later stages find the engines where they were launched
    notes += _placement_notes(measured)
    notes += _store_noise(ctx, spec, measured, plan)
    return result_of(ctx, spec, measured, client, notes, looks=looks, interleaved=interleaved,
                     order=[f"{role}#{rep + 1}" for rep, role in order])


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


def _measure_all(ctx: StageContext, spec: PerformanceSpec, order: list[tuple[int, str]], requests: dict[str, list],
                 out: Measured, *, device: str, only: set[tuple[str, str]] | None = None) -> None:
    """Every point of every workload (or only the (workload, point) pairs named), on each
    server in the scheduled order, added to `out`."""
    warmed = out.warmed
    slo = spec.slo.model_dump()
    total_blocks = len(order)
    n_points = len(order) * sum(1 for w in spec.workloads for pt in load_points(w)
                                if only is None or (w.name, pt[0]) in only)
    with step(ctx.progress, "performance: load points", total=n_points, unit="points", announce=False) as bar:
        for block, (rep, role) in enumerate(order, 1):
            _place(out, rep)
            server = ctx.engine(role)
            for w in spec.workloads:
                if only is not None and not any((w.name, pt[0]) in only for pt in load_points(w)):
                    continue
                reqs = [for_server(r, server.served_name) for r in requests[w.name]]
                warm_up(server, role, w, reqs, warmed)
                for point, conc, rate in load_points(w):
                    if only is not None and (w.name, point) not in only:
                        continue
                    bar.detail(f"performance [{block}/{total_blocks}] {role} repeat {rep + 1}: {w.name} {point}, "
                               f"{len(reqs)} requests")
                    metrics, msum, rel, result = measure_point(ctx, server, role, rep, w, reqs, point, conc, rate,
                                                          device=device, slo=slo)
                    out.cpu_s += result.client_cpu_s
                    out.wall_s += result.wall_s
                    out.metrics.setdefault((w.name, point), {}).setdefault(role, []).append(metrics)
                    out.monitor.setdefault((w.name, point), {}).setdefault(role, []).append(msum)
                    out.raw.setdefault((w.name, point), []).append(rel)
                    out.samples.setdefault((w.name, point), {}).setdefault(role, []).append(
                        RepeatSample.of(result.records, result.wall_s))
                    out.sequence.setdefault((w.name, point), []).append(role)
                    bar.advance()


def warm_up(server, role: str, w: Workload, reqs: list, warmed: set[tuple[str, str]]) -> None:
    """Once per server and workload, before its first measured point: what warming pays
    for (a CPU engine's first batch of a new size, first-use allocations) happens once."""
    from quantlab.performance.loadgen import run_point

    if not w.warmup_requests or (role, w.name) in warmed:
        return
    top = max(w.concurrency or [1])
    with engine_busy():
        run_point(server.base_url, [_short(r) for r in (reqs * top)[:max(w.warmup_requests, top)]],
                  concurrency=top, timeout_s=w.request_timeout_s)
    warmed.add((role, w.name))


def undecided_points(spec: PerformanceSpec, points: list[PerfPoint]) -> set[tuple[str, str]]:
    """(workload, point) of every gate the noise leaves not shown; none once an error-rate
    gate failed: the run is blocked whatever more repeats show, and pooling more requests
    into the count could only dilute the failure into a pass."""
    judged = perf_gates.verdicts(points, spec.gates)
    if error_rate_failed(judged):
        return set()
    return {tuple(v.scope.split("/", 1)) for v in judged if v.verdict == "inconclusive" and v.value is not None}


def error_rate_failed(judged: list) -> list[str]:
    """The scopes whose error-rate gate failed."""
    return [v.scope for v in judged if v.gate == "max_error_rate" and v.verdict == "fail"]


def looks_for(spec: PerformanceSpec, interleaved: bool, notes: list[str]) -> int:
    """How many times the gates may be looked at (the first measurement plus one per
    adaptive repeat); the fail side's alpha is split over them."""
    if spec.max_repeats is None or spec.max_repeats == spec.repeats:
        return 1
    if not interleaved:
        notes.append("performance.max_repeats is set but serve.side_by_side is false: adaptive repeats need both "
                     "servers up, so exactly `repeats` were measured")
        return 1
    return spec.max_repeats - spec.repeats + 1


def _more_repeats(ctx: StageContext, spec: PerformanceSpec, order: list[tuple[int, str]], requests: dict[str, list],
                  measured: Measured, points: list[PerfPoint], *, device: str, looks: int,
                  notes: list[str]) -> list[tuple[int, str]]:
    """One more paired repeat at a time of the points whose gates are not shown, until
    they are decided or performance.max_repeats is reached. Returns the whole order."""
    order = list(order)
    for rep in range(spec.repeats, spec.max_repeats):
        undecided = undecided_points(spec, points)
        if not undecided:
            failed = error_rate_failed(perf_gates.verdicts(points, spec.gates))
            if failed:
                notes.append(f"adaptive repeats: stopped after {rep} paired repeat(s): the error rate failed at "
                             f"{', '.join(failed)}, which no further repeat can undo")
            break
        ctx.progress(f"performance: {len(undecided)} point(s) not decided yet, measuring repeat {rep + 1} of "
                     f"at most {spec.max_repeats}")
        block = [(rep, r) for r in (ROLES if rep % 2 == 0 else ROLES[::-1])]
        _measure_all(ctx, spec, block, requests, measured, device=device, only=undecided)
        order += block
        points = points_of(spec, measured, None, [], looks=looks)
    extra = len(order) // 2 - spec.repeats
    if extra:
        notes.append(f"adaptive repeats: {extra} more paired repeat(s) of the points not yet decided "
                     f"(performance.max_repeats {spec.max_repeats}); the fail side's alpha is split over {looks} looks")
    return order


def _short(req, tokens: int = WARMUP_OUTPUT_TOKENS):
    """A warm-up copy of a request: the same prompt, fewer output tokens. The batch shapes
    (prefill and decode at the batch size) are what a first use costs; more decode steps
    of the same shape warm nothing more."""
    from quantlab.performance.loadgen import PreparedRequest

    n = min(tokens, req.requested_output_tokens)
    body = {**req.body, "max_tokens": n} | ({"min_tokens": n} if "min_tokens" in req.body else {})
    return PreparedRequest(req.path, body, n)


def for_server(req, served_name: str):
    from quantlab.performance.loadgen import PreparedRequest

    return PreparedRequest(req.path, {**req.body, "model": served_name}, req.requested_output_tokens)


def measure_point(ctx: StageContext, server, role: str, rep: int, w, reqs, point: str, conc, rate, *, device: str,
             slo: dict) -> tuple[dict[str, Any], dict[str, Any], str, Any]:
    """One load point on one server: the requests, the monitor's samples, the per-request
    rows on file, the metrics."""
    from quantlab.performance.loadgen import run_point
    from quantlab.performance.monitor import Monitor

    monitor = Monitor(server.base_url, server.proc.pid if server.proc else None, device=device).start()
    try:
        with engine_busy():
            result = run_point(server.base_url, reqs, concurrency=conc, rate=rate, duration_s=w.duration_s,
                               timeout_s=w.request_timeout_s, seed=w.seed + rep)
    finally:
        msum = monitor.stop()
    rel = f"{OUT_DIR}/{role}-{w.name}-{point}-r{rep + 1}.jsonl"
    write_text_atomic(ctx.run.path / rel, "".join(json.dumps(r.as_row()) + "\n" for r in result.records))
    ctx.add_artifact(rel, "perf-requests")
    try:
        server.ensure_alive(f"during performance workload '{w.name}' {point}")
    except EngineError as err:
        raise EngineError(f"{err}\nPartial per-request data: {ctx.run.path / rel}") from None
    metrics = summarize(result.records, wall_s=result.wall_s, slo=slo,
                        price_per_hour=ctx.recipe.performance.price_per_hour)
    metrics["not_sent"] = result.not_sent
    metrics["client_cpu_share"] = result.client_cpu_s / result.wall_s if result.wall_s else None
    return metrics, msum, rel, result
