"""What the release records of the performance check (pure): its summary in the manifest
and its entry in the error budget (core/checks.py names both)."""

from __future__ import annotations

from typing import Any

from quantlab.core.results import PerfResult
from quantlab.core.verdicts import GateVerdict
from quantlab.performance.gates import FAIL_SHARE


def summary(perf: PerfResult) -> dict[str, Any]:
    """The manifest's summary of the performance result (the run record holds all of it)."""
    return {
        "interleaved": perf.interleaved, "points": [
            {"point": f"{p.workload}/{p.point}",
             "output_tokens_per_s": {"baseline": p.baseline.get("output_tokens_per_s"),
                                     "candidate": p.candidate.get("output_tokens_per_s"),
                                     "ratio": p.comparison.get("output_tokens_per_s", {}).get("ratio")},
             "p99_ttft_ms": {"baseline": p.baseline["ttft_ms"]["p99"], "candidate": p.candidate["ttft_ms"]["p99"]},
             "error_rate": {"baseline": p.baseline.get("error_rate"), "candidate": p.candidate.get("error_rate")}}
            for p in perf.points],
        "memory": perf.memory, "cost": perf.cost, "workload": perf.workload_context,
        "unrepresentative": perf.unrepresentative}


def budget(vs: list[GateVerdict], spec: Any) -> dict[str, Any]:
    """Performance's bounds are one-sided: the fail alpha of each test is 1 - its fail confidence."""
    fail = [1 - (v.fail_confidence or 0.95) for v in vs]
    out = {
        "tests": len(vs),
        "gates": len(vs),
        "test": sorted({v.test for v in vs}),
        "pass_alpha": round(1 - spec.confidence, 6) if spec is not None else None,
        "fail_alpha_per_test": round(min(fail), 8),
        # the stage split its share of 1 - confidence over gates x points x looks: the family is that, not
        # the sum over the verdicts of one look
        "fail_alpha_family": round(FAIL_SHARE * (1 - spec.confidence), 6) if spec is not None else round(sum(fail), 6),
        "family_rule": "Bonferroni over every interval gate x workload point x look (fail side)",
    }
    if spec is not None and spec.max_repeats:
        out["looks"] = {"repeats": spec.repeats, "max_repeats": spec.max_repeats}
    return out
