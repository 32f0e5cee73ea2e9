"""What the release records of the quality check (pure): its summary in the manifest and
its entry in the error budget (core/checks.py names both)."""

from __future__ import annotations

from typing import Any

from quantlab.core.results import QualityResult
from quantlab.core.verdicts import GateVerdict


def summary(quality: QualityResult) -> dict[str, Any]:
    """The manifest's summary of the quality result (the run record holds all of it)."""
    return {
        "tasks": [{"task": t.task, "slice": t.slice, "metric": t.metric, "n": t.n, "baseline": t.baseline,
                   "candidate": t.candidate, "diff": t.diff, "ci": [t.ci_low, t.ci_high],
                   "confidence": t.confidence, "recovery": t.recovery, "lost": t.worse, "gained": t.better,
                   "mcnemar_p": t.mcnemar_p} for t in quality.tasks + quality.slices],
        "kl": quality.kl, "baseline_cached": quality.baseline_cached, "skipped": quality.skipped,
        "lm_eval_version": quality.lm_eval_version, "suites": quality.suites, "flips_file": quality.flips_file,
        "code_sandbox": quality.code_sandbox}


def budget(vs: list[GateVerdict], spec: Any) -> dict[str, Any]:
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
