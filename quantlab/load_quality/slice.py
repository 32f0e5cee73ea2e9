"""The slice of the quality suites the load_quality check sends (pure): how many documents
each task gives (stratified by task, in proportion to the documents it has) and how many in
all (the planner's size for the section's margin and confidence).

Each task gives its first k documents, so every run, role and load asks the same ones and
the answers pair document by document.
"""

from __future__ import annotations

from quantlab.quality.planner import POWER, items_to_show
from quantlab.quality.samples import Docs
from quantlab.quality.stats import ni_pass_probability
from quantlab.recipe.load_quality import LoadQualitySpec


def allocate(task_sizes: dict[str, int], total: int) -> dict[str, int]:
    """`total` documents shared among the tasks in proportion to the documents each has
    (largest remainders), each task at least 1 when `total` allows, never more than it
    has; every task when `total` covers them all. Deterministic: ties go to the larger
    task, then the name."""
    if total < 0 or any(size < 0 for size in task_sizes.values()):
        raise ValueError(f"counts must not be negative; got total {total}, sizes {task_sizes}")
    if total >= sum(task_sizes.values()):
        return dict(task_sizes)
    live = sorted(t for t, size in task_sizes.items() if size > 0)
    fixed: dict[str, int] = {}
    if total >= len(live):  # a task whose share rounds below one gets one, the rest shared anew
        while True:
            rest = [t for t in live if t not in fixed]
            left, weight = total - len(fixed), sum(task_sizes[t] for t in rest)
            small = [t for t in rest if left * task_sizes[t] < weight]
            if not small:
                break
            fixed.update(dict.fromkeys(small, 1))
    rest = {t: task_sizes[t] for t in live if t not in fixed}
    out = dict.fromkeys(task_sizes, 0) | fixed
    out.update(largest_remainders(rest, total - len(fixed)))
    return out


def largest_remainders(sizes: dict[str, int], total: int) -> dict[str, int]:
    """Hamilton's method in exact integers: each gets the floor of its quota total x size /
    sum, then the largest remainders one more each (ties: the larger size, then the name)."""
    weight = sum(sizes.values())
    if not sizes or weight == 0:
        return dict.fromkeys(sizes, 0)
    out = {t: total * s // weight for t, s in sizes.items()}
    order = sorted(sizes, key=lambda t: (-(total * sizes[t] % weight), -sizes[t], t))
    for t in order[:total - sum(out.values())]:
        out[t] += 1
    return out


def slice_docs(counts: dict[str, int]) -> dict[str, Docs]:
    """Each task's first `k` documents, in the form lm-eval is given them (tasks at 0 left out)."""
    return {task: Docs(0, k) for task, k in counts.items() if k > 0}


def planned_items(spec: LoadQualitySpec, discordance: float, *, available: int | None = None
                  ) -> tuple[int, str]:
    """The documents a point is judged on, and a sentence on what that can detect. `auto`:
    the fewest at which an unchanged candidate (`discordance` of its pairs flipping, half
    each way) passes non-inferiority at the margin POWER of the time, at least min_items
    and at most max_items; a number: as given. `available`: the documents the tasks have
    (fewer cap the plan)."""
    half = discordance / 2
    needed = items_to_show(spec.margin, discordance, spec.confidence, at_least=spec.min_items)
    if spec.items == "auto":
        n, why = (needed, "auto") if needed is not None and needed <= spec.max_items else \
            (spec.max_items, "auto, capped by load_quality.max_items")
    else:
        n, why = spec.items, "load_quality.items"
    if available is not None and available < n:
        n, why = available, f"{why}; every document the tasks have"
    p_pass = ni_pass_probability(n, spec.margin, half, half, spec.confidence) if n else 0.0
    p_held = 1 - ni_pass_probability(n, spec.margin, half, half + 2 * spec.margin, spec.confidence) if n else 1.0
    line = (f"{n} paired documents a point ({why}): at a discordance of {discordance:.1%} an unchanged candidate "
            f"passes non-inferiority at margin {spec.margin:g} with probability {p_pass:.0%}, and one worse by "
            f"{2 * spec.margin:g} is not released with probability {p_held:.0%}")
    if p_pass < POWER:
        line += (f"; short of {POWER:.0%}: about {needed} documents would show it" if needed else
                 f"; short of {POWER:.0%} at any size")
    return n, line
