"""Each gate's verdict against its own numbers, and a quality gate's numbers against the
comparison the manifest's results record (pure).

A decision re-derived from the verdicts proves only that the verdicts were added up
right. A signer who flips a failed gate to `pass` (and the decision with it) leaves the
gate's interval or value saying otherwise: a pass needs the interval's worse end within
the limit (non-inferiority, an interval-judged performance figure) or the value within it
(a fixed threshold, a count); a fail needs them beyond it. What this cannot catch is
numbers edited together with the verdict: a self-consistent record of measurements
never made.
"""

from __future__ import annotations

import math
from typing import Any

from quantlab.core.verdicts import AT_LIMIT, GateVerdict, gate_id

INTERVAL_TESTS = ("hierarchical-bootstrap",)  # performance: judged on the one-sided bound, not the value


def consistency_problems(manifest: Any) -> list[str]:
    """Gates whose verdict their own numbers contradict, and quality gates whose numbers
    are not their comparison's."""
    out = []
    for v in manifest.gates:
        why = verdict_contradiction(v)
        if why:
            out.append(f"gate {gate_id(v)}: recorded '{v.verdict}', but {why}")
    return out + _quality_numbers(manifest)


def _beyond(x: float, limit: float, comparator: str) -> bool:
    slack = AT_LIMIT * max(1.0, abs(limit))
    return x > limit + slack if comparator == "at_most" else x < limit - slack


def verdict_contradiction(v: GateVerdict) -> str | None:
    """Why the gate's own numbers cannot give its verdict (None: they can, or do not say)."""
    if v.verdict == "inconclusive":
        return None  # too few samples, a look not yet decided: any numbers can leave a gate undecided
    if v.comparator == "non_inferior":
        if v.margin is None or v.low is None or v.high is None:
            return None
        slack = AT_LIMIT * max(1.0, v.margin)
        if v.verdict == "pass" and v.low < -v.margin - slack:
            return f"its interval's worse end {v.low:+.4g} is below -{v.margin:.4g}: a pass needs it above"
        if v.verdict == "fail" and v.high > -v.margin + slack:
            return f"its interval's better end {v.high:+.4g} is not below -{v.margin:.4g}: a fail needs it below"
        return None
    if v.comparator not in ("at_most", "at_least"):
        return None
    if v.test in INTERVAL_TESTS and v.low is not None and v.high is not None:
        bound = v.high if v.comparator == "at_most" else v.low  # the pass side's bound nearest the limit
        if v.verdict == "pass" and _beyond(bound, v.limit, v.comparator):
            return f"its interval's bound {bound:.4g} is beyond its limit {v.limit:g}: a pass needs it within"
        return None  # a fail is judged on the fail side's wider bound, which the gate does not record
    if v.value is None:
        return "it has no value: a figure not measured cannot pass" if v.verdict == "pass" else None
    if v.verdict == "pass" and _beyond(v.value, v.limit, v.comparator):
        return f"its value {v.value:.4g} is beyond its limit {v.limit:g}"
    if v.verdict == "fail" and not _beyond(v.value, v.limit, v.comparator):
        return f"its value {v.value:.4g} is within its limit {v.limit:g}"
    return None


def _close(a: Any, b: Any) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
        math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _quality_numbers(manifest: Any) -> list[str]:
    """A comparison gate's samples, estimate and interval are its task's comparison
    (oriented: positive = the candidate better), as the manifest's results record it."""
    results = manifest.results if isinstance(manifest.results, dict) else {}
    quality = results.get("quality") if isinstance(results.get("quality"), dict) else {}
    rows = {r.get("task"): r for r in quality.get("tasks") or [] if isinstance(r, dict)}
    out = []
    for v in manifest.gates:
        row = rows.get(v.scope)
        if v.check != "quality" or v.comparator != "non_inferior" or row is None or v.estimate is None:
            continue
        ci = row.get("ci") if isinstance(row.get("ci"), list) and len(row.get("ci")) == 2 else [None, None]
        diff = row.get("diff")
        if not all(isinstance(x, (int, float)) for x in (diff, *ci)):
            continue
        orientations = [(diff, ci[0], ci[1]), (-diff, -ci[1], -ci[0])]  # higher or lower is better
        if not any(_close(v.estimate, d) and _close(v.low, lo) and _close(v.high, hi) for d, lo, hi in orientations):
            out.append(f"gate {gate_id(v)}: its estimate {v.estimate:+.4g} and interval {v.low} .. {v.high} are not "
                       f"its comparison's in the manifest's results (difference {diff:+.4g}, interval {ci[0]} .. "
                       f"{ci[1]})")
        elif row.get("n") is not None and v.samples is not None and row.get("n") != v.samples:
            out.append(f"gate {gate_id(v)}: judged on {v.samples} samples, its comparison has {row.get('n')}")
    return out
