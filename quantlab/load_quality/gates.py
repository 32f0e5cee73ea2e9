"""The load_quality gates (pure), per load point (scope: '<workload>/<point>'):
- `at_load`: the candidate's accuracy at the point against the baseline's at the point;
- `versus_c1` (load_quality.versus_c1): the candidate at the point against itself at
  concurrency 1: a batch-dependent regression that is the candidate's alone. A point at
  concurrency 1 has none (it would compare the same answers).
Each is non-inferiority at load_quality.margin (absolute accuracy) on Tango's score interval
of the paired difference (quality/stats.py) at load_quality.confidence, judged as the quality
gates judge: pass when the interval's worse end is above -margin, fail when the fail side's
interval (Bonferroni over the check's gates) is entirely below it, inconclusive otherwise.

Fail closed: a document the judged side (the candidate at load) did not answer, or whose
scorer errored, counts as wrong for it; one the reference side (the baseline, or the
candidate at c1) did not answer cannot be paired and is left out, said in the evidence. A
gate with fewer paired documents than load_quality.min_items (none at all included) has no
estimate to judge: inconclusive, and release.policy cannot warn it through.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quantlab.core.roles import BASELINE, CANDIDATE
from quantlab.core.verdicts import GateVerdict
from quantlab.quality.batch_floor import FlipRate
from quantlab.quality.gates import ni_verdict, samples_needed
from quantlab.quality.stats import mcnemar_exact, tango_bounds
from quantlab.recipe.load_quality import LoadQualitySpec

CHECK = "load_quality"
AT_LOAD = "at_load"
VERSUS_C1 = "versus_c1"
METRIC = "accuracy"

DocKey = tuple[str, Any]  # (task, doc id)
# a document's answer: True right, False wrong, None answered but not scored (its scorer
# errored, or its value is not pass/fail); a document missing from the map was not answered
Answers = dict[DocKey, bool | None]


@dataclass(frozen=True)
class PointAnswers:
    """Both roles' answers at one point and at concurrency 1, over the slice's documents."""

    point: str  # '<workload>/<point>': the gates' scope
    docs: tuple[DocKey, ...]  # the slice: every document sent to each role at each level
    load: dict[str, Answers]  # role -> its answers at the point
    c1: dict[str, Answers] = field(default_factory=dict)  # role -> its answers at concurrency 1
    concurrency: int | None = None
    rate: float | None = None


@dataclass(frozen=True)
class Pairing:
    """One gate's paired documents: the judged side against the reference side."""

    n: int  # documents paired (the reference answered them)
    both: int
    judged_only: int  # right for the judged side only (the candidate at load)
    reference_only: int  # right for the reference side only
    unanswered: int  # paired documents the judged side did not answer (counted wrong)
    unscored: int  # paired documents whose judged answer was not scored (counted wrong)
    reference_missing: int  # documents the reference did not answer or score: left out

    @property
    def judged(self) -> float:
        return (self.both + self.judged_only) / self.n

    @property
    def reference(self) -> float:
        return (self.both + self.reference_only) / self.n


def pair(docs: tuple[DocKey, ...], judged: Answers, reference: Answers) -> Pairing:
    """The documents the reference scored, the judged side's missing or unscored answers wrong."""
    both = judged_only = reference_only = unanswered = unscored = missing = n = 0
    for doc in docs:
        ref = reference.get(doc)
        if ref is None:
            missing += 1
            continue
        n += 1
        got = judged.get(doc)
        unanswered += doc not in judged
        unscored += doc in judged and got is None
        right = got is True
        both += right and ref
        judged_only += right and not ref
        reference_only += ref and not right
    return Pairing(n, both, judged_only, reference_only, unanswered, unscored, missing)


def verdicts(spec: LoadQualitySpec, points: list[PointAnswers]) -> list[GateVerdict]:
    """Every load_quality gate at every point. The fail side is adjusted over all of them
    (a block needs one gate to fail), the pass side is each gate's own (a release needs all)."""
    planned = [(p, gate) for p in points for gate in gates_of(spec, p)]
    fail_confidence = 1 - (1 - spec.confidence) / max(1, len(planned))
    out = []
    for p, gate in planned:
        judged = p.load.get(CANDIDATE, {})
        reference = p.load.get(BASELINE, {}) if gate == AT_LOAD else p.c1.get(CANDIDATE, {})
        out.append(judge(spec, gate, p.point, pair(p.docs, judged, reference), fail_confidence,
                         family=len(planned)))
    return out


def gates_of(spec: LoadQualitySpec, p: PointAnswers) -> list[str]:
    return [AT_LOAD] + ([VERSUS_C1] if spec.versus_c1 and p.concurrency != 1 else [])


REFERENCE = {AT_LOAD: ("the baseline at load", "the baseline"),
             VERSUS_C1: ("the candidate at concurrency 1", "the candidate at c1")}


