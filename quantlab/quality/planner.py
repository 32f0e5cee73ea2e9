"""What the quality gates can tell with the data a recipe gives them, before a long run
(`quantlab run --dry-run`, and the quality preflight when release.policy.underpowered is
`error`): per gated pass/fail comparison (a task or a pooled slice) its distinct items,
the noise floor of its interval, P(release | unchanged) and P(not released | a drop of
twice the margin) at a stated discordance, the smallest drop its fail side blocks 80% of
the time, and the items 80% power to release an unchanged model would need.

Pure, and exact: the gates' score test depends on the pairs only through the two
discordant counts, so each probability is a sum over every (candidate-only,
baseline-only) count of n pairs (quality/stats.ni_pass_probability), the same test the
gates run, at the same confidences (the fail side's adjusted for the family).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from quantlab.recipe.quality import QualityGates, ni_margin
from quantlab.quality.stats import ni_fail_probability, ni_pass_probability, paired_proportion_interval

ASSUMED_SCORE = 0.5  # the baseline's share of right answers, where nothing better is known
ASSUMED_DISCORDANCE = 0.05  # answers that differ between two servers of the same model
POWER = 0.8  # what "can decide" means here: 80% of the time
MAX_PLANNED_ITEMS = 1_000_000


@dataclass(frozen=True)
class GatePlan:
    scope: str
    n: int
    half_width: float  # of the interval of an unchanged model, at the gate's confidence
    margin: float | None  # non-inferiority, absolute (margin x the baseline score, or its floor)
    p_release_unchanged: float | None  # this comparison passes, the candidate unchanged
    p_held_2x: float | None  # not passed, the candidate worse by 2 x margin
    samples_to_show: int | None  # items for P(release | unchanged) >= POWER, when n has fewer
    blocks_drop: float | None  # the smallest drop (share of items) the fail side blocks >= POWER
    required: bool = True  # not warned by release.policy

    @property
    def can_show(self) -> bool | None:
        """Whether an unchanged model passes this comparison at least POWER of the time."""
        return None if self.p_release_unchanged is None else self.p_release_unchanged >= POWER

    @property
    def underpowered(self) -> bool:
        return bool(self.required and self.margin is not None and not self.can_show)

    def line(self) -> str:
        if self.margin is None:
            ni = "no non-inferiority gate"
        else:
            ni = (f"non-inferiority (margin {self.margin:.3f}): P(release | unchanged) {self.p_release_unchanged:.0%}, "
                  f"P(not released | 2x margin) {self.p_held_2x:.0%}")
            if not self.can_show:
                ni += (f"; cannot decide (needs ~{self.samples_to_show} items)" if self.samples_to_show
                       else "; cannot decide at any size")
        block = f"blocks drops >= {self.blocks_drop:.2f}" if self.blocks_drop is not None else \
            "blocks no drop it can see"
        warned = "" if self.required else " (warned by release.policy)"
        return f"{self.scope:<22} n {self.n:<5} +-{self.half_width:.3f}   {ni}; {block}{warned}"


def _table(n: int, score: float, discordance: float, drop: float) -> tuple[list[float], list[float]]:
    """Expected paired outcomes: a share `discordance` of pairs disagree both ways alike,
    then `drop` of all samples turn from right (both) to right for the baseline only."""
    base_only = round(n * (discordance / 2 + drop))
    cand_only = round(n * discordance / 2)
    both = max(0, round(n * score) - base_only)
    neither = max(0, n - both - base_only - cand_only)
    base = [1.0] * both + [1.0] * base_only + [0.0] * cand_only + [0.0] * neither
    cand = [1.0] * both + [0.0] * base_only + [1.0] * cand_only + [0.0] * neither
    return base, cand


def plan_gate(scope: str, n: int, gates: QualityGates, family: int, *, score: float = ASSUMED_SCORE,
              discordance: float = ASSUMED_DISCORDANCE, required: bool = True,
              looks: Callable[[int], list[int]] | None = None) -> GatePlan:
    """One comparison's plan: unchanged means `discordance` of the pairs flip, half each
    way; a drop moves that share of right answers to the baseline's side only.
    `looks` (`samples: auto` on a task: the looks at n items, quality/samples.look_rule): the
    chances are those of the looks, each at its boundary
    level, stopping at the first pass or fail (sequential_ni_probability), not of one
    look at all n items."""
    if looks is not None and len(looks(n)) > 1 and n >= gates.min_samples and ni_margin(gates, score) is not None:
        return _plan_looks(scope, n, gates, family, score=score, discordance=discordance, required=required,
                           looks=looks)
    half_d = discordance / 2
    unchanged = paired_proportion_interval(*_table(max(n, 1), score, discordance, 0.0), confidence=gates.confidence)
    half = (unchanged.high - unchanged.low) / 2
    margin = ni_margin(gates, score)
    fail_confidence = 1 - (1 - gates.confidence) / max(1, family)
    enough = n >= gates.min_samples
    p_release = p_held = needed = None
    if margin is not None:
        p_release = ni_pass_probability(n, margin, half_d, half_d, gates.confidence) if enough else 0.0
        p_held = 1 - ni_pass_probability(n, margin, half_d, half_d + 2 * margin, gates.confidence) if enough else 1.0
        if p_release < POWER:
            needed = items_to_show(margin, discordance, gates.confidence, at_least=max(n + 1, gates.min_samples))
    limit = margin or 0.0
    blocks = None
    if enough:
        blocks = _smallest(lambda drop: ni_fail_probability(n, limit, half_d, half_d + drop, fail_confidence) >= POWER,
                           top=min(score, 1 - discordance))
    return GatePlan(scope, n, half, margin, p_release, p_held, needed, blocks, required)


def _plan_looks(scope: str, n: int, gates: QualityGates, family: int, *, score: float, discordance: float,
                required: bool, looks: Callable[[int], list[int]]) -> GatePlan:
    """plan_gate under evaluate-until-decided: every chance over the looks. The items to
    show are looked for with the looks those items would get."""
    from quantlab.quality.sequential import sequential_ni_probability

    sizes = looks(n)
    half_d = discordance / 2
    unchanged = paired_proportion_interval(*_table(n, score, discordance, 0.0), confidence=gates.confidence)
    margin = ni_margin(gates, score)
    assert margin is not None
    fail_confidence = 1 - (1 - gates.confidence) / max(1, family)

    def chances(size_looks: list[int], drop: float) -> tuple[float, float]:
        return sequential_ni_probability(size_looks, margin, half_d, half_d + drop, gates.confidence,
                                         fail_confidence)

    p_release = chances(sizes, 0.0)[0]
    p_held = 1 - chances(sizes, 2 * margin)[0]
    needed = None
    if p_release < POWER:  # looked for up to 20x the items (each try is an exact sum over the looks)
        size = max(n + 1, gates.min_samples)
        while size <= min(MAX_PLANNED_ITEMS, 20 * n + 1000):
            if chances(looks(size), 0.0)[0] >= POWER:
                needed = size
                break
            size = max(size + 1, int(size * 1.25))
    blocks = _smallest(lambda drop: chances(sizes, drop)[1] >= POWER, top=min(score, 1 - discordance))
    return GatePlan(scope, n, (unchanged.high - unchanged.low) / 2, margin, p_release, p_held, needed, blocks,
                    required)


def _smallest(holds, *, top: float) -> float | None:
    """The smallest drop (in whole points, up to `top`) where `holds` (monotone in the drop)."""
    lo, hi = 1, int(top * 100)
    if hi < 1 or not holds(hi / 100):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid / 100):
            hi = mid
        else:
            lo = mid + 1
    return lo / 100


def items_to_show(margin: float, discordance: float, confidence: float, *, at_least: int) -> int | None:
    """The fewest items (never fewer than `at_least`) at which an unchanged model passes
    non-inferiority at `margin` with probability POWER: a normal-approximation start,
    then exact steps up from there."""
    if margin <= 0:
        return None
    from scipy.stats import norm

    z_a, z_b = norm.ppf(1 - (1 - confidence) / 2), norm.ppf(POWER)
    sd0 = math.sqrt(discordance + margin - margin * margin)  # the score test's spread at -margin
    guess = max(at_least, int(((z_a * sd0 + z_b * math.sqrt(discordance)) / margin) ** 2 * 0.8))
    n = guess
    while n <= MAX_PLANNED_ITEMS:
        if ni_pass_probability(n, margin, discordance / 2, discordance / 2, confidence) >= POWER:
            return n
        n = max(n + 1, int(n * 1.1))
    return None
