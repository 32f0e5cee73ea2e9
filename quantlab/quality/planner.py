"""What the quality gates can tell with the data a recipe gives them, before a long run
(`quantlab run --dry-run`): per gated pass/fail task and slice, the noise floor of its
interval, whether non-inferiority can be shown at all (and about how many samples it
would take), and the smallest drop that would block. Pure: from sample counts and
stated assumptions (a baseline score, a share of answers that change between two
servers of the same model), through the same interval and family rule the gates use."""

from __future__ import annotations

from dataclasses import dataclass

from quantlab.quality.spec import QualityGates, ni_margin
from quantlab.quality.stats import paired_proportion_interval

ASSUMED_SCORE = 0.5  # the baseline's share of right answers, where nothing better is known
ASSUMED_DISCORDANCE = 0.05  # answers that differ between two servers of the same model


@dataclass(frozen=True)
class GatePlan:
    scope: str
    n: int
    half_width: float  # of the interval of an unchanged model, at the gate's confidence
    margin: float | None  # non-inferiority, absolute (margin x the baseline score, or its floor)
    can_show: bool | None  # can non-inferiority pass at all with n samples
    samples_to_show: int | None  # about how many would let it pass
    blocks_drop: float | None  # the smallest drop (share of samples) the fail side (family) catches

    def line(self) -> str:
        ni = "-" if self.margin is None else (
            f"non-inferiority (margin {self.margin:.3f}): " + ("can be shown" if self.can_show else
                                                               f"cannot be shown (needs ~{self.samples_to_show})"
                                                               if self.samples_to_show else "cannot be shown"))
        block = f"blocks drops >= {self.blocks_drop:.2f}" if self.blocks_drop is not None else \
            "blocks no drop it can see"
        return f"{self.scope:<22} n {self.n:<5} +-{self.half_width:.3f}   {ni}; {block}"


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
              discordance: float = ASSUMED_DISCORDANCE) -> GatePlan:
    unchanged = paired_proportion_interval(*_table(n, score, discordance, 0.0), confidence=gates.confidence)
    half = (unchanged.high - unchanged.low) / 2
    margin = ni_margin(gates, score)
    can_show = samples = None
    if margin is not None:
        can_show = n >= gates.min_samples and unchanged.low >= -margin
        if not can_show:
            samples = next((m for m in (int(n * 1.25 ** k) + 1 for k in range(1, 40))
                            if m >= gates.min_samples and paired_proportion_interval(
                                *_table(m, score, discordance, 0.0), confidence=gates.confidence).low >= -margin),
                           None)
    fail_confidence = 1 - (1 - gates.confidence) / max(1, family)
    limit = margin if margin is not None else 0.0
    blocks = next((drop / 100 for drop in range(1, 101) if drop / 100 <= score and paired_proportion_interval(
        *_table(n, score, discordance, drop / 100), confidence=fail_confidence).high < -limit), None)
    return GatePlan(scope, n, half, margin, can_show, samples, blocks if n >= gates.min_samples else None)
