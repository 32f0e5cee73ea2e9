"""The performance stage's result from what was measured: the points with their intervals,
memory and cost per role, the gates, the workload's context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quantlab.core import redact
from quantlab.core.stage_context import StageContext
from quantlab.core.roles import BASELINE, CANDIDATE, ROLES
from quantlab.core.fsutil import safetensors_bytes
from quantlab.performance import gates as perf_gates
from quantlab.performance.metrics import compare, median_metrics
from quantlab.performance.noise import (HostNoise, RepeatSample, interval, per_repeat_figures, ratio_draws,
                                        value_draws)
from quantlab.performance.placement import Placement
from quantlab.recipe.performance import PerformanceSpec, Workload
from quantlab.core.results import PerfPoint, PerfResult, ServeResult
from quantlab.serving.plan import unrepresentative_settings


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


def headline_cost(points: list[PerfPoint], role: str, price: float | None) -> dict[str, Any]:
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


def result_of(ctx: StageContext, spec: PerformanceSpec, measured: "Measured", client: dict | None, notes: list[str],
              *, looks: int, interleaved: bool, order: list[str], **extra: Any) -> PerfResult:
    """The stage's result from what was measured: points, gates, memory, cost, plots
    (`extra`: a comparison's fields)."""
    plan = ctx.serving_plan()
    points = points_of(spec, measured, client, notes, looks=looks)
    context = _context(ctx, plan)
    return PerfResult(
        interleaved=interleaved,
        order=order,
        points=points,
        client=client,
        client_cpu_share=measured.cpu_s / measured.wall_s if measured.wall_s else 0.0,
        memory={role: _memory(ctx, role, [m for p in points for m in p.monitor.get(role, [])]) for role in ROLES},
        cost={role: headline_cost(points, role, spec.price_per_hour) for role in ROLES},
        gates=perf_gates.verdicts(points, spec.gates),
        plots=[],  # drawn by reports.stage_plots once the stage returns
        notes=notes,
        unrepresentative=unrepresentative_settings(plan.engine_args),
        workload_context=context,
        **extra,
    )


@dataclass
class Measured:
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
    sequence: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # the roles' blocks in measuring order
    # per (workload, point), per metric: the host's calibrated spread (performance/noise_store.py)
    host_noise: dict[tuple[str, str], dict[str, HostNoise]] = field(default_factory=dict)


def crossover_orders(sequence: list[str]) -> np.ndarray | None:
    """Who went first in each paired repeat, from the roles' blocks in measuring order: +1
    where the baseline's i-th block came before the candidate's i-th, -1 where after (None
    when the blocks were not recorded)."""
    if not sequence:
        return None
    where = {role: [i for i, r in enumerate(sequence) if r == role] for role in (BASELINE, CANDIDATE)}
    return np.array([1 if b < c else -1 for b, c in zip(where[BASELINE], where[CANDIDATE], strict=False)])


def points_of(spec: PerformanceSpec, measured: Measured, client: dict | None, notes: list[str], *,
               looks: int = 1) -> list[PerfPoint]:
    """Each point's medians over repeats, paired candidate/baseline ratios, and the gated
    figures' intervals. The fail side's alpha: its share of the run's false-block budget
    (FAIL_SHARE x (1 - confidence)) split over every gated figure at every point and
    every look (Bonferroni)."""
    points = []
    n_points = sum(len(load_points(w)) for w in spec.workloads)
    family = max(1, len(perf_gates.judged_by_interval(spec.gates)) * n_points * looks)
    fail_alpha = perf_gates.FAIL_SHARE * (1 - spec.confidence) / family
    pass_confidence = 1 - (1 - spec.confidence) / looks  # a pass may come at any look: its alpha is split too
    for w in spec.workloads:
        for point, conc, rate in load_points(w):
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
                                    intervals=intervals(spec, measured.samples[(w.name, point)],
                                                         fail_alpha=fail_alpha, seed=w.seed,
                                                         pass_confidence=pass_confidence,
                                                         host_noise=measured.host_noise.get((w.name, point)),
                                                         orders=crossover_orders(
                                                             measured.sequence.get((w.name, point), [])))))
            if near:
                notes.append(f"{w.name}/{point}: {asked:.0f} requests/s is over half the load generator's own "
                             f"ceiling here ({client['requests_per_s']:.0f}/s): the client may limit this point")
    return points


def intervals(spec: PerformanceSpec, samples: dict[str, list[RepeatSample]], *, fail_alpha: float,
               seed: int, pass_confidence: float | None = None, host_noise: dict[str, HostNoise] | None = None,
               orders: np.ndarray | None = None) -> dict[str, dict[str, Any]]:
    """The interval of every gated figure at one point; a ratio's pools the host's calibrated
    spread of that figure (host_noise, by metric) and balances the crossover's orders (+1
    where the baseline went first in that repeat, -1 where the candidate did)."""
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
                                 else per_repeat_figures(c, None, key),
                                 host_noise=(host_noise or {}).get(key) if kind == "ratio" else None,
                                 orders=orders if kind == "ratio" else None).as_dict()
    return out


def _context(ctx: StageContext, plan) -> dict[str, Any]:
    probe = plan.probe
    hw = (", ".join(g["name"] for g in probe.get("gpus") or []) if plan.device == "cuda"
          else f"{(probe.get('cpu') or {}).get('model', 'CPU')} x{(probe.get('cpu') or {}).get('count', '?')}")
    vllm = (probe.get("versions") or {}).get("vllm")
    label = f"{ctx.recipe.name} on vLLM {vllm or '?'}, {hw}"
    return {"label": label, "recipe": ctx.recipe.name, "device": plan.device, "hardware": hw, "vllm": vllm,
            "engine_args": redact.engine_args(plan.engine_args), "side_by_side": ctx.recipe.serve.side_by_side,
            "env": redact.env(ctx.recipe.serve.env),  # names kept, values as digests
            "workloads": [w.model_dump(mode="json") for w in ctx.recipe.performance.workloads]}


NEAR_CEILING = 0.5  # a point asking more than half the client's ceiling measures the client too


def load_points(w: Workload) -> list[tuple[str, int | None, float | None]]:
    return [(f"c{c}", c, None) for c in w.concurrency] + [(f"r{r:g}", None, r) for r in w.request_rates]