def judge(spec: LoadQualitySpec, gate: str, scope: str, pairs: Pairing, fail_confidence: float, *,
          family: int) -> GateVerdict:
    """One gate on its paired documents."""
    ref_words, ref_name = REFERENCE[gate]
    margin = spec.margin
    fields: dict[str, Any] = {"check": CHECK, "gate": gate, "scope": scope, "limit": -margin, "metric": METRIC,
                              "comparator": "non_inferior", "margin": margin, "confidence": spec.confidence,
                              "fail_confidence": fail_confidence, "test": "tango-score", "samples": pairs.n}
    counted = _counted(pairs, ref_words)
    if pairs.n < spec.min_items:
        why = ("no document answered by both sides" if pairs.n == 0 else
               f"only {pairs.n} paired documents, fewer than load_quality.min_items {spec.min_items}")
        return GateVerdict(verdict="inconclusive", value=None, warnable=False, **fields,
                           evidence=f"{why}: not judged, so release.policy cannot warn it through (raise "
                           f"load_quality.items, or see why documents went unanswered){counted}")
    lo, hi = tango_bounds(pairs.judged_only, pairs.reference_only, pairs.n, spec.confidence)
    fail_lo, fail_hi = tango_bounds(pairs.judged_only, pairs.reference_only, pairs.n, fail_confidence)
    d = pairs.judged - pairs.reference
    verdict = ni_verdict(lo, hi, margin)
    downgraded = verdict == "fail" and fail_hi >= -margin
    if downgraded:
        verdict = "inconclusive"
    needed = samples_needed(pairs.n, d, *((fail_lo, fail_hi) if downgraded else (lo, hi)), margin) \
        if verdict == "inconclusive" else None
    pct = f"{spec.confidence:.0%}"
    why = {"pass": f"the interval's worse end {lo:+.4f} is above -{margin:g}",
           "fail": f"the whole interval is below -{margin:g}, the fail side's too: worse than the margin allows",
           "inconclusive": (f"the whole {pct} interval is below -{margin:g}, but not the fail side's" if downgraded
                            else f"the interval {lo:+.4f} .. {hi:+.4f} straddles -{margin:g}")
           + (f"; about {needed} paired documents would tell" if needed else "")}[verdict]
    base = (f"accuracy: candidate at load {pairs.judged:.4f}, {ref_words} {pairs.reference:.4f} over {pairs.n} "
            f"paired documents; difference {d:+.4f} ({pct} CI {lo:+.4f} .. {hi:+.4f}); fail side at "
            f"{fail_confidence:.2%} (Bonferroni over {family} gates): {fail_lo:+.4f} .. {fail_hi:+.4f}; flips: "
            f"{pairs.reference_only} right only for {ref_name}, {pairs.judged_only} only for the candidate at load "
            f"(McNemar p {mcnemar_exact(pairs.reference_only, pairs.judged_only):.3g})")
    return GateVerdict(verdict=verdict, value=lo, samples_to_verdict=needed, estimate=d, low=lo, high=hi,
                       evidence=f"{why}; {base}{counted}", **fields)


def _counted(pairs: Pairing, ref_words: str) -> str:
    """The evidence's words on documents not answered, not scored, or left unpaired."""
    parts = []
    if pairs.unanswered:
        parts.append(f"{pairs.unanswered} the candidate did not answer at load, counted wrong")
    if pairs.unscored:
        parts.append(f"{pairs.unscored} whose answer the scorer could not score, counted wrong")
    if pairs.reference_missing:
        parts.append(f"{pairs.reference_missing} left out: {ref_words} did not answer or score them")
    return f"; documents: {'; '.join(parts)}" if parts else ""


def flip_rate(c1: Answers, load: Answers, confidence: float = 0.95) -> FlipRate:
    """The same role's flips between concurrency 1 and the point: documents scored at both
    (True or False) whose pass/fail differs, with the rate's Clopper-Pearson interval."""
    shared = [doc for doc, right in c1.items() if right is not None and load.get(doc) is not None]
    k = sum(1 for doc in shared if c1[doc] != load[doc])
    return FlipRate.of(k, len(shared), confidence)


@dataclass(frozen=True)
class LevelCounts:
    """One role's answers at one level over the slice: right, wrong, not scored, not answered."""

    documents: int
    correct: int
    answered: int
    unscored: int

    @property
    def accuracy(self) -> float | None:
        """Right answers over the slice's documents (not answered or not scored: not right)."""
        return self.correct / self.documents if self.documents else None


def level_counts(docs: tuple[DocKey, ...], answers: Answers) -> LevelCounts:
    return LevelCounts(documents=len(docs), correct=sum(1 for d in docs if answers.get(d) is True),
                       answered=sum(1 for d in docs if d in answers),
                       unscored=sum(1 for d in docs if d in answers and answers[d] is None))
