"""The performance gates: workload points and the recipe's limits to verdicts (pure).

A verdict is pass, fail or not shown (inconclusive), always with the value, the limit
and a line saying what was compared. Ratios are medians over alternately measured
repeats. Each gated figure carries an interval (performance/noise.py: the bootstrap,
widened by the spread between repeats, pooled with the host's calibrated spread where
one is given; the evidence names the noise model that judged): a gate
passes when the interval's one-sided bound at the recipe's confidence is within the
limit, fails only when the family-adjusted bound is beyond it (so an unchanged model
is blocked on noise at most 1 - confidence of the time, across all performance gates),
and is not shown while the interval includes the limit. A figure without an interval
(no per-request rows) is judged on its point value, and the detail says so. A figure
not measured at all (no successful request) is not shown and not warnable: nothing was
measured for release.policy to let through.

The error rate is a count, not an estimate: every failed or timed-out request over every
request sent, pooled over the repeats and the adaptive looks (never a median of the
repeats' rates, which passed 30 errors in 600 requests as 0%). A failed error-rate gate
also ends the adaptive repeats (performance/measure_loop.undecided_points), so more repeats
cannot dilute a failure into a pass.
"""

from __future__ import annotations

from quantlab.core.results import PerfPoint
from quantlab.core.verdicts import GateVerdict
from quantlab.performance.metrics import metric
from quantlab.recipe.performance import PerfGates

CHECK = "performance"
# a P99 from fewer requests than this per repeat is one of the slowest few: it may fail, never pass
MIN_P99_REQUESTS = 100
# One error budget for the run (release/error_budget.py): an unchanged model is falsely
# blocked at most 1 - confidence = 5% of the time over the interval-judged checks, half
# spent by quality's fail side ((1 - c) / 2, one-sided), half by performance's.
FAIL_SHARE = 0.5

# gate field -> (comparison key or candidate metric, kind, direction)
PERF_GATES = {
    "min_throughput_ratio": ("output_tokens_per_s", "ratio", "min"),
    "max_p99_ttft_ratio": ("ttft_ms.p99", "ratio", "max"),
    "max_p99_tpot_ratio": ("tpot_ms.p99", "ratio", "max"),
    "max_p99_ttft_ms": ("ttft_ms.p99", "absolute", "max"),
    "max_p99_tpot_ms": ("tpot_ms.p99", "absolute", "max"),
    "max_error_rate": ("error_rate", "absolute", "max"),
}


def interval_key(key: str, kind: str) -> str:
    """Where a gated figure's interval is kept in PerfPoint.intervals."""
    return f"{'ratio' if kind == 'ratio' else 'candidate'}:{key}"


def judged_by_interval(gates: PerfGates) -> list[str]:
    """The set gates whose figure gets a bootstrap interval (the error rate is counted, not sampled)."""
    return [g for g in PERF_GATES if getattr(gates, g) is not None and g != "max_error_rate"]


def verdicts(points: list[PerfPoint], gates: PerfGates) -> list[GateVerdict]:
    """Every performance gate at every workload point."""
    out = []
    for p in points:
        scope = f"{p.workload}/{p.point}"
        for gate, (key, kind, direction) in PERF_GATES.items():
            limit = getattr(gates, gate)
            if limit is None:
                continue
            counted = error_count(p) if gate == "max_error_rate" else None
            if kind == "ratio":
                value = (p.comparison.get(key) or {}).get("ratio")
                what = f"{key} candidate/baseline (median of {len(p.candidate_repeats)} paired repeats)"
            elif counted is not None:
                value = counted[0] / counted[1] if counted[1] else None
                what = f"candidate {key}"
            else:
                value = metric(p.candidate, key)
                what = f"candidate {key}"
            fields = {"metric": f"{key} ratio" if kind == "ratio" else key,
                      "comparator": "at_least" if direction == "min" else "at_most"}
            if value is None:
                missing = ("no request was sent" if gate == "max_error_rate" else
                           "no successful request, or a single output token")
                out.append(GateVerdict(check=CHECK, gate=gate, scope=scope, verdict="inconclusive",
                                       value=None, limit=limit, warnable=False,
                                       evidence=f"{what}: not measured ({missing}); nothing measured is nothing "
                                       "release.policy can let through", **fields))
                continue
            iv = p.intervals.get(interval_key(key, kind))
            if gate == "max_error_rate":  # every request sent is counted: a fact of this run, not an estimate
                verdict = "fail" if value > limit else "pass"
                why = ("counted over every request sent (failed and timed-out ones)" if counted is None else
                       f"{counted[0]} of {counted[1]} requests sent failed or timed out, counted over "
                       f"{len(p.candidate_repeats)} repeat(s)")
                fields["test"] = "count"
            else:
                iv = _holding(iv, value)
                verdict, why = _judge(value, limit, direction, iv)
                fields["test"] = "hierarchical-bootstrap" if iv else "threshold"
                verdict, why = _tail_needs_requests(key, verdict, why, iv, p)
                if iv:  # the one-sided bounds at performance.confidence, and the fail side's (one-sided)
                    fields.update(low=iv["pass_low"], high=iv["pass_high"], fail_confidence=1 - iv["fail_alpha"])
            out.append(GateVerdict(check=CHECK, gate=gate, scope=scope, verdict=verdict, value=value, limit=limit,
                                   # ': ' keeps the reason in the finding's first part (what a run's summary shows)
                                   evidence=f"{what} = {value:.4g}, needs {'>=' if direction == 'min' else '<='} "
                                   f"{limit:g}: {why}", estimate=value, **fields))
    return out


