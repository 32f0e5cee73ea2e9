"""Choosing one checkpoint among candidates (pure): each candidate's decision and cost
figures in, the chosen one and the reasons out.

Only candidates whose decision is `release` can be chosen. Among them the recipe's rule
picks (SelectionSpec); a candidate missing the rule's figure is ranked after those that
have it, and said so. When none is released, the closest is named with the gates that
stopped it: the fewest failed gates, then the fewest not shown, then the rule's figure."""

from __future__ import annotations

from quantlab.recipe.selection import SelectionSpec
from quantlab.reports.comparison_records import CandidateSummary, Choice

# rule -> (summary figure, lower is better)
FIGURES = {
    "cost_per_success": ("cost_per_successful_request", True),
    "least_memory": ("peak_memory_bytes", True),
    "highest_throughput": ("output_tokens_per_s", False),
    # cost_per_success without a price: successful answers per second at the SLO orders the
    # candidates as cost per success would at any one price (cost = price / goodput)
    "goodput_at_slo": ("goodput_at_slo", False),
}
NO_PRICE = ("no performance.price_per_hour, so ranked by successful answers per second at the SLO (the order "
            "cost per success gives at any one price)")
WEIGHTED = {"cost_per_success": ("cost_per_successful_request", True), "memory": ("peak_memory_bytes", True),
            "throughput": ("output_tokens_per_s", False), "quality": ("worst_slice_recovery", False)}


def choose(candidates: list[CandidateSummary], spec: SelectionSpec) -> Choice:
    if not candidates:
        raise ValueError("no candidate to choose from")
    released = [c for c in candidates if c.decision == "release"]
    lost = {c.name: _not_released(c) for c in candidates if c.decision != "release"}
    if not released:
        closest = min(candidates, key=lambda c: (len(c.failed_gates), len(c.not_shown_gates),
                                                 _sort_value(c, _effective_rule(candidates, spec))))
        return Choice(None, f"no candidate released; the closest is {closest.name}: {lost[closest.name]}", [],
                      closest=closest.name, lost=lost)
    rule = _effective_rule(released, spec)
    ranked = sorted(released, key=lambda c: _sort_value(c, rule) if rule != "weighted" else
                    -_weighted(c, released, spec))
    best = ranked[0]
    for c in ranked[1:]:
        lost[c.name] = f"released, but {_compare(c, best, rule)}"
    why = f"chose {best.name}: {_reason(best, ranked, rule)}" + (f"; {NO_PRICE}" if rule != spec.rule else "")
    return Choice(best.name, why, [c.name for c in ranked], lost=lost)


def _effective_rule(released: list[CandidateSummary], spec: SelectionSpec) -> str:
    if spec.rule == "cost_per_success" and all(c.cost_per_successful_request is None for c in released) \
            and any(c.goodput_at_slo is not None for c in released):
        return "goodput_at_slo"
    return spec.rule


def _sort_value(c: CandidateSummary, rule: str) -> tuple[int, float]:
    """(missing?, value oriented so that lower sorts first)."""
    name, lower_better = FIGURES.get(rule, FIGURES["cost_per_success"])
    v = getattr(c, name)
    if v is None:
        return (1, 0.0)
    return (0, v if lower_better else -v)


def _weighted(c: CandidateSummary, pool: list[CandidateSummary], spec: SelectionSpec) -> float:
    """Sum of weight x figure normalised to the best candidate's (1 = the best; a
    missing figure scores 0)."""
    score = 0.0
    for figure, weight in spec.weights.items():
        name, lower_better = WEIGHTED[figure]
        values = [getattr(x, name) for x in pool if getattr(x, name) is not None]
        v = getattr(c, name)
        if v is None or not values:
            continue
        best = min(values) if lower_better else max(values)
        score += weight * ((best / v) if lower_better else (v / best)) if v and best else 0.0
    return score


def _figure_text(c: CandidateSummary, rule: str) -> str:
    if rule == "weighted":
        return "weighted score"
    name, _ = FIGURES[rule]
    v = getattr(c, name)
    unit = {"cost_per_successful_request": "per successful answer", "peak_memory_bytes": "bytes peak memory",
            "output_tokens_per_s": "output tokens/s", "goodput_at_slo": "successful answers/s at the SLO"}[name]
    return f"{v:.4g} {unit}" if v is not None else f"no {unit} figure"


def _reason(best: CandidateSummary, ranked: list[CandidateSummary], rule: str) -> str:
    others = f" (next: {ranked[1].name}, {_figure_text(ranked[1], rule)})" if len(ranked) > 1 else ""
    return f"released by every required gate, {rule} {_figure_text(best, rule)}{others}"


def _compare(c: CandidateSummary, best: CandidateSummary, rule: str) -> str:
    return f"{rule}: {_figure_text(c, rule)} against {best.name}'s {_figure_text(best, rule)}"


def _not_released(c: CandidateSummary) -> str:
    if c.failed_gates:
        return f"blocked by {', '.join(c.failed_gates[:3])}" + (f" and {len(c.failed_gates) - 3} more"
                                                                if len(c.failed_gates) > 3 else "")
    if c.not_shown_gates:
        return f"not shown: {', '.join(c.not_shown_gates[:3])}" + (f" and {len(c.not_shown_gates) - 3} more"
                                                                   if len(c.not_shown_gates) > 3 else "")
    return f"decision {c.decision}"
