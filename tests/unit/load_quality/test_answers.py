"""One evaluation's rows joined to the shaper's records (load_quality/answers.py): each document
to its requests by key; a document one of whose requests did not end ok (an error, a timeout,
given up by lm-eval and asked again) is unscored, so the gates count it wrong for the
candidate; the busy time is the union of the requests' spans, summed over shapers."""

from __future__ import annotations

from quantlab.load_quality.answers import busy_seconds, join
from quantlab.load_quality.discipline import ShapedRecord
from quantlab.load_quality.gates import level_counts


def row(doc, value, keys):
    return {"doc_id": doc, "filter": "none", "metrics": {"acc": value}, "request_keys": keys}


def rec(keys, sent_at, e2e, outcome="ok"):
    return ShapedRecord(keys=keys, kind="loglikelihood", queued_at=sent_at, sent_at=sent_at, late_s=0.0,
                        in_flight_at_send=1, outcome=outcome, ttft=e2e, e2e=e2e)


def test_each_document_gets_its_own_requests_and_a_retry_makes_it_unscored():
    rows = {"t": [row(0, 1, ["a", "b"]), row(1, 1, ["c"]), row(2, 0, ["d"]), row(3, 0.5, ["e"])]}
    records = [rec(["a"], 0.0, 1.0), rec(["b"], 0.5, 1.0), rec(["c"], 1.0, 0.5, outcome="abandoned"),
               rec(["c"], 2.0, 0.5), rec(["d"], 2.0, 1.0), rec(["e"], 3.0, 0.2), rec(["zz"], 3.5, 0.1)]
    got = join(rows, {"t": ("acc", None)}, records)
    assert got.correct == {("t", 0): True, ("t", 1): None, ("t", 2): False, ("t", 3): None}
    assert len(got.records[("t", 0)]) == 2 and len(got.records[("t", 1)]) == 2
    assert got.failed == 1 and got.not_binary == {"t": 1} and got.unmatched_records == 1 and got.untimed == 0
    assert got.in_flight == 1  # every record was sent alone; the abandoned one was never sent
    # the retried document is not right for the candidate: 1 right of 4
    assert level_counts(tuple(("t", i) for i in range(4)), got.correct).correct == 1
    # spans 0-1.5, 2-3 (two overlapping), 3-3.2, 3.5-3.6
    assert got.busy_s == busy_seconds([(0, 1.5), (2, 3), (3, 3.2), (3.5, 3.6)]) == \
        __import__("pytest").approx(2.8)


def test_several_shapers_busy_time_is_given_not_recomputed():
    rows = {"t": [row(0, 1, ["a"])]}
    got = join(rows, {"t": ("acc", None)}, [rec(["a"], 0.0, 1.0)], busy_s=7.5)
    assert got.busy_s == 7.5
