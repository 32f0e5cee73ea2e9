"""Performance stage: the recipe's workloads on the served baseline and candidate,
measured alternately (A, B, A, B, ... when both servers can be up at once), with
per-request rows on file, metrics per workload point, ratios with their run-to-run
spread, engine and process samples, memory, cost, gates and plots."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from quantlab.core.stage_context import StageContext
from quantlab.core.engine_time import engine_busy
from quantlab.core.roles import ROLES
from quantlab.core.errors import EngineError, RecipeError
from quantlab.core.fsutil import safetensors_bytes, sha256_file, write_text_atomic
from quantlab.performance import gates as perf_gates
from quantlab.performance.metrics import compare, median_metrics, summarize
from quantlab.performance.noise import RepeatSample, interval, per_repeat_figures, ratio_draws, value_draws
from quantlab.performance.placement import Placement, swapped as placement_swapped
from quantlab.recipe.performance import PerformanceSpec, Workload, max_length
from quantlab.core.progress import step
from quantlab.core.results import PerfPoint, PerfResult, ServeResult
from quantlab.serving.plan import unrepresentative_settings
from quantlab.serving import stage as serve_stage

NAME = "performance"
OUT_DIR = "perf"
NEAR_CEILING = 0.5  # a point asking more than half the client's ceiling measures the client too
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


def _points(w: Workload) -> list[tuple[str, int | None, float | None]]:
    return [(f"c{c}", c, None) for c in w.concurrency] + [(f"r{r:g}", None, r) for r in w.request_rates]


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


def _memory(ctx: StageContext, role: str, monitors: list[dict[str, Any]]) -> dict[str, Any]:
    plan = ctx.serving_plan()
    target = plan.target(role)
    serve = ctx.run.record.result("serve")
    log = serve.engines[role].log if isinstance(serve, ServeResult) and role in serve.engines else None
    rss = [m["server_rss_peak_bytes"] for m in monitors if m.get("server_rss_peak_bytes")]
    gpu = [m["gpu_mem_used_peak_bytes"] for m in monitors if m.get("gpu_mem_used_peak_bytes")]
    system = ((plan.probe.get("cpu") or {}).get("memory_bytes") if plan.device == "cpu"
              else sum(g.get("memory_bytes", 0) for g in plan.probe.get("gpus") or []) or None)
    peak = max(gpu) if plan.device == "cuda" and gpu else (max(rss) if rss else None)
    weights = safetensors_bytes(target.model_dir) if target.model_dir else None
    return {
        "checkpoint_bytes_on_disk": weights,
        "kv_cache_tokens": (log or {}).get("kv_cache_tokens"),
        "kv_cache_dtype": (log or {}).get("kv_cache_dtype"),
        "peak_bytes": peak,
        "peak_is": "GPU memory used" if plan.device == "cuda" and gpu else "server process tree RSS",
        "device_memory_bytes": system,
        "headroom_bytes": system - peak if system and peak else None,
    }


def _headline_cost(points: list[PerfPoint], role: str, price: float | None) -> dict[str, Any]:
    """Cost per successful answer at the cheapest point that meets the SLOs (no errors,
    at least 99% of requests within every SLO)."""
    if price is None:
        return {"price_per_hour": None, "cost_per_successful_request": None, "at": None}
    meeting = [(getattr(p, role)["cost_per_successful_request"], f"{p.workload}/{p.point}") for p in points
               if getattr(p, role)["error_rate"] == 0 and getattr(p, role)["slo_attainment"] >= 0.99
               and getattr(p, role)["cost_per_successful_request"] is not None]
    if not meeting:
        return {"price_per_hour": price, "cost_per_successful_request": None,
                "at": "no workload point met the SLOs"}
    cost, where = min(meeting)
    return {"price_per_hour": price, "cost_per_successful_request": cost, "at": where}


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
    requests = _requests(ctx, spec)
    measured = _Measured()
    if interleaved:
        measured.placement = Placement.of({role: ctx.engine(role) for role in ROLES})
    try:
        _measure_all(ctx, spec, order, requests, measured, device=plan.device)
        looks = _looks(spec, interleaved, notes)
        if looks > 1:
            first = _points_of(spec, measured, client, [], looks=looks)
            order = _more_repeats(ctx, spec, order, requests, measured, first, device=plan.device, looks=looks,
                                  notes=notes)
    finally:
        if measured.placement is not None:
            measured.placement.put(False)  # the later stages find the engines where they were launched
    notes += _placement_notes(measured)
    return result_of(ctx, spec, measured, client, notes, looks=looks, interleaved=interleaved,
                     order=[f"{role}#{rep + 1}" for rep, role in order])


def result_of(ctx: StageContext, spec: PerformanceSpec, measured: "_Measured", client: dict | None, notes: list[str],
              *, looks: int, interleaved: bool, order: list[str], **extra: Any) -> PerfResult:
    """The stage's result from what was measured: points, gates, memory, cost, plots
    (`extra`: a comparison's fields)."""
    plan = ctx.serving_plan()
    points = _points_of(spec, measured, client, notes, looks=looks)
    context = _context(ctx, plan)
    return PerfResult(
        interleaved=interleaved,
        order=order,
        points=points,
        client=client,
        client_cpu_share=measured.cpu_s / measured.wall_s if measured.wall_s else 0.0,
        memory={role: _memory(ctx, role, [m for p in points for m in p.monitor.get(role, [])]) for role in ROLES},
        cost={role: _headline_cost(points, role, spec.price_per_hour) for role in ROLES},
        gates=perf_gates.verdicts(points, spec.gates),
        plots=[],  # drawn by reports.stage_plots once the stage returns
        notes=notes,
        unrepresentative=unrepresentative_settings(plan.engine_args),
        workload_context=context,
        **extra,
    )


def _requests(ctx: StageContext, spec: PerformanceSpec) -> dict[str, list]:
    """Each workload's requests, built once with the checkpoint's tokenizer."""
    from quantlab.performance.prompts import build_requests

    tokenizer = _tokenizer(ctx)
    return {w.name: build_requests(w, tokenizer, served_name="", count=w.num_requests,
                                   dataset=ctx.loaded.resolve(w.dataset) if w.dataset else None,
                                   field=f"performance.workloads.{i}")
            for i, w in enumerate(spec.workloads)}


@dataclass
class _Measured:
    """Per (workload, point): per role, the metrics and monitor summary of each repeat, and the raw files."""

    metrics: dict[tuple[str, str], dict[str, list]] = field(default_factory=dict)
    monitor: dict[tuple[str, str], dict[str, list]] = field(default_factory=dict)
    raw: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    samples: dict[tuple[str, str], dict[str, list[RepeatSample]]] = field(default_factory=dict)
    warmed: set[tuple[str, str]] = field(default_factory=set)  # (role, workload) already warmed up
    cpu_s: float = 0.0  # the load generator's CPU time, for its share of a core
    wall_s: float = 0.0
    placement: Placement | None = None  # crossover: the engines swap cores every second repeat
    placed: dict[int, str] = field(default_factory=dict)  # repeat -> where each role computed
    swapped_repeats: set[int] = field(default_factory=set)  # the repeats that ran with the cores swapped


def _placement_notes(measured: _Measured) -> list[str]:
    if measured.placement is None:
        return ["placement: not swapped between repeats (no two quantlab-launched CPU engines on cores of their "
                "own); a ratio here holds the placement as well as the model"]
    lines = [f"placement: repeat {rep + 1}: {where}" for rep, where in sorted(measured.placed.items())]
    if not measured.swapped_repeats and len(measured.placed) > 1:
        lines.append("placement: the engines' threads could not be moved, so every repeat ran as launched")
    return lines


def _place(measured: _Measured, rep: int) -> None:
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
                 out: _Measured, *, device: str, only: set[tuple[str, str]] | None = None) -> None:
    """Every point of every workload (or only the (workload, point) pairs named), on each
    server in the scheduled order, added to `out`."""
    warmed = out.warmed
    slo = spec.slo.model_dump()
    total_blocks = len(order)
    n_points = len(order) * sum(1 for w in spec.workloads for pt in _points(w)
                                if only is None or (w.name, pt[0]) in only)
    with step(ctx.progress, "performance: load points", total=n_points, unit="points", announce=False) as bar:
        for block, (rep, role) in enumerate(order, 1):
            _place(out, rep)
            server = ctx.engine(role)
            for w in spec.workloads:
                if only is not None and not any((w.name, pt[0]) in only for pt in _points(w)):
                    continue
                reqs = [_for_server(r, server.served_name) for r in requests[w.name]]
                warm_up(server, role, w, reqs, warmed)
                for point, conc, rate in _points(w):
                    if only is not None and (w.name, point) not in only:
                        continue
                    bar.detail(f"performance [{block}/{total_blocks}] {role} repeat {rep + 1}: {w.name} {point}, "
                               f"{len(reqs)} requests")
                    metrics, msum, rel, result = _measure(ctx, server, role, rep, w, reqs, point, conc, rate,
                                                          device=device, slo=slo)
                    out.cpu_s += result.client_cpu_s
                    out.wall_s += result.wall_s
                    out.metrics.setdefault((w.name, point), {}).setdefault(role, []).append(metrics)
                    out.monitor.setdefault((w.name, point), {}).setdefault(role, []).append(msum)
                    out.raw.setdefault((w.name, point), []).append(rel)
                    out.samples.setdefault((w.name, point), {}).setdefault(role, []).append(
                        RepeatSample.of(result.records, result.wall_s))
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
    """(workload, point) of every gate the noise leaves not shown."""
    return {tuple(v.scope.split("/", 1)) for v in perf_gates.verdicts(points, spec.gates)
            if v.verdict == "inconclusive" and v.value is not None}


