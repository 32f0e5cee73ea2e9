"""Evaluate until decided (`quality.samples: auto`), the pure part: how each task's
sample grows from look to look, the confidence each look is judged at, and which tasks
are decided.

The design: a group-sequential test with a Bonferroni split of the error over the
looks planned for a task. A task with N samples available is looked at after `first`,
`first x growth`, ... samples and finally after all N: K looks. Every look judges the
task's (and its slice's) gates at confidence 1 - (1 - c) / K, so the chance that any
look of the task gets a pass or a fail wrong is at most 1 - c, whatever look it stops
at (a union bound over the looks: conservative, simple, and valid for any stopping
rule). A task stops at the first look where none of its gates, nor its slice's, is
inconclusive, or when its data runs out."""

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
    """The confidence every look is judged at, so all looks together keep `confidence`."""
    return 1 - (1 - confidence) / max(1, looks)


def undecided_tasks(verdicts: Iterable[GateVerdict], slice_of: dict[str, str]) -> set[str]:
    """Tasks with a gate still inconclusive, on the task itself or on its slice."""
    open_scopes = {v.scope for v in verdicts if v.stage == "quality" and v.verdict == "inconclusive"}
    open_slices = {s.removeprefix("slice:") for s in open_scopes if s.startswith("slice:")}
    return {task for task, slice_ in slice_of.items() if task in open_scopes or slice_ in open_slices}
