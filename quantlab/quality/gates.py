"""The quality gates (pure): paired comparisons of tasks and slices, and the KL summary,
judged against the recipe's quality section.

Every comparison gate is a non-inferiority test at its own margin, never a point
estimate: `non_inferiority` at margin x |baseline|, `min_recovery` r at the worsening a
recovery of r allows ((1 - r) x |baseline|; |baseline| x (1/r - 1) for lower-is-better
metrics), `max_drop` d at d, each floored by `non_inferiority_min_margin`. A gate passes
when the interval's worse end is above -margin, fails when the fail side's interval
(adjusted for the family of gates) is entirely below it, and is inconclusive otherwise
(with about how many samples would tell).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quantlab.core.results import TaskComparison
from quantlab.core.verdicts import GateVerdict
from quantlab.quality.compare import POOLED_SCOPE, PREFIX_STEP, TRANSFORMS
from quantlab.recipe.quality import QualityGates, QualitySpec, ni_margin
from quantlab.quality.stats import Value, paired_interval

CHECK = "quality"

# a comparison with its paired per-sample values (baseline, candidate)
Paired = tuple[TaskComparison, Sequence[Value], Sequence[Value]]


def verdicts(spec: QualitySpec, tasks: list[Paired], slices: list[Paired], kl: dict[str, Any] | None,
             pooled: Paired | None = None, *, plans: dict[str, list[int]] | None = None) -> list[GateVerdict]:
    """Every quality gate: per task, per slice (pooled), over every item (`pooled`, at
    quality.pooled's margin), and on the KL summary. A task or slice whose gates are
    disabled in the recipe gets none.

    The family: a release needs every gate to pass, and each pass is judged at its own
    confidence (requiring all of them is an intersection-union test: no adjustment is
    needed to keep a worse model from passing). A block needs only one gate to fail, so
    the fail side is adjusted (Bonferroni): a gate fails only when the candidate is worse
    beyond the interval at 1 - (1 - confidence) / m, m the gated comparisons, which keeps
    an unchanged model's chance of a quality block at most 1 - confidence (one-sided).

    `plans` (evaluate until decided: each task's look schedule): a task's fail side is
    the look's nominal level of a boundary at (1 - confidence) / (2 m) per side
    (quality/sequential.py), not its pass side's level divided by m: the nominal levels
    add up to more than the boundary spends, so divided they would not keep the family's
    bound."""
    iters, seed = spec.bootstrap_iters // 4, spec.seed
    gated = []
    for cmp, b, c in tasks:
        override = spec.task_gates.get(cmp.task)
        if not (override and override.disabled):
            gated.append((cmp, b, c, task_gates(spec, cmp.task, cmp.slice), cmp.task))
    for cmp, b, c in slices:
        override = spec.slice_gates.get(cmp.slice)
        if not (override and override.disabled):
            gated.append((cmp, b, c, slice_gates(spec, cmp.slice), f"slice:{cmp.slice}"))
    if pooled is not None and spec.pooled is not None:
        gated.append((*pooled, pooled_gates(spec), pooled[0].task))
    out: list[GateVerdict] = []
    for cmp, b, c, g, scope in gated:
        family = FailFamily(size=len(gated), confidence=_fail_confidence(cmp, g, len(gated), (plans or {}).get(scope)))
        if family.size > 1:
            pooled_scope = scope.startswith("slice:") or scope == POOLED_SCOPE
            ci = paired_interval(b, c, confidence=family.confidence, iters=spec.bootstrap_iters, seed=seed,
                                 transform=None if pooled_scope else TRANSFORMS.get(cmp.metric))
            family = FailFamily(family.size, family.confidence, ci.low, ci.high)
        out += comparison_verdicts(cmp, g, scope=scope, b=b, c=c, iters=iters, seed=seed, family=family)
    if kl is not None:
        out += kl_verdicts(kl, spec)
    return out


def _fail_confidence(cmp: TaskComparison, gates: QualityGates, size: int, plan: list[int] | None) -> float:
    """The fail side's confidence: Bonferroni over the `size` gated comparisons, and for a
    task judged look by look the boundary at that share (a comparison with fewer pairs
    than its answered samples is read at an earlier, stricter look)."""
    if not plan or len(plan) <= 1:
        return 1 - (1 - cmp.confidence) / size
    from quantlab.quality.sequential import boundary_confidence

    return boundary_confidence(1 - (1 - gates.confidence) / size, plan, cmp.n)


@dataclass(frozen=True)
class FailFamily:
    """The fail side's interval, adjusted for the number of gated comparisons."""

    size: int
    confidence: float
    low: float | None = None  # candidate - baseline, as the comparison's own interval
    high: float | None = None


def pooled_gates(spec: QualitySpec) -> QualityGates:
    """The pooled gate: non-inferiority at quality.pooled.margin points, whatever the score."""
    assert spec.pooled is not None
    return QualityGates(min_recovery=None, max_drop=None, non_inferiority_margin=0.0,
                        non_inferiority_min_margin=spec.pooled.margin, confidence=spec.pooled.confidence,
                        min_samples=spec.gates.min_samples)


def task_gates(spec: QualitySpec, task: str, slice_: str) -> QualityGates:
    """The gates of one task: the defaults, then its slice's overrides, then its own."""
    g = spec.gates
    if slice_ in spec.slice_gates:
        g = spec.slice_gates[slice_].apply(g)
    if task in spec.task_gates:
        g = spec.task_gates[task].apply(g)
    return g


def slice_gates(spec: QualitySpec, slice_: str) -> QualityGates:
    return spec.slice_gates[slice_].apply(spec.gates) if slice_ in spec.slice_gates else spec.gates


def _oriented(cmp_diff: float, low: float, high: float, hib: bool) -> tuple[float, float, float]:
    """Difference and interval with positive = candidate better."""
    return (cmp_diff, low, high) if hib else (-cmp_diff, -high, -low)


def gate_margins(gates: QualityGates, cmp: TaskComparison) -> list[tuple[str, float | None, float, float, str]]:
    """The configured gates of one comparison as non-inferiority tests: (gate, the value
    it reports, its limit, the margin in the metric's units, how the margin came about)."""
    floor = gates.non_inferiority_min_margin or 0.0
    base = abs(cmp.baseline)
    out = []

    def floored(margin: float, how: str) -> tuple[float, str]:
        return (floor, f"the floor non_inferiority_min_margin {floor:g}") if floor > margin else (margin, how)

    if gates.min_recovery is not None:
        r = gates.min_recovery
        raw = (1 - r) * base if cmp.higher_is_better else base * (1 / r - 1)
        m, how = floored(max(0.0, raw), f"recovery {r:g} of the baseline's {cmp.baseline:.4g}")
        out.append(("min_recovery", cmp.recovery, r, m, how))
    if gates.max_drop is not None:
        m, how = floored(gates.max_drop, f"max_drop {gates.max_drop:g}")
        d = cmp.diff if cmp.higher_is_better else -cmp.diff
        out.append(("max_drop", -d, gates.max_drop, m, how))
    if gates.non_inferiority_margin is not None:
        m = ni_margin(gates, cmp.baseline)
        how = (f"the floor non_inferiority_min_margin {floor:g}" if floor and m == floor
               else f"margin {gates.non_inferiority_margin:g} x baseline")
        out.append(("non_inferiority", None, -m, m, how))  # its value: the interval's worse end
    return out


def comparison_verdicts(cmp: TaskComparison, gates: QualityGates, *, scope: str, b: Sequence[Value] | None = None,
                        c: Sequence[Value] | None = None, iters: int = 2000, seed: int = 0,
                        family: FailFamily | None = None) -> list[GateVerdict]:
    """The configured gates on one comparison (a task or a pooled slice), each a
    non-inferiority test at its margin (gate_margins). A gate fails only beyond the
    family's interval (see verdicts); alone, its own."""
    out: list[GateVerdict] = []
    d, lo, hi = _oriented(cmp.diff, cmp.ci_low, cmp.ci_high, cmp.higher_is_better)
    pct = f"{cmp.confidence:.0%}"
    base_line = (f"{cmp.metric}: baseline {cmp.baseline:.4g}, candidate {cmp.candidate:.4g} over {cmp.n} paired "
                 f"samples; difference {cmp.diff:+.4g} ({pct} CI {cmp.ci_low:+.4g} .. {cmp.ci_high:+.4g})")
    fail_lo, fail_hi, fail_conf, fail_side = _fail_side(cmp, family, lo, hi)
    base_line += fail_side
    few = cmp.n < gates.min_samples
    test = "tango-score" if cmp.binary else "bca-bootstrap"
    for gate, value, limit, margin, how in gate_margins(gates, cmp):
        if scope == POOLED_SCOPE:
            how = f"quality.pooled.margin {margin:g}, over every gated pass/fail item"
        verdict = ni_verdict(lo, hi, margin)
        downgraded = verdict == "fail" and fail_hi >= -margin
        if downgraded:
            verdict = "inconclusive"  # below the margin at its own confidence, not at the family's
        if few:
            verdict = "inconclusive"
        needed = None
        if verdict != "inconclusive" and b is not None and c is not None:
            needed = samples_to_verdict(b, c, verdict, margin, cmp, iters=iters, seed=seed)
        elif verdict == "inconclusive" and not few:  # a downgraded fail: until the fail side's interval clears it
            needed = samples_needed(cmp.n, d, *((fail_lo, fail_hi) if downgraded else (lo, hi)), margin)
        why = _shown(gate, value, limit) + {
            "pass": f"the interval's worse end {lo:+.4g} is above -{margin:.4g} ({how})",
            "fail": f"the whole interval is below -{margin:.4g} ({how}): worse than the margin allows",
            "inconclusive": (f"only {cmp.n} samples, fewer than min_samples {gates.min_samples}: not judged "
                             f"below {gates.min_samples} items, so release.policy cannot warn it through (judge "
                             "more items, lower min_samples for it, or disable its gates)" if few else
                             f"the whole {pct} interval is below -{margin:.4g}, but not the fail side's "
                             "(adjusted for the family of gates)" if downgraded else
                             f"the interval {lo:+.4g} .. {hi:+.4g} straddles -{margin:.4g} ({how})")
            + (f"; about {needed} samples would tell" if needed else "")}[verdict]
        out.append(GateVerdict(
            check=CHECK, gate=gate, scope=scope, verdict=verdict, value=lo if gate == "non_inferiority" else value,
            limit=limit, evidence=f"{why}; {base_line}", samples=cmp.n, samples_to_verdict=needed, metric=cmp.metric,
            comparator="non_inferior", margin=margin, confidence=cmp.confidence, fail_confidence=fail_conf,
            estimate=d, low=lo, high=hi, test=test, warnable=not few))  # too few to judge: no test to warn
    return out


def _fail_side(cmp: TaskComparison, family: FailFamily | None, lo: float,
               hi: float) -> tuple[float, float, float, str]:
    """The fail side's interval (hi: the candidate's best plausible difference) and confidence: the
    family's where it has one, else the comparison's own; and the evidence's words on it."""
    if family is None or family.low is None:
        return lo, hi, cmp.confidence, ""
    _, fail_lo, fail_hi = _oriented(cmp.diff, family.low, family.high, cmp.higher_is_better)
    return fail_lo, fail_hi, family.confidence, (f"; fail side at {family.confidence:.2%} (Bonferroni over "
                                                 f"{family.size} gated comparisons): {family.low:+.4g} .. "
                                                 f"{family.high:+.4g}")


def _shown(gate: str, value: float | None, limit: float) -> str:
    """The gate's own figure at the head of its evidence (recovery or drop; none for the others)."""
    return {"min_recovery": f"recovery {value:.3f} (needs {limit:g}); " if value is not None else
            "recovery undefined (zero baseline score); ",
            "max_drop": f"drop {value:.4g} (needs <= {limit:g}); " if value is not None else ""}.get(gate, "")


def ni_verdict(lo: float, hi: float, margin: float) -> str:
    if lo >= -margin:
        return "pass"
    if hi < -margin:
        return "fail"
    return "inconclusive"


def samples_to_verdict(b: Sequence[Value], c: Sequence[Value], verdict: str, margin_frac_abs: float,
                       cmp: TaskComparison, *, iters: int, seed: int) -> int:
    """The smallest prefix (in steps of 10, in the suite's sample order) from which the
    non-inferiority verdict stayed what it is with all samples."""
    n = len(b)
    smallest = n
    for k in range(n - PREFIX_STEP, PREFIX_STEP - 1, -PREFIX_STEP):
        ci = paired_interval(b[:k], c[:k], iters=iters, confidence=cmp.confidence, seed=seed,
                              transform=TRANSFORMS.get(cmp.metric))
        _, lo, hi = _oriented(ci.diff, ci.low, ci.high, cmp.higher_is_better)
        if ni_verdict(lo, hi, margin_frac_abs) != verdict:
            break
        smallest = k
    return smallest


MAX_SAMPLES_NEEDED = 10_000_000  # past this, "about N samples would tell" says nothing useful


def samples_needed(n: int, d: float, lo: float, hi: float, margin: float) -> int | None:
    """Rough sample count for the interval to clear the margin, if the observed
    difference and spread held (the half-width shrinks as 1/sqrt(n))."""
    half = (hi - lo) / 2
    gap = abs(d + margin)
    if gap == 0 or half == 0:
        return None
    needed = int(math.ceil(n * (half / gap) ** 2))
    # a difference on the margin up to rounding gives an absurd count (4e33 was printed): none
    return needed if needed <= MAX_SAMPLES_NEEDED else None


def skipped_verdicts(spec: QualitySpec, skipped: list[tuple[str, str] | tuple[str, str, str, str]]
                     ) -> list[GateVerdict]:
    """A gated task that could not run (a served context too short for it) is a gate
    that could not decide, named after it: it used to vanish from the decision, so a
    whole slice could go unjudged. Each entry: (task, why), or (task, why, its slice,
    its metric). A task whose own gates the recipe disables gets one too when it would
    have been pooled into a gated slice or the pooled gate (a pass/fail metric): that
    gate would otherwise judge fewer tasks than the recipe names, silently. Leaving the
    task out of quality.tasks drops it from the run."""
    out = []
    for task, why, *rest in skipped:
        slice_, metric = (rest + [None, None])[:2]
        override = spec.task_gates.get(task)
        pooled_into = _pooled_into(spec, slice_, metric)
        if override and override.disabled and not pooled_into:
            continue
        into = (f"; it is pooled into {' and '.join(pooled_into)}, which would be judged without it"
                if pooled_into else "")
        out.append(GateVerdict(check=CHECK, gate="skipped", scope=task, verdict="inconclusive", value=None, limit=0,
                               warnable=False,
                               evidence=f"not run: {why}{into}; nothing shows the candidate keeps this task. Serve a "
                               "longer context (serve.engine_args.max_model_len), or leave the task out of "
                               "quality.tasks"))
    return out


def _pooled_into(spec: QualitySpec, slice_: str | None, metric: str | None) -> list[str]:
    """The gated pools a task of this slice and metric joins (compare.pooled, pooled_all):
    its slice's and the pooled gate, for a pass/fail-type metric (not a perplexity)."""
    if slice_ is None or metric is None or metric in TRANSFORMS:
        return []
    override = spec.slice_gates.get(slice_)
    return ([f"slice:{slice_}"] if not (override and override.disabled) else []) + \
        ([POOLED_SCOPE] if spec.pooled is not None else [])


def kl_verdicts(summary: dict[str, Any], spec: QualitySpec) -> list[GateVerdict]:
    out = []
    for gate, key, limit, direction in (("max_mean_kl", "mean", spec.kl.max_mean_kl, "max"),
                                        ("min_same_top_rate", "same_top_rate", spec.kl.min_same_top_rate, "min")):
        if limit is None:
            continue
        value = summary.get(key)
        if value is None:
            out.append(GateVerdict(check=CHECK, gate=gate, scope="kl", verdict="inconclusive", value=None,
                                   limit=limit, metric=f"kl.{key}", test="threshold", warnable=False,
                                   comparator="at_most" if direction == "max" else "at_least",
                                   evidence="no positions compared: nothing measured for release.policy to let "
                                   "through (check quality.kl.texts, or unset quality.kl.max_mean_kl and "
                                   "min_same_top_rate)"))
            continue
        ok = value <= limit if direction == "max" else value >= limit
        out.append(GateVerdict(check=CHECK, gate=gate, scope="kl", verdict="pass" if ok else "fail", value=value,
                               limit=limit, metric=f"kl.{key}", estimate=value, test="threshold",
                               comparator="at_most" if direction == "max" else "at_least",
                               evidence=f"KL(baseline || candidate) {key} = {value:.4g} over "
                               f"{summary['tokens']} positions, needs {'<=' if direction == 'max' else '>='} "
                               f"{limit:g}"))
    return out