def _looks(spec: PerformanceSpec, interleaved: bool, notes: list[str]) -> int:
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
                  measured: _Measured, points: list[PerfPoint], *, device: str, looks: int,
                  notes: list[str]) -> list[tuple[int, str]]:
    """One more paired repeat at a time of the points whose gates are not shown, until
    they are decided or performance.max_repeats is reached. Returns the whole order."""
    order = list(order)
    for rep in range(spec.repeats, spec.max_repeats):
        undecided = undecided_points(spec, points)
        if not undecided:
            break
        ctx.progress(f"performance: {len(undecided)} point(s) not decided yet, measuring repeat {rep + 1} of "
                     f"at most {spec.max_repeats}")
        block = [(rep, r) for r in (ROLES if rep % 2 == 0 else ROLES[::-1])]
        _measure_all(ctx, spec, block, requests, measured, device=device, only=undecided)
        order += block
        points = _points_of(spec, measured, None, [], looks=looks)
    extra = len(order) // 2 - spec.repeats
    if extra:
        notes.append(f"adaptive repeats: {extra} more paired repeat(s) of the points not yet decided "
                     f"(performance.max_repeats {spec.max_repeats}); the fail side's alpha is split over {looks} looks")
    return order


def _points_of(spec: PerformanceSpec, measured: _Measured, client: dict | None, notes: list[str], *,
               looks: int = 1) -> list[PerfPoint]:
    """Each point's medians over repeats, paired candidate/baseline ratios, and the gated
    figures' intervals. The fail side's alpha: its share of the run's false-block budget
    (FAIL_SHARE x (1 - confidence)) split over every gated figure at every point and
    every look (Bonferroni)."""
    points = []
    n_points = sum(len(_points(w)) for w in spec.workloads)
    family = max(1, len(perf_gates.judged_by_interval(spec.gates)) * n_points * looks)
    fail_alpha = perf_gates.FAIL_SHARE * (1 - spec.confidence) / family
    pass_confidence = 1 - (1 - spec.confidence) / looks  # a pass may come at any look: its alpha is split too
    for w in spec.workloads:
        for point, conc, rate in _points(w):
            reps = measured.metrics[(w.name, point)]
            b, c = median_metrics(reps["baseline"]), median_metrics(reps["candidate"])
            asked = max(b["request_throughput"] or 0, c["request_throughput"] or 0)
            near = bool(client) and asked > NEAR_CEILING * client["requests_per_s"]
            points.append(PerfPoint(workload=w.name, point=point, concurrency=conc, rate=rate, baseline=b,
                                    candidate=c, baseline_repeats=reps["baseline"],
                                    candidate_repeats=reps["candidate"],
                                    comparison=compare(reps["baseline"], reps["candidate"]),
                                    monitor=measured.monitor[(w.name, point)], near_client_ceiling=near,
                                    raw_files=measured.raw[(w.name, point)],
                                    intervals=_intervals(spec, measured.samples[(w.name, point)],
                                                         fail_alpha=fail_alpha, seed=w.seed,
                                                         pass_confidence=pass_confidence)))
            if near:
                notes.append(f"{w.name}/{point}: {asked:.0f} requests/s is over half the load generator's own "
                             f"ceiling here ({client['requests_per_s']:.0f}/s): the client may limit this point")
    return points


