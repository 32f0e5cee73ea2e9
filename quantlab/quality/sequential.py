"""Evaluate until decided (`quality.samples: auto`), the pure part: how each task's
sample grows from look to look, the confidence each look is judged at, and which tasks
are decided.

The design: a group-sequential test whose error is spent over the looks planned for a
task. A task with N samples available is looked at after `first`, `first x growth`, ...
samples and finally after all N: K looks. The look at n samples (information t = n / N)
judges the task's gates at confidence 1 - a_k, a_k = A(t_k) - A(t_(k-1)) with the
O'Brien-Fleming-like spending function of Lan and DeMets, A(t) = 2 - 2 Phi(z_(1-a/2) /
sqrt(t)): early looks spend almost nothing (only a clear case stops there), the last
look nearly all of a = 1 - c, so the full sample keeps nearly its fixed-size power
(Bonferroni's a / K at every look cost the last look most of it). The a_k add up to a,
so the chance that any look gets a pass or a fail wrong is at most 1 - c whatever look
it stops at (a union bound over the looks: conservative, and valid for any stopping
rule). Slices and the pooled gate, whose members stop at different looks, keep the
Bonferroni split over the most looks of a member task. A task stops at the first look
where none of its gates, nor its slice's, is inconclusive, or when its data runs out."""

from __future__ import annotations

from collections.abc import Iterable

from quantlab.core.verdicts import GateVerdict


def schedule(available: int, first: int, growth: float) -> list[int]:
    """Cumulative sample counts at each look: first, first x growth, ..., available."""
    if available <= first:
        return [available]
    sizes, n = [], float(first)
    while int(n) < available:
        sizes.append(int(n))
        n *= growth
    return sizes + [available]


def look_confidence(confidence: float, looks: int) -> float:
    """Bonferroni: the confidence every look is judged at, so all looks together keep
    `confidence` (slices and the pooled gate)."""
    return 1 - (1 - confidence) / max(1, looks)


def spent(alpha: float, t: float) -> float:
    """Lan-DeMets O'Brien-Fleming-like spending: the two-sided alpha spent by information t."""
    from scipy.stats import norm

    if t <= 0:
        return 0.0
    return float(min(alpha, 2 - 2 * norm.cdf(norm.ppf(1 - alpha / 2) / t ** 0.5)))


def spent_confidence(confidence: float, plan: list[int], n: int) -> float:
    """The confidence of a task's look at n samples of its plan: 1 - what that look spends."""
    alpha = 1 - confidence
    if len(plan) <= 1:
        return confidence
    k = next((i for i, size in enumerate(plan) if size >= n), len(plan) - 1)
    now, before = plan[k] / plan[-1], (plan[k - 1] / plan[-1] if k else 0.0)
    return 1 - max(1e-12, spent(alpha, now) - spent(alpha, before))


def undecided_tasks(verdicts: Iterable[GateVerdict], slice_of: dict[str, str]) -> set[str]:
    """Tasks with a gate still inconclusive, on the task itself or on its slice."""
    open_scopes = {v.scope for v in verdicts if v.check == "quality" and v.verdict == "inconclusive"}
    open_slices = {s.removeprefix("slice:") for s in open_scopes if s.startswith("slice:")}
    return {task for task, slice_ in slice_of.items() if task in open_scopes or slice_ in open_slices}
