"""Sample-by-sample comparison of candidate and baseline eval results, and the quality
gates' verdicts. Pure: rows in (as the lm-eval runner keeps them), numbers out.

Rows are joined on doc id (within the judged filter) and must have the same prompt
hash on both sides: a mismatch means the two runs did not ask the same thing (another
tokenizer, template or task version) and the comparison is refused, not guessed.
"""

from __future__ import annotations

import math
from typing import Any

from quantlab.core.errors import CheckError
from quantlab.quality.stats import PairedInterval, Value, is_binary, mcnemar_exact, paired_interval
from quantlab.core.results import TaskComparison

LN2 = math.log(2)
# lm-eval's ratio-of-sums metrics: per-sample (loglikelihood, words|bytes) -> the score
TRANSFORMS = {
    "word_perplexity": lambda x: math.exp(-x),
    "byte_perplexity": lambda x: math.exp(-x),
    "bits_per_byte": lambda x: -x / LN2,
}
PREFIX_STEP = 10  # samples-to-verdict is looked for at every 10th prefix


def judged_rows(rows: list[dict[str, Any]], metric: str, filt: str | None) -> dict[Any, dict[str, Any]]:
    filters = [r.get("filter") for r in rows]
    chosen = filt or (filters[0] if filters else None)
    return {r["doc_id"]: r for r in rows if r.get("filter") == chosen and metric in (r.get("metrics") or {})}


def _value(row: dict[str, Any], metric: str) -> Value:
    v = row["metrics"][metric]
    if isinstance(v, (list, tuple)):
        return (float(v[0]), float(v[1]))
    return float(v)


def paired_values(task: str, metric: str, filt: str | None, base_rows: list[dict], cand_rows: list[dict]
                  ) -> tuple[list[Any], list[Value], list[Value]]:
    base = judged_rows(base_rows, metric, filt)
    cand = judged_rows(cand_rows, metric, filt)
    if not base or not cand:
        side = "baseline" if not base else "candidate"
        raise CheckError(f"task '{task}': the {side} results have no per-sample '{metric}'"
                         f"{f' for filter {filt}' if filt else ''}: check the suite's metric and filter names")
    if set(base) != set(cand):
        raise CheckError(f"task '{task}': baseline and candidate answered different samples "
                         f"({len(base)} vs {len(cand)}, {len(set(base) ^ set(cand))} not in both)")
    ids = sorted(base, key=lambda x: (str(type(x)), x))
    mismatched = [i for i in ids if base[i].get("prompt_hash") != cand[i].get("prompt_hash")]
    if mismatched:
        raise CheckError(f"task '{task}': {len(mismatched)} of {len(ids)} prompts differ between baseline and "
                         f"candidate (doc ids {mismatched[:5]}): the two runs did not ask the same thing; check "
                         "that both use the same tokenizer, chat template and task version")
    values = {role: [_value(rows[i], metric) for i in ids] for role, rows in (("baseline", base), ("candidate", cand))}
    for role, vs in values.items():
        bad = [(i, v) for i, v in zip(ids, vs)
               if not all(math.isfinite(x) for x in (v if isinstance(v, tuple) else (v,)))]
        if bad:  # one NaN would silently become "recovery undefined" or drop out of the bootstrap
            raise CheckError(f"task '{task}': the {role}'s '{metric}' is not a finite number for {len(bad)} "
                             f"sample(s) (doc id {bad[0][0]}: {bad[0][1]}); a score that is not a number cannot "
                             "be compared: check the task's metric (and the server's answers in its samples file)")
    return ids, values["baseline"], values["candidate"]


