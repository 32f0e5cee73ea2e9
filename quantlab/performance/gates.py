"""The performance gates: workload points and the recipe's limits to verdicts (pure).

A verdict is pass, fail or inconclusive, always with the value, the limit and a line
saying what was compared. Performance ratios are medians over alternately measured
repeats; a ratio beyond its limit but within the run-to-run noise is still a fail (the
limit is the user's), and the detail says that the difference is within the noise.
"""

from __future__ import annotations



from quantlab.performance.metrics import metric
from quantlab.performance.spec import PerfGates
from quantlab.core.results import PerfPoint
from quantlab.core.verdicts import GateVerdict

# gate field -> (comparison key or candidate metric, kind, direction)
PERF_GATES = {
    "min_throughput_ratio": ("output_tokens_per_s", "ratio", "min"),
    "max_p99_ttft_ratio": ("ttft_ms.p99", "ratio", "max"),
    "max_p99_tpot_ratio": ("tpot_ms.p99", "ratio", "max"),
    "max_p99_ttft_ms": ("ttft_ms.p99", "absolute", "max"),
    "max_p99_tpot_ms": ("tpot_ms.p99", "absolute", "max"),
    "max_error_rate": ("error_rate", "absolute", "max"),
}


def verdicts(points: list[PerfPoint], gates: PerfGates) -> list[GateVerdict]:
    """Every performance gate at every workload point."""
    out = []
    for p in points:
        scope = f"{p.workload}/{p.point}"
        for gate, (key, kind, direction) in PERF_GATES.items():
            limit = getattr(gates, gate)
            if limit is None:
                continue
            noise_note = ""
            if kind == "ratio":
                cmp = p.comparison.get(key) or {}
                value = cmp.get("ratio")
                what = f"{key} candidate/baseline (median of {len(p.candidate_repeats)} paired repeats)"
                if cmp.get("beyond_noise") is False:
                    noise_note = f"; the difference is within the run-to-run spread ({cmp.get('noise'):.1%})"
            else:
                value = metric(p.candidate, key)
                what = f"candidate {key}"
            if value is None:
                out.append(GateVerdict(stage="performance", gate=gate, scope=scope, verdict="inconclusive",
                                       value=None, limit=limit, detail=f"{what}: not measured (no successful "
                                       "request, or a single output token)"))
                continue
            ok = value >= limit if direction == "min" else value <= limit
            sign = ">=" if direction == "min" else "<="
            out.append(GateVerdict(stage="performance", gate=gate, scope=scope, verdict="pass" if ok else "fail",
                                   value=value, limit=limit,
                                   detail=f"{what} = {value:.4g}, needs {sign} {limit:g}{noise_note}"))
    return out