def error_count(p: PerfPoint) -> tuple[int, int] | None:
    """(failed or timed-out requests, requests sent) over every repeat of the candidate at
    this point; None for a record whose repeats do not say how many they sent (judged on
    its recorded rate)."""
    reps = p.candidate_repeats
    if not reps or any(not isinstance(r.get("requests"), int) for r in reps):
        return None
    failed = 0
    for r in reps:
        if isinstance(r.get("error_requests"), int) and isinstance(r.get("timeout_requests"), int):
            failed += r["error_requests"] + r["timeout_requests"]
        else:
            failed += round((r.get("error_rate") or 0.0) * r["requests"])
    return failed, sum(r["requests"] for r in reps)


def _tail_needs_requests(key: str, verdict: str, why: str, iv: dict | None, p: PerfPoint) -> tuple[str, str]:
    """A P99 gate passes only on >= MIN_P99_REQUESTS requests a repeat: from 16 it is the
    slowest one or two, and a tail 1.7x worse was blocked 2-4% of the time. A failure on
    fewer still counts (even the few show a breach beyond the interval)."""
    if ".p99" not in key or verdict != "pass":
        return verdict, why
    n = iv["requests"] if iv else min([r.get("ok_requests") or 0 for r in p.candidate_repeats] or [0])
    if n >= MIN_P99_REQUESTS:
        return verdict, why
    return "inconclusive", (f"not shown: a P99 from {n} requests a repeat cannot show the tail (a pass needs >= "
                            f"{MIN_P99_REQUESTS}: raise the workload's num_requests); {why}")


def _holding(iv: dict | None, value: float) -> dict | None:
    """The interval widened, where needed, to hold the value the verdict reports: the value
    is the median over repeats of per-pair ratios (metrics.compare), the interval's centre
    the order-balanced mean of the per-repeat log ratios, and a verdict never passes (or
    fails) on a bound on the far side of the value it states."""
    if iv is None:
        return None
    held = dict(iv, pass_low=min(iv["pass_low"], value), pass_high=max(iv["pass_high"], value),
                fail_low=min(iv["fail_low"], value), fail_high=max(iv["fail_high"], value))
    if any(held[k] != iv[k] for k in ("pass_low", "pass_high", "fail_low", "fail_high")):
        held["held_value"] = True
    return held


def _judge(value: float, limit: float, direction: str, iv: dict | None) -> tuple[str, str]:
    worse = (lambda x: x < limit) if direction == "min" else (lambda x: x > limit)
    if iv is None:
        return ("fail" if worse(value) else "pass"), "judged on the measured value (no interval)"
    # the bound nearest the limit from the good side (pass) and from the bad side (fail)
    pass_bound, fail_bound = ((iv["pass_low"], iv["fail_high"]) if direction == "min"
                              else (iv["pass_high"], iv["fail_low"]))
    conf = 1 - (iv["fail_alpha"])
    df = iv.get("between_df")
    held = (f" (widened to hold the reported value; the interval's centre is {iv['centre']:.4g})"
            if iv.get("held_value") and iv.get("centre") is not None else
            " (widened to hold the reported value)" if iv.get("held_value") else "")
    span = (f"interval {iv['pass_low']:.3g} .. {iv['pass_high']:.3g} (one-sided bounds), fail side "
            f"{iv['fail_low']:.3g} .. {iv['fail_high']:.3g} at {conf:.2%} (family-adjusted){held}; "
            f"{iv['repeats']} repeat(s), >= {iv['requests']} requests each, {iv['draws']} bootstrap draws; "
            f"bounds from {_bounds_from(iv)}")
    if worse(fail_bound):
        return "fail", f"beyond the limit even at the fail side's bound; {span}"
    if not worse(pass_bound) and (df == 0 or iv["repeats"] < 2):
        # requests of one repeat move together (waves in closed loop): their bootstrap alone is too narrow to pass
        # on, and with the host's spread one repeat cannot show that the calibration holds for this run
        return "inconclusive", f"not shown: a pass needs >= 2 paired repeats (performance.repeats); {span}"
    if not worse(pass_bound):
        return "pass", f"within the limit at the interval's bound; {span}"
    side = "beyond" if worse(value) else "within"
    return "inconclusive", (f"not shown: the value is {side} the limit but the interval includes it (more "
                            f"repeats, performance.max_repeats, or more requests per point would narrow it); {span}")


def _bounds_from(iv: dict) -> str:
    df = iv.get("between_df")
    if df is None:  # an interval recorded before the between-repeat term
        return "the bootstrap"
    if df == 0:
        return "the bootstrap alone (one repeat: no spread between repeats to measure)"
    model = iv.get("noise_model")
    if model is None:  # an interval recorded before the host's noise could be pooled
        return f"the wider of the bootstrap and Student's t over the repeats ({df} df)"
    return f"the wider of the bootstrap and Student's t ({df} df; noise model: {model})"


def decision_band(limit: float, direction: str, *, variance: float, df: int, repeats: int, pass_alpha: float,
                  fail_alpha: float) -> tuple[float, float]:
    """Before the run: the measured ratio a gate needs to decide, from the host's calibrated
    log-ratio variance pooled over df (performance/noise_store.py) and `repeats` paired
    repeats, as the t bound judges (noise.repeat_spread; the bootstrap can only widen it).
    (pass_at, fail_at): a min gate passes when its ratio is at or above pass_at and fails
    at or below fail_at (a max gate the other way round); between them it stays not shown.
    At 2 repeats the balanced centre's variance factor is 1/4 + 1/4 = 1/k, as the plain mean's."""
    from math import exp, sqrt

    from scipy.stats import t

    se = sqrt(variance / max(1, repeats))
    to_pass, to_fail = t.ppf(1 - pass_alpha, df) * se, t.ppf(1 - fail_alpha, df) * se
    if direction == "min":
        return limit * exp(to_pass), limit * exp(-to_fail)
    return limit * exp(-to_pass), limit * exp(to_fail)
