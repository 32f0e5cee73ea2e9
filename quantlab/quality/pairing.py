"""Each task's candidate samples paired with the baseline's, compared (intervals, McNemar,
flips), and pooled per slice and over every gated item."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantlab.core.errors import CheckError
from quantlab.quality.suites import Suite
from quantlab.quality import gates as quality_gates
from quantlab.quality.compare import compare_task, paired_values, pooled
from quantlab.recipe.quality import QualitySpec


def compare_tasks(spec: QualitySpec, work: list[tuple[Suite, Any]], base_dir: Path, cand_dir: Path, *,
                   plans: dict[str, list[int]] | None = None
                   ) -> tuple[list[quality_gates.Paired], list[dict[str, Any]], str | None]:
    """Each task's samples joined and compared: (comparison, baseline values, candidate
    values) per task, every flip, and the lm-eval version that wrote them. With `plans`
    (evaluate until decided: each task's look schedule) the candidate answered a prefix:
    the baseline is cut to the same samples and the interval judged at this look's
    nominal level of the group-sequential boundary (quality/sequential.boundary_confidence)."""
    from quantlab.quality.lmeval import read_samples
    from quantlab.quality.sequential import boundary_confidence

    tasks, flips, lm_eval_version = [], [], None
    for suite, task in work:
        b_rows, b_sum = read_samples(base_dir, task.task)
        c_rows, c_sum = read_samples(cand_dir, task.task)
        confidence = quality_gates.task_gates(spec, task.task, task.slice).confidence
        if plans:
            answered = {r["doc_id"] for r in c_rows}
            b_rows = [r for r in b_rows if r["doc_id"] in answered]
            # the look the evidence reached: the items both roles answered (the fail side counts pairs too)
            paired = len(answered & {r["doc_id"] for r in b_rows})
            confidence = boundary_confidence(confidence, plans.get(task.task, [paired]), paired)
        lm_eval_version = c_sum.get("lm_eval")
        hib = _direction(task, suite, c_sum)
        cmp, task_flips = compare_task(task.task, task.slice, task.metric, task.filter, hib, b_rows, c_rows,
                                       confidence=confidence, iters=spec.bootstrap_iters, seed=spec.seed)
        flips += task_flips
        _, bv, cv = paired_values(task.task, task.metric, task.filter, b_rows, c_rows)
        tasks.append((cmp, bv, cv))
    return tasks, flips, lm_eval_version


def _direction(task: Any, suite: Suite, summary: dict[str, Any]) -> bool:
    """The metric's direction as the suite knew it at preflight; lm-eval's own word must agree."""
    known = suite.directions.get(task.task)
    said = (summary.get("higher_is_better") or {}).get(task.metric)
    if known is not None and said is not None and bool(said) != known:
        raise CheckError(f"task '{task.task}': lm-eval says '{task.metric}' is "
                         f"{'higher' if said else 'lower'}-is-better, the suite said the opposite at preflight; "
                         "fix the task's higher_is_better")
    if known is None and said is None:
        raise CheckError(f"task '{task.task}': the direction of '{task.metric}' is not known (neither the suite "
                         "nor lm-eval says): set higher_is_better on the task")
    return known if known is not None else bool(said)


def pool_everything(spec: QualitySpec, tasks: list[quality_gates.Paired], *, looks: dict[str, int] | None = None
                     ) -> quality_gates.Paired | None:
    """Every gated pass/fail item pooled (quality.pooled), at the confidence of the
    most-looked-at task when evaluating until decided."""
    from quantlab.quality.compare import pooled_all
    from quantlab.quality.sequential import look_confidence

    if spec.pooled is None:
        return None
    most = max([(looks or {}).get(cmp.task, 1) for cmp, _, _ in tasks] or [1])
    return pooled_all([cmp for cmp, _, _ in tasks], {cmp.task: (bv, cv) for cmp, bv, cv in tasks},
                      confidence=look_confidence(spec.pooled.confidence, most), iters=spec.bootstrap_iters,
                      seed=spec.seed)


def pool_slices(spec: QualitySpec, tasks: list[quality_gates.Paired], *, looks: dict[str, int] | None = None
                 ) -> list[quality_gates.Paired]:
    """Each slice's pass/fail tasks pooled into one paired comparison (judged, when
    evaluating until decided, at the confidence of its most-looked-at task)."""
    from quantlab.quality.sequential import look_confidence

    comparisons = [cmp for cmp, _, _ in tasks]
    values = {cmp.task: (bv, cv) for cmp, bv, cv in tasks}
    out = []
    for name in sorted({c.slice for c in comparisons}):
        most = max([(looks or {}).get(c.task, 1) for c in comparisons if c.slice == name] or [1])
        pool = pooled(comparisons, values, name,
                      confidence=look_confidence(quality_gates.slice_gates(spec, name).confidence, most),
                      iters=spec.bootstrap_iters, seed=spec.seed)
        if pool is not None:
            out.append(pool)
    return out
