"""One judged candidate's run record reduced to what the choice and the comparison
table read (pure): its decision and the gates behind it, cost per successful answer,
peak memory, KV capacity, peak throughput, P99 latencies at that point, the error rate
and its worst quality recovery."""

from __future__ import annotations

from typing import Any

from quantlab.core.results import LoadQualityResult, PerfResult, QualityResult, ReleaseResult
from quantlab.core.run import RunRecord
from quantlab.reports.comparison_records import CandidateSummary


def summarize(name: str, record: RunRecord, role: str = "candidate",
              decided: Any = None) -> tuple[CandidateSummary, dict[str, Any]]:
    """(what `choose` reads, the row the comparison table shows). `role` picks the
    baseline's figures from the same record for the table's baseline row. `decided` (a
    DecisionRecord) stands in for a release stage not run yet: a comparison chooses
    before it signs, so the chosen one's manifest can say so."""
    release = record.result("release") or decided
    perf = record.result("performance")
    quality = record.result("quality")
    decision, failed, not_shown = _decision(record, release)
    cost = mem = kv = tps = None
    at: str | None = None
    p99_ttft = p99_tpot = p95_ttft = p95_tpot = errors = goodput = None
    if isinstance(perf, PerfResult):
        cost = (perf.cost.get(role) or {}).get("cost_per_successful_request")
        mem = (perf.memory.get(role) or {}).get("peak_bytes")
        kv = (perf.memory.get(role) or {}).get("kv_cache_tokens")
        best = max(perf.points, key=lambda p: getattr(p, role).get("output_tokens_per_s") or 0.0, default=None)
        if best is not None:
            m = getattr(best, role)
            tps, at = m.get("output_tokens_per_s"), f"{best.workload}/{best.point}"
            p99_ttft, p99_tpot = (m.get("ttft_ms") or {}).get("p99"), (m.get("tpot_ms") or {}).get("p99")
            p95_ttft, p95_tpot = (m.get("ttft_ms") or {}).get("p95"), (m.get("tpot_ms") or {}).get("p95")
        errors = max((getattr(p, role).get("error_rate") or 0.0 for p in perf.points), default=None)
        goodput = _goodput_at_slo(perf, role)
    worst, worst_scope = _worst_recovery(quality) if role == "candidate" else (None, None)
    summary = CandidateSummary(name=name, decision=decision, failed_gates=failed, not_shown_gates=not_shown,
                               cost_per_successful_request=cost, peak_memory_bytes=mem, output_tokens_per_s=tps,
                               worst_slice_recovery=worst, goodput_at_slo=goodput)
    row = {"name": name, "decision": decision if role == "candidate" else "baseline",
           "failed_gates": failed if role == "candidate" else [],
           "not_shown_gates": not_shown if role == "candidate" else [],
           "cost_per_successful_request": cost, "peak_memory_bytes": mem, "kv_cache_tokens": kv,
           "output_tokens_per_s": tps, "at": at, "p95_ttft_ms": p95_ttft, "p99_ttft_ms": p99_ttft,
           "p95_tpot_ms": p95_tpot, "p99_tpot_ms": p99_tpot, "max_error_rate": errors, "goodput_at_slo": goodput,
           "worst_recovery": worst, "worst_recovery_at": worst_scope, "run_id": record.run_id,
           **correct_answers(record.result("load_quality"), role)}
    return summary, row


def correct_answers(lq: Any, role: str) -> dict[str, Any]:
    """Quality at load: the most right answers within every SLO per second over its points, and
    the lowest cost per correct answer (the seed's cost per successful answer, counting only
    right ones); none without a load_quality result."""
    if not isinstance(lq, LoadQualityResult):
        return {}
    goods = [(p.name, p.roles[role].load.goodput or {}) for p in lq.points if role in p.roles]
    rates = [(g.get("rate"), name) for name, g in goods if g.get("rate") is not None]
    costs = [g.get("cost_per_correct_answer") for _, g in goods if g.get("cost_per_correct_answer") is not None]
    best = max(rates, default=(None, None))
    return {"correct_answers_per_s": best[0], "correct_answers_at": best[1],
            "cost_per_correct_answer": min(costs, default=None)}


def _decision(record: RunRecord, release) -> tuple[str, list[str], list[str]]:
    if isinstance(release, ReleaseResult) or hasattr(release, "not_shown_gates"):
        return release.decision, list(release.failed_gates), list(release.not_shown_gates)
    # no release stage result: the run failed or stopped before deciding; nothing to ship
    return "blocked", [f"run {record.status} before its release decision"], []


def _goodput_at_slo(perf: PerfResult, role: str) -> float | None:
    """Successful requests per second at the best point that meets the SLOs (no errors, 99%
    within every SLO): the point a cost per success is quoted at (performance/stage)."""
    meeting = [m.get("goodput_requests_per_s") for m in (getattr(p, role) for p in perf.points)
               if m.get("error_rate") == 0 and (m.get("slo_attainment") or 0) >= 0.99
               and m.get("goodput_requests_per_s") is not None]
    return max(meeting) if meeting else None


def _worst_recovery(quality) -> tuple[float | None, str | None]:
    """The lowest candidate / baseline recovery over the tasks and pooled slices."""
    if not isinstance(quality, QualityResult):
        return None, None
    scored = [(c.recovery, c.task) for c in quality.tasks + quality.slices if c.recovery is not None]
    return min(scored) if scored else (None, None)


def on_common_baseline(pairs: list[tuple[CandidateSummary, dict[str, Any]]],
                       baselines: list[dict[str, Any] | None]) -> list[tuple[CandidateSummary, dict[str, Any]]]:
    """Speed figures of candidates measured beside different baseline blocks (groups served
    apart, or candidates in turn) put on one scale: each candidate's throughput, answers/s
    and cost are multiplied by (reference baseline / its own baseline), the reference being
    the first candidate's baseline. So the choice ranks paired ratios, not whichever group
    had the quieter machine. Candidates of one sweep share their baseline: factor 1."""
    from dataclasses import replace

    ref = next((b for b in baselines if b and b.get("output_tokens_per_s")), None)
    out = []
    for (summary, row), base in zip(pairs, baselines):
        tps_k = _factor(ref, base, "output_tokens_per_s")
        good_k = _factor(ref, base, "goodput_at_slo") or tps_k
        if tps_k is None or tps_k == good_k == 1.0:  # nothing to scale by, or the same baseline block
            out.append((summary, row))
            continue
        scaled = {"output_tokens_per_s": _times(summary.output_tokens_per_s, tps_k),
                  "goodput_at_slo": _times(summary.goodput_at_slo, good_k),
                  "cost_per_successful_request": _times(summary.cost_per_successful_request, 1 / good_k)}
        out.append((replace(summary, **scaled),
                    {**row, **scaled, "measured_as": {k: row.get(k) for k in scaled},
                     "baseline_scale": {"output_tokens_per_s": round(tps_k, 4), "goodput_at_slo": round(good_k, 4)}}))
    return out


def _factor(ref: dict[str, Any] | None, base: dict[str, Any] | None, key: str) -> float | None:
    a, b = (ref or {}).get(key), (base or {}).get(key)
    return a / b if a and b else None


def _times(value: float | None, k: float) -> float | None:
    return value * k if value is not None else None
