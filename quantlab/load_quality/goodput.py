"""Correct-answer goodput (pure): per load point and role, the documents per second that
were both right and within every SLO, with its interval, and the cost per such answer.

The unit is a document, not a request: a multiple-choice item is one loglikelihood request
per choice, and it is answered within the SLOs only when every one of its requests
succeeded and met them (performance/metrics.meets_slo; a loglikelihood request streams no
tokens after its first, so it has no TPOT and the TPOT limit does not apply to it).

The interval: the count's Clopper-Pearson bounds over the n documents sent, scaled by n /
wall_s (the wall time taken as measured, not estimated).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from quantlab.performance.metrics import meets_slo
from quantlab.quality.batch_floor import clopper_pearson


@dataclass(frozen=True)
class Goodput:
    """One role at one point, counted in documents."""

    documents: int  # sent: the denominator of every share below
    answered: int  # with an answer (scored or not)
    correct: int
    within_slo: int  # every request ok and within every SLO
    correct_within_slo: int
    wall_s: float
    rate: float  # correct_within_slo / wall_s: correct answers within the SLOs per second
    low: float  # the rate's interval at `confidence`
    high: float
    confidence: float
    cost_per_correct_answer: float | None  # price_per_hour / 3600 / rate; None without a price or at rate 0
    cost_low: float | None  # the cost's interval (from the rate's high and low ends)
    cost_high: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def document_within_slo(records: list[Any], slo: dict[str, float | None]) -> bool:
    """Every request of the document succeeded and met every SLO; a document with no
    timed request is not shown to be within them."""
    return bool(records) and all(meets_slo(r, slo) for r in records)


def correct_goodput(docs_correct: dict[Any, bool | None], doc_records: dict[Any, list[Any]],
                    slo: dict[str, float | None], wall_s: float, price_per_hour: float | None, *,
                    documents: int | None = None, confidence: float = 0.95) -> Goodput:
    """`docs_correct`: each answered document's pass/fail (None: answered, not scored);
    `doc_records`: each document's timed requests (anything with `outcome`, `ttft`, `e2e` and
    `tpot` as performance/metrics.RequestRecord has them); `slo`: performance.slo as a dict (ttft_ms,
    tpot_ms, e2e_ms); `wall_s`: the evaluation's wall time at the point; `documents`: the
    documents sent (default: those either map names; pass the slice's size so that a
    document never answered counts)."""
    if not wall_s > 0:
        raise ValueError(f"wall_s must be positive; got {wall_s}")
    keys = set(docs_correct) | set(doc_records)
    n = len(keys) if documents is None else documents
    if n < len(keys):
        raise ValueError(f"documents ({n}) is fewer than the {len(keys)} documents answered or timed")
    within = {k for k in keys if document_within_slo(doc_records.get(k, []), slo)}
    correct = {k for k, right in docs_correct.items() if right is True}
    good = len(correct & within)
    low, high = clopper_pearson(good, n, confidence) if n else (0.0, 0.0)
    rate, low_rate, high_rate = good / wall_s, low * n / wall_s, high * n / wall_s
    return Goodput(documents=n, answered=len(docs_correct),
                   correct=len(correct), within_slo=len(within), correct_within_slo=good, wall_s=wall_s,
                   rate=rate, low=low_rate, high=high_rate, confidence=confidence,
                   cost_per_correct_answer=_cost(price_per_hour, rate), cost_low=_cost(price_per_hour, high_rate),
                   cost_high=_cost(price_per_hour, low_rate))


def _cost(price_per_hour: float | None, rate: float) -> float | None:
    return None if price_per_hour is None or rate <= 0 else price_per_hour / 3600.0 / rate