def compare_task(task: str, slice_: str, metric: str, filt: str | None, higher_is_better: bool,
                 base_rows: list[dict], cand_rows: list[dict], *, confidence: float, iters: int, seed: int
                 ) -> tuple[TaskComparison, list[dict[str, Any]]]:
    """The paired comparison of one task, and its flips (samples whose pass/fail or
    value changed), each with the prompt and both answers."""
    ids, b, c = paired_values(task, metric, filt, base_rows, cand_rows)
    transform = TRANSFORMS.get(metric)
    try:
        ci = paired_interval(b, c, iters=iters, confidence=confidence, seed=seed, transform=transform)
    except ValueError as err:
        raise CheckError(f"task '{task}' ({metric}): {err}") from None
    binary = is_binary(b) and is_binary(c)
    base_only = sum(1 for x, y in zip(b, c, strict=True) if binary and x > y)
    cand_only = sum(1 for x, y in zip(b, c, strict=True) if binary and y > x)
    base_map, cand_map = judged_rows(base_rows, metric, filt), judged_rows(cand_rows, metric, filt)
    flips = []
    if binary:
        for i, x, y in zip(ids, b, c, strict=True):
            if x != y:
                br, cr = base_map[i], cand_map[i]
                flips.append({"task": task, "doc_id": i, "direction": "worse" if x > y else "better",
                              "prompt": br.get("prompt"), "target": br.get("target"),
                              "baseline_answer": br.get("answer"), "candidate_answer": cr.get("answer"),
                              "baseline_raw": br.get("raw"), "candidate_raw": cr.get("raw")})
    cmp = TaskComparison(
        task=task, slice=slice_, metric=metric, filter=filt, higher_is_better=higher_is_better, n=len(ids),
        baseline=ci.baseline, candidate=ci.candidate, diff=ci.diff, ci_low=ci.low, ci_high=ci.high,
        confidence=confidence, recovery=recovery(ci.baseline, ci.candidate, higher_is_better),
        binary=binary, worse=base_only if binary else None, better=cand_only if binary else None,
        mcnemar_p=mcnemar_exact(base_only, cand_only) if binary else None,
        answers_changed=sum(1 for i in ids if base_map[i].get("answer") != cand_map[i].get("answer")),
    )
    return cmp, flips


def recovery(base: float, cand: float, higher_is_better: bool) -> float | None:
    num, den = (cand, base) if higher_is_better else (base, cand)
    if den == 0 or not math.isfinite(num) or not math.isfinite(den):
        return None if num != den else 1.0
    return num / den


def pooled(comparisons: list[TaskComparison], rows: dict[str, tuple[list[Value], list[Value]]], slice_: str, *,
           confidence: float, iters: int, seed: int) -> tuple[TaskComparison, list[Value], list[Value]] | None:
    """One comparison for a slice: the per-sample values of its tasks with a plain mean
    metric (pass/fail rates), pooled. Perplexity-type tasks are judged per task only."""
    members = [t for t in comparisons if t.slice == slice_ and t.metric not in TRANSFORMS and t.higher_is_better]
    if len(members) < 2:
        return None
    return _pool(members, rows, f"slice:{slice_}", slice_, confidence=confidence, iters=iters, seed=seed)


POOLED_SCOPE = "pooled"


def pooled_all(comparisons: list[TaskComparison], rows: dict[str, tuple[list[Value], list[Value]]], *,
               confidence: float, iters: int, seed: int) -> tuple[TaskComparison, list[Value], list[Value]] | None:
    """One comparison over every gated pass/fail item of every task, stratified by task
    with weights proportional to its items (so the estimate is the pooled difference).
    The pooled score test's variance is at least the stratified one's (the spread of the
    tasks' own differences only adds to it), so its error at the margin stays nominal
    or below. It sees a small drop spread over every task that no task alone can."""
    members = [t for t in comparisons if t.binary and t.metric not in TRANSFORMS and t.higher_is_better]
    if len(members) < 2:
        return None
    return _pool(members, rows, POOLED_SCOPE, "all", confidence=confidence, iters=iters, seed=seed)


def _pool(members: list[TaskComparison], rows: dict[str, tuple[list[Value], list[Value]]], name: str, slice_: str,
          *, confidence: float, iters: int, seed: int) -> tuple[TaskComparison, list[Value], list[Value]]:
    b = [v for t in members for v in rows[t.task][0]]
    c = [v for t in members for v in rows[t.task][1]]
    ci: PairedInterval = paired_interval(b, c, iters=iters, confidence=confidence, seed=seed)
    binary = is_binary(b) and is_binary(c)
    worse = sum(1 for x, y in zip(b, c, strict=True) if binary and x > y)
    better = sum(1 for x, y in zip(b, c, strict=True) if binary and y > x)
    cmp = TaskComparison(task=name, slice=slice_, metric="+".join(sorted({t.metric for t in members})),
                         filter=None, higher_is_better=True, n=len(b), baseline=ci.baseline, candidate=ci.candidate,
                         diff=ci.diff, ci_low=ci.low, ci_high=ci.high, confidence=confidence,
                         recovery=recovery(ci.baseline, ci.candidate, True), binary=binary,
                         worse=worse if binary else None, better=better if binary else None,
                         mcnemar_p=mcnemar_exact(worse, better) if binary else None, answers_changed=None,
                         tasks=[t.task for t in members])
    return cmp, b, c