def _intervals(spec: PerformanceSpec, samples: dict[str, list[RepeatSample]], *, fail_alpha: float,
               seed: int, pass_confidence: float | None = None) -> dict[str, dict[str, Any]]:
    """The bootstrap interval of every gated figure at one point."""
    out: dict[str, dict[str, Any]] = {}
    b, c = samples.get("baseline", []), samples.get("candidate", [])
    fewest = min([len(s.e2e) for s in b + c] or [0])
    for gate in perf_gates.judged_by_interval(spec.gates):
        key, kind, _ = perf_gates.PERF_GATES[gate]
        name = perf_gates.interval_key(key, kind)
        if name in out:
            continue
        draws = (ratio_draws(b, c, key, draws=spec.bootstrap_draws, seed=seed) if kind == "ratio"
                 else value_draws(c, key, draws=spec.bootstrap_draws, seed=seed))
        if draws is not None:
            out[name] = interval(draws, confidence=pass_confidence or spec.confidence, fail_alpha=fail_alpha,
                                 repeats=min(len(b), len(c)) if kind == "ratio" else len(c), requests=fewest,
                                 per_repeat=per_repeat_figures(b, c, key) if kind == "ratio"
                                 else per_repeat_figures(c, None, key)).as_dict()
    return out


def _short(req, tokens: int = WARMUP_OUTPUT_TOKENS):
    """A warm-up copy of a request: the same prompt, fewer output tokens. The batch shapes
    (prefill and decode at the batch size) are what a first use costs; more decode steps
    of the same shape warm nothing more."""
    from quantlab.performance.loadgen import PreparedRequest

    n = min(tokens, req.requested_output_tokens)
    body = {**req.body, "max_tokens": n} | ({"min_tokens": n} if "min_tokens" in req.body else {})
    return PreparedRequest(req.path, body, n)


def _for_server(req, served_name: str):
    from quantlab.performance.loadgen import PreparedRequest

    return PreparedRequest(req.path, {**req.body, "model": served_name}, req.requested_output_tokens)


def _context(ctx: StageContext, plan) -> dict[str, Any]:
    probe = plan.probe
    hw = (", ".join(g["name"] for g in probe.get("gpus") or []) if plan.device == "cuda"
          else f"{(probe.get('cpu') or {}).get('model', 'CPU')} x{(probe.get('cpu') or {}).get('count', '?')}")
    vllm = (probe.get("versions") or {}).get("vllm")
    label = f"{ctx.recipe.name} on vLLM {vllm or '?'}, {hw}"
    return {"label": label, "recipe": ctx.recipe.name, "device": plan.device, "hardware": hw, "vllm": vllm,
            "engine_args": plan.engine_args, "side_by_side": ctx.recipe.serve.side_by_side,
            "env": {k: v for k, v in ctx.recipe.serve.env.items()},
            "workloads": [w.model_dump(mode="json") for w in ctx.recipe.performance.workloads]}


def _measure(ctx: StageContext, server, role: str, rep: int, w, reqs, point: str, conc, rate, *, device: str,
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
