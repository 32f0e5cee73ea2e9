"""Evaluate until decided: the look schedule, the group-sequential boundary (against
published tables and the looks' joint normal law), which tasks stay open, and
(simulated) that stopping at the first decided look keeps the error rates."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy.stats import multivariate_normal, norm

from quantlab.core.verdicts import GateVerdict
from quantlab.quality.compare import compare_task
from quantlab.quality.gates import comparison_verdicts
from quantlab.quality import gates as quality_gates
from quantlab.quality.sequential import (boundary, boundary_confidence, look_confidence, nominal_levels, schedule,
                                         sequential_ni_probability, spending, undecided_tasks)
from quantlab.recipe.quality import QualityGates, QualitySpec


def test_schedule_grows_then_takes_everything():
    assert schedule(150, 40, 2.0) == [40, 80, 150]
    assert schedule(160, 40, 2.0) == [40, 80, 160]
    assert schedule(30, 40, 2.0) == [30]
    assert schedule(100, 10, 3.0) == [10, 30, 90, 100]
    # a growth too small to add a sample at first: each size looked at once, strictly growing
    slow = schedule(200, 10, 1.05)
    assert slow[:3] == [10, 11, 12] and slow[-1] == 200 and all(a < b for a, b in zip(slow, slow[1:]))
    assert 0.95 < boundary_confidence(0.95, slow, 11) < 1.0


def test_each_look_shares_the_error():
    assert look_confidence(0.95, 1) == pytest.approx(0.95)
    assert look_confidence(0.95, 4) == pytest.approx(0.9875)
    # O'Brien-Fleming-type spending (sfLDOF): almost nothing early, all of alpha by the end
    assert spending(0.025, 1.0) == pytest.approx(0.025) and spending(0.025, 0.0) == 0.0
    assert spending(0.025, 0.1) < 1e-10 < spending(0.025, 0.5) < 0.002
    plan = [40, 80, 160, 320]
    confidences = [boundary_confidence(0.95, plan, n) for n in plan]
    assert confidences[0] > 0.99999 and confidences[-1] < 0.96  # Bonferroni's last look: 0.9875
    assert boundary_confidence(0.95, [30], 30) == 0.95


def test_the_boundary_is_the_published_one():
    """Lan-DeMets O'Brien-Fleming-type bounds, one-sided 0.025, equally spaced looks:
    K = 2: 2.962588, 1.968596 (rpact / gsDesign, two stages at t = 1/2); K = 3: 3.710303,
    2.511427, 1.993048 (gsDesign(k = 3, test.type = 1, alpha = 0.025, sfu = sfLDOF)).
    (2.797 / 1.977 is O'Brien and Fleming's own 1979 K = 2 boundary, not a spending one.)"""
    assert boundary(0.025, (0.5, 1.0)) == pytest.approx((2.962588, 1.968596), abs=2e-6)
    assert boundary(0.025, (1 / 3, 2 / 3, 1.0)) == pytest.approx((3.710303, 2.511427, 1.993048), abs=2e-6)


def test_the_boundary_spends_each_increment_under_the_looks_joint_law():
    """An independent check on unequal looks (40 / 80 / 160 / 320 / 400, the shipped
    suite's 400 items): with Z_k jointly normal, corr sqrt(t_i / t_j), the chance of a
    first crossing at look k is A(t_k) - A(t_(k-1)) (Genz's multivariate normal CDF)."""
    plan = [40, 80, 160, 320, 400]
    t = [n / plan[-1] for n in plan]
    z = boundary(0.025, tuple(t))
    stay = [1.0]
    for k in range(1, len(t) + 1):
        cov = np.array([[math.sqrt(min(a, b) / max(a, b)) for b in t[:k]] for a in t[:k]])
        bounds = np.array([min(b, 12.0) for b in z[:k]])
        stay.append(float(multivariate_normal(np.zeros(k), cov, abseps=1e-8, releps=1e-8).cdf(bounds)))
    for k in range(len(t)):
        assert stay[k] - stay[k + 1] == pytest.approx(spending(0.025, t[k]) - spending(0.025, t[k - 1] if k else 0),
                                                      abs=2e-6)
    # the last look: z 2.03 under the boundary, 2.23 judged at its increment alone (a union bound)
    assert z[-1] == pytest.approx(2.0258, abs=1e-3)
    assert norm.isf(spending(0.025, 1.0) - spending(0.025, 0.8)) == pytest.approx(2.2326, abs=1e-3)
    levels = nominal_levels(0.025, plan)
    assert sum(levels) > 0.025 and levels[-1] == pytest.approx(norm.sf(z[-1]))


def test_a_task_fails_at_its_looks_boundary_for_the_family():
    """The fail side of a task judged look by look: the boundary at (1 - c) / (2 m), not
    the pass side's nominal level divided by m (those add up to more than they spend)."""
    spec = QualitySpec()
    plan = [40, 80, 160]
    base = [1.0] * 60 + [0.0] * 20
    tasks = []
    for name in ("a", "b"):
        cmp, _ = compare_task(name, "s", "acc", None, True, rows(base), rows(base), iters=100, seed=0,
                              confidence=boundary_confidence(0.95, plan, len(base)))
        tasks.append((cmp, base, base))
    vs = quality_gates.verdicts(spec, tasks, [], None, plans={"a": plan, "b": plan})
    [a] = [v for v in vs if v.scope == "a" and v.gate == "non_inferiority"]
    assert a.fail_confidence == pytest.approx(boundary_confidence(1 - 0.05 / 2, plan, 80))
    assert a.confidence == pytest.approx(boundary_confidence(0.95, plan, 80))
    assert 1 - a.fail_confidence < (1 - a.confidence) / 2  # stricter than a Bonferroni share of the nominal


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
        conf = boundary_confidence(gates.confidence, plan, n)
        cmp, _ = compare_task("t", "s", "acc", None, True, rows(base[:n]), rows(cand[:n]), confidence=conf,
                              iters=200, seed=0)
        [ni] = [x for x in comparison_verdicts(cmp, gates, scope="t") if x.gate == "non_inferiority"]
        if ni.verdict != "inconclusive":
            return ni.verdict, n
    return ni.verdict, n


def test_stopping_early_keeps_the_error_rates():
    """200 simulated tasks of 320 samples, 5-point margin. Unchanged (5% of answers
    flip both ways): never fails, shown non-inferior in 189 (a Bonferroni split over the
    looks: 159), 30 of them before the end (76). 20 points worse: never passes, always
    fails before the end (after 159 samples on average; 75 with Bonferroni): the
    boundary keeps the last look's power and stops only clear cases early."""
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
    assert sum(n < 320 for _, n in same) >= 25  # decided at an earlier look
    assert not any(verdict == "pass" for verdict, _ in worse)
    assert sum(verdict == "fail" and n < 320 for verdict, n in worse) >= 190


def test_samples_auto_is_a_recipe_choice():
    spec = QualitySpec(samples="auto", sequential={"first": 20, "growth": 3})
    assert spec.sequential.first == 20 and QualitySpec().samples == "all"
    with pytest.raises(ValueError):
        QualitySpec(samples="some")


def test_the_false_release_rate_at_the_margin_stays_near_nominal_over_the_looks():
    """Exact (the discordant counts carried look to look): a candidate worse by exactly
    the margin passes some look at most about 2.5% of the time (2.52% at 400 items, p01
    0.2, margin 0.0875; the fixed-size score test itself reaches 2.52% there), and an
    unchanged one at 5% discordance keeps nearly its fixed-size pass chance."""
    from quantlab.quality.stats import ni_pass_probability

    plan = schedule(400, 40, 2.0)
    worst = max(sequential_ni_probability(plan, m, p01, p01 + m, 0.95)[0]
                for m in (0.05, 0.0875) for p01 in (0.0, 0.05, 0.2))
    assert 0.02 < worst < 0.0255
    unchanged, failed = sequential_ni_probability(plan, 0.05, 0.025, 0.025, 0.95, 1 - 0.05 / 11)
    assert unchanged == pytest.approx(0.981, abs=0.002) and failed < 1e-9
    assert ni_pass_probability(400, 0.05, 0.025, 0.025, 0.95) - unchanged < 0.005
