"""Evaluate until decided: the look schedule, the per-look confidence, which tasks stay
open, and (simulated) that stopping at the first decided look keeps the error rates."""

from __future__ import annotations

import random

import pytest

from quantlab.core.verdicts import GateVerdict
from quantlab.quality.compare import compare_task
from quantlab.quality.gates import comparison_verdicts
from quantlab.quality.sequential import look_confidence, schedule, spent, spent_confidence, undecided_tasks
from quantlab.recipe.quality import QualityGates, QualitySpec


def test_schedule_grows_then_takes_everything():
    assert schedule(150, 40, 2.0) == [40, 80, 150]
    assert schedule(160, 40, 2.0) == [40, 80, 160]
    assert schedule(30, 40, 2.0) == [30]
    assert schedule(100, 10, 3.0) == [10, 30, 90, 100]


def test_each_look_shares_the_error():
    assert look_confidence(0.95, 1) == pytest.approx(0.95)
    assert look_confidence(0.95, 4) == pytest.approx(0.9875)
    # a task's looks spend the error O'Brien-Fleming-like: almost nothing early, nearly all at the end
    plan = [40, 80, 160, 320]
    confidences = [spent_confidence(0.95, plan, n) for n in plan]
    assert sum(1 - c for c in confidences) == pytest.approx(0.05)
    assert confidences[0] > 0.99999 and confidences[-1] < 0.96  # Bonferroni's last look: 0.9875
    assert spent(0.05, 1.0) == pytest.approx(0.05) and spent(0.05, 0.0) == 0.0
    assert spent_confidence(0.95, [30], 30) == 0.95


def v(scope, verdict):
    return GateVerdict(check="quality", gate="non_inferiority", scope=scope, verdict=verdict, value=0.0, limit=0.0,
                       evidence="")


def test_a_task_stays_open_while_its_own_gate_or_its_slice_is_not_decided():
    slice_of = {"a": "s1", "b": "s1", "c": "s2", "d": "s3"}
    verdicts = [v("a", "pass"), v("b", "pass"), v("slice:s1", "inconclusive"), v("c", "inconclusive"),
                v("d", "fail")]
    assert undecided_tasks(verdicts, slice_of) == {"a", "b", "c"}
    assert undecided_tasks([v("a", "pass")], {"a": "s1"}) == set()


def rows(values):
    return [{"doc_id": i, "filter": "none", "prompt_hash": f"p{i}", "prompt": "", "target": "", "answer": x,
             "raw": None, "metrics": {"acc": x}} for i, x in enumerate(values)]


def sequential_verdict(base, cand, gates, first=40, growth=2.0):
    """The verdict and the samples used, looking as the stage does."""
    plan = schedule(len(base), first, growth)
    for n in plan:
        conf = spent_confidence(gates.confidence, plan, n)
        cmp, _ = compare_task("t", "s", "acc", None, True, rows(base[:n]), rows(cand[:n]), confidence=conf,
                              iters=200, seed=0)
        [ni] = [x for x in comparison_verdicts(cmp, gates, scope="t") if x.gate == "non_inferiority"]
        if ni.verdict != "inconclusive":
            return ni.verdict, n
    return ni.verdict, n


def test_stopping_early_keeps_the_error_rates():
    """200 simulated tasks of 320 samples, 5-point margin. Unchanged (5% of answers
    flip both ways): never fails, shown non-inferior in 188 (a Bonferroni split over the
    looks: 159), 43 of them before the end (76). 20 points worse: never passes, always
    fails before the end (after 153 samples on average; 75 with Bonferroni): the
    spending keeps the last look's power and stops only clear cases early."""
    gates = QualityGates(non_inferiority_margin=0.1, non_inferiority_min_margin=0.05, min_recovery=None)
    rng = random.Random(5)
    same, worse = [], []
    for _ in range(200):
        base = [float(rng.random() < 0.6) for _ in range(320)]
        cand = [1 - b if rng.random() < 0.05 else b for b in base]
        same.append(sequential_verdict(base, cand, gates))
        lost = [0.0 if b and rng.random() < 0.20 / 0.6 else b for b in base]
        worse.append(sequential_verdict(base, lost, gates))
    assert not any(verdict == "fail" for verdict, _ in same)
    assert sum(verdict == "pass" for verdict, _ in same) >= 180
    assert sum(n < 320 for _, n in same) >= 30  # decided at an earlier look
    assert not any(verdict == "pass" for verdict, _ in worse)
    assert sum(verdict == "fail" and n < 320 for verdict, n in worse) >= 190


def test_samples_auto_is_a_recipe_choice():
    spec = QualitySpec(samples="auto", sequential={"first": 20, "growth": 3})
    assert spec.sequential.first == 20 and QualitySpec().samples == "all"
    with pytest.raises(ValueError):
        QualitySpec(samples="some")
