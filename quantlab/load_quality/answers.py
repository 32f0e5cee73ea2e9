"""One evaluation at one load, read back (pure): each document's pass/fail as the quality
stage scores it, joined to the timed requests that asked it.

lm-eval's child writes each sample row with `request_keys` (quality/request_keys.py: the keys
of lm-eval's own cache keys of the document's requests); the load shaper records the same
keys on every request it forwarded. A document's requests are the records carrying one of its
keys (a retried request is two records: the user saw both). A document counts as answered
when its row has a finite 0/1 value of the task's metric; anything else is said, never
guessed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quantlab.quality.compare import judged_rows

DocKey = tuple[str, Any]  # (task, doc id)


@dataclass
class RunAnswers:
    """One role's answers at one load."""

    correct: dict[DocKey, bool | None] = field(default_factory=dict)  # answered documents: right? (None: unscored)
    records: dict[DocKey, list[Any]] = field(default_factory=dict)  # their requests (shaper records)
    not_binary: dict[str, int] = field(default_factory=dict)  # task -> answered documents whose value is not 0/1
    unmatched_records: int = 0  # requests whose keys no document carries (should be 0)
    untimed: int = 0  # answered documents none of whose requests the shaper saw (should be 0)
    failed: int = 0  # answered documents one of whose requests failed, timed out or was asked again
    busy_s: float = 0.0  # the time some request of this evaluation was in flight
    lm_eval: str | None = None  # the lm-eval version that scored it
    in_flight: float | None = None  # the median of the requests in flight upstream as each was sent

    @property
    def answered(self) -> int:
        return len(self.correct)


def task_answers(task: str, metric: str, filt: str | None, rows: list[dict[str, Any]]) -> tuple[
        dict[DocKey, bool | None], dict[DocKey, list[str]], int]:
    """A task's rows: (document -> right, wrong or None when its value is not 0 or 1; document
    -> its request keys; how many were not 0 or 1)."""
    judged = judged_rows(rows, metric, filt)
    correct: dict[DocKey, bool | None] = {}
    keys: dict[DocKey, list[str]] = {}
    not_binary = 0
    for doc_id, row in judged.items():
        value = row["metrics"][metric]
        passed = bool(value) if isinstance(value, bool) or value in (0, 1) else None
        not_binary += passed is None
        correct[(task, doc_id)] = passed
        keys[(task, doc_id)] = list(row.get("request_keys") or [])
    return correct, keys, not_binary


def busy_seconds(spans: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end] spans: the time the server had work from us
    (gaps between lm-eval's tasks, while it scores and starts the next, do not count)."""
    total, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def join(rows_by_task: dict[str, list[dict[str, Any]]], tasks: dict[str, tuple[str, str | None]],
         records: list[Any], *, busy_s: float | None = None) -> RunAnswers:
    """Every task's rows (`tasks`: task -> (metric, filter)) joined to the shaper's records
    (each with `keys`, `sent_at`, `e2e`, `outcome`). A document one of whose requests did not
    end ok (an error, a timeout, given up by lm-eval and asked again) has its answer from a
    retry the user at this load would not have had: it is unscored (None), which the gates
    count wrong for the candidate. `busy_s`: the busy time when the records come from several
    shapers, whose clocks each start at 0 (else it is computed from the records)."""
    out = RunAnswers()
    by_key: dict[str, list[Any]] = {}
    for rec in records:
        for k in rec.keys:
            by_key.setdefault(k, []).append(rec)
    claimed: set[int] = set()
    for task, (metric, filt) in tasks.items():
        correct, keys, not_binary = task_answers(task, metric, filt, rows_by_task.get(task, []))
        if not_binary:
            out.not_binary[task] = not_binary
        for doc, passed in correct.items():
            recs = {id(r): r for k in keys[doc] for r in by_key.get(k, [])}
            retried = any(r.outcome != "ok" for r in recs.values())
            out.correct[doc] = None if retried else passed
            out.failed += retried
            out.records[doc] = list(recs.values())
            claimed.update(recs)
            if not recs:
                out.untimed += 1
    out.unmatched_records = sum(1 for r in records if id(r) not in claimed)
    sent = sorted(r.in_flight_at_send for r in records if r.outcome != "abandoned")
    out.in_flight = (sent[(len(sent) - 1) // 2] + sent[len(sent) // 2]) / 2 if sent else None
    out.busy_s = busy_s if busy_s is not None else busy_seconds(
        [(r.sent_at, r.sent_at + r.e2e) for r in records if r.e2e is not None])
    return out
