"""The run's error budget (pure): how its chance of a wrong decision was spent, as one
ledger the manifest records (`error_budget`).

Two errors, two rules:
- a false block (an unchanged model blocked): one failing gate blocks, so the fail sides
  of a check share its alpha (Bonferroni over its gates, points and looks); over the
  run the checks' alphas add up (a union bound) for the gates judged on an interval;
- a false release (a model worse than a margin released): a release needs every
  required gate to pass (an intersection-union test), so each pass side keeps its own
  alpha and the run's is the largest of them. A gate that did not pass but was
  released by release.policy's `warn` carries no test at all: the run's false-release
  bound is then 1.0, and the ledger names those gates (`warned_gates`) and says why.
Fixed thresholds (stability, KL, a critical row, a count, the serve kernel path) are not
judged on an interval: they are listed, spending no alpha, with their false-block rate not
controlled by the ledger.
Several candidates judged on the same items (a comparison, a search) are one family
(recipe/family.py): each candidate's alphas above are already divided by its size, and
the `family` entry says so, with the family's bounds (the size times the candidate's).
Every decision against the same baseline answers is one stream (recipe/stream.py): the
`stream` entry records its position, its level and the history it was derived from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from quantlab.core.verdicts import GateVerdict, gate_id
from quantlab.performance.gates import FAIL_SHARE

LEDGER_VERSION = 2  # 2: a release through warned gates bounds nothing (1.0), and names them
INTERVAL_TESTS = ("tango-score", "bca-bootstrap", "hierarchical-bootstrap")
FIXED_TESTS = ("threshold", "count")


def ledger(verdicts: list[GateVerdict], *, rule_version: int, quality: Any = None, performance: Any = None,
           family: Any = None, judged_on_these_items: int | None = None,
           warned: Sequence[str] = (), stream: Any = None, stream_alpha: float | None = None) -> dict[str, Any]:
    """The ledger of one run: per check its tests, looks and alphas; then the run's (and
    its family's, when it was judged among several candidates: a recipe.family.Family).
    `warned`: the gate ids a release let through undecided (the decision's warned_gates
    when it released; none otherwise). `stream`: its place among the decisions against the
    same baseline answers (a recipe.stream.StreamDecision), `stream_alpha` the recipe's own
    false-release alpha it takes its share of."""
    checks: dict[str, Any] = {}
    q = [v for v in verdicts if v.check == "quality" and v.test in INTERVAL_TESTS]
    if q:
        checks["quality"] = _quality(q, quality)
    p = [v for v in verdicts if v.check == "performance" and v.test in INTERVAL_TESTS]
    if p:
        checks["performance"] = _performance(p, performance)
    fixed = sorted(gate_id(v) for v in verdicts if v.test in FIXED_TESTS)
    out = {
        "ledger_version": LEDGER_VERSION,
        "rule_version": rule_version,
        "checks": checks,
        "fixed_thresholds": {"gates": fixed, "false_block_rate": "not controlled (a fixed threshold, no interval)"},
        "run": {
            "false_block_bound": round(sum(c["fail_alpha_family"] for c in checks.values()), 6),
            "false_block_rule": "union bound over the checks' fail sides (interval-judged gates only)",
            "false_release_bound": max((c["pass_alpha"] for c in checks.values()), default=None),
            "false_release_rule": "intersection-union: every required gate passes at its own alpha",
            "tests": sum(c["tests"] for c in checks.values()),
        },
    }
    if warned:  # no test stands behind a warned gate: nothing bounds a wrong release through it
        out["run"].update(
            false_release_bound=1.0, warned_gates=sorted(warned),
            false_release_rule=f"{len(warned)} gate(s) released undecided by release.policy's warn, with no passed "
                               "test behind them: nothing bounds a wrong release through them (1.0); the passed "
                               "gates' own alphas hold for them alone")
    if judged_on_these_items is not None:  # the cached baseline answers' uses, by separate runs too
        out["baseline_answers"] = {
            "candidates_judged": judged_on_these_items,
            "rule": "distinct candidates (by weights) judged against the same cached baseline answers, this one "
                    "included; only a family (a comparison, a search, --family) splits the alpha over them"}
    if stream is not None:  # recipe/stream.py: the level this decision's gates were judged at, and why
        out["stream"] = stream.record(stream_alpha)
    if family is not None:
        run = out["run"]
        out["family"] = {**family.as_dict(),
                         "false_release_bound": None if run["false_release_bound"] is None else
                         min(1.0, round(run["false_release_bound"] * family.size, 6)),
                         "false_release_rule": "union bound over the family's candidates: a wrong release of any "
                                               "of them, each candidate's own bound times the family's size"}
    return out


def _quality(vs: list[GateVerdict], spec: Any) -> dict[str, Any]:
    """Quality's fail side: one interval per comparison (task or slice), however many
    gates (margins) read it; two-sided intervals, so each side spends half."""
    comparisons = {v.scope: v for v in vs}
    fail = [(1 - (v.fail_confidence or v.confidence or 0.95)) / 2 for v in comparisons.values()]
    out = {
        "tests": len(comparisons),
        "gates": len(vs),
        "test": sorted({v.test for v in vs}),
        "pass_alpha": round(max((1 - (v.confidence or 0.95)) / 2 for v in vs), 6),
        "fail_alpha_per_test": round(min(fail), 8),
        "fail_alpha_family": round(sum(fail), 6),
        "family_rule": "Bonferroni over the gated comparisons (fail side); each pass side at its own confidence",
    }
    if spec is not None:
        out["samples"] = spec.samples
        if spec.samples == "auto":
            out.update(_looks(list(comparisons.values()), spec))
    return out


def _looks(vs: list[GateVerdict], spec: Any) -> dict[str, Any]:
    """`samples: auto`: what the looks spent in all. Each side of a comparison spends its
    (1 - confidence) / 2 over its looks (the boundary's total, whatever look it stopped
    at), the fail side that over the m comparisons; a verdict's own confidence is only
    its last look's nominal level (each look's nominal levels add up to more than the
    boundary spends, the looks being correlated), so the alphas are the configured ones."""
    from quantlab.quality.sequential import RULE

    confidences = [spec.gates.confidence] + [o.confidence for o in (*spec.task_gates.values(),
                                                                    *spec.slice_gates.values())
                                             if o.confidence is not None]
    if spec.pooled is not None:
        confidences.append(spec.pooled.confidence)
    alpha = (1 - min(confidences)) / 2
    return {
        "pass_alpha": round(alpha, 6),
        "fail_alpha_per_test": round(alpha / max(1, len(vs)), 8),
        "fail_alpha_family": round(alpha, 6),
        "looks": {"first": spec.sequential.first, "growth": spec.sequential.growth,
                  "alpha_per_side": round(alpha, 6), "rule": RULE,
                  # per comparison: the one-sided nominal levels its last look was judged at
                  "nominal_levels": {v.scope: {"samples": v.samples,
                                               "pass": round((1 - (v.confidence or 0.95)) / 2, 8),
                                               "fail": round((1 - (v.fail_confidence or v.confidence or 0.95)) / 2, 8)}
                                     for v in sorted(vs, key=lambda v: v.scope)}},
    }


def _performance(vs: list[GateVerdict], spec: Any) -> dict[str, Any]:
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
