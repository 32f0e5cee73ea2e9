"""The dry-run planner: what a gate can tell with n samples, by the gates' own interval."""

from __future__ import annotations

from quantlab.quality.planner import plan_gate
from quantlab.recipe.quality import QualityGates
from quantlab.quality.samples import sample_count
from quantlab.quality.suites import SHIPPED, load_suite


def test_more_samples_narrow_the_floor_and_let_non_inferiority_show():
    gates = QualityGates()  # margin 0.1 x score, 95%, min_samples 20
    plans = {n: plan_gate(f"t{n}", n, gates, family=13) for n in (10, 30, 100, 1000)}
    widths = [plans[n].half_width for n in (30, 100, 1000)]
    assert widths == sorted(widths, reverse=True)
    assert not plans[10].can_show and plans[10].blocks_drop is None  # below min_samples: nothing shown
    assert plans[10].samples_to_show >= gates.min_samples  # never fewer than min_samples
    assert not plans[30].can_show and 30 < plans[30].samples_to_show < 1000 and plans[30].underpowered
    assert plans[1000].can_show and plans[1000].samples_to_show is None and not plans[1000].underpowered
    assert plans[1000].blocks_drop < plans[100].blocks_drop < plans[30].blocks_drop
    # what it says is what the gate would do: at the planned size, an unchanged model shows 80% of the time
    at = plan_gate("t", plans[30].samples_to_show, gates, family=13)
    assert at.can_show and 0.8 <= at.p_release_unchanged < 0.9
    assert "cannot decide (needs ~" in plans[30].line() and "blocks drops >= " in plans[30].line()
    assert "P(release | unchanged)" in plans[30].line()


def test_the_plan_is_the_gates_own_error_rates():
    """P(release | unchanged) and P(blocked | 2x margin), exact, against a simulation of
    the gate itself on the same paired model."""
    import numpy as np

    from quantlab.core.results import TaskComparison
    from quantlab.quality.gates import FailFamily, comparison_verdicts
    from quantlab.quality.stats import paired_proportion_interval

    gates = QualityGates(non_inferiority_margin=None, max_drop=0.05)  # a 5-point margin, whatever the score
    plan = plan_gate("t", 300, gates, family=1, discordance=0.06)
    assert plan.margin is None  # max_drop is its own margin; the planner plans non_inferiority
    gates = QualityGates(non_inferiority_margin=0.1, non_inferiority_min_margin=0.05)
    plan = plan_gate("t", 300, gates, family=1, score=0.5, discordance=0.06)
    rng = np.random.default_rng(5)
    passed = held = 0
    trials = 400
    for drop, counter in ((0.0, "passed"), (0.10, "held")):
        for _ in range(trials):
            u = rng.random(300)
            base = (u < 0.5).astype(float)
            cand = base.copy()
            cand[(u < 0.03 + drop)] = 0.0  # baseline-only: 3% + the drop
            cand[(u >= 0.5) & (u < 0.53)] = 1.0  # candidate-only: 3%
            ci = paired_proportion_interval(base.tolist(), cand.tolist(), confidence=0.95)
            cmp = TaskComparison(task="t", slice="s", metric="acc", filter=None, higher_is_better=True, n=300,
                                 baseline=ci.baseline, candidate=ci.candidate, diff=ci.diff, ci_low=ci.low,
                                 ci_high=ci.high, confidence=0.95, recovery=None, binary=True)
            [v] = comparison_verdicts(cmp, gates.model_copy(update={"non_inferiority_min_margin": 0.05}),
                                      scope="t", family=FailFamily(1, 0.95))
            if counter == "passed":
                passed += v.verdict == "pass"
            else:
                held += v.verdict != "pass"
    assert abs(passed / trials - plan.p_release_unchanged) < 0.06, (passed / trials, plan.p_release_unchanged)
    assert held / trials >= 0.99 and plan.p_held_2x >= 0.99


def test_a_larger_family_needs_a_larger_drop_to_block():
    gates = QualityGates()
    assert plan_gate("t", 200, gates, family=1).blocks_drop < plan_gate("t", 200, gates, family=40).blocks_drop


def test_sample_counts_come_from_the_suite_data():
    suite = load_suite(SHIPPED / "default")
    counts = {t.task: sample_count(suite, t.task) for t in suite.tasks}
    assert counts["ql_passkey_150w"] == 400 and counts["ql_passkey_1300w"] == 20 and counts["ql_arithmetic"] == 406
    assert all(n and n > 0 for n in counts.values())


def test_the_shipped_suite_holds_300_distinct_items_per_required_comparison():
    """Grown to decide: every gated task of the default suite (but the three longer
    pass-key lengths, warned per length in the shipped recipes and pooled in the
    long-context slice) has at least 300 distinct items."""
    import json

    suite = load_suite(SHIPPED / "default")
    keys = {"ql_lastword": "context", "ql_prose_ppl": "text", "ql_knowledge_mc": "question",
            "ql_arithmetic": "question", "ql_json_extract": "text", "ql_passkey_150w": "context",
            "ql_chat": "question", "ql_code": "name", "ql_safety": "prompt"}
    for task, key in keys.items():
        rows = [json.loads(x) for x in (SHIPPED / "default" / "data" / f"{task[3:]}.jsonl").read_text().splitlines()]
        assert len({r[key] for r in rows}) >= 300, task
    long_context = sum(sample_count(suite, t.task) for t in suite.tasks if t.slice == "long-context")
    assert long_context >= 300


def test_evaluate_until_decided_is_planned_over_its_looks():
    """`samples: auto`: the forecast is the sequential design's (each look at its boundary
    level, stopping at the first pass or fail), and it is what the gate does: against 400
    simulated tasks judged look by look as the stage judges them (within 3 standard errors)."""
    import random

    from quantlab.quality.compare import compare_task
    from quantlab.quality.gates import comparison_verdicts
    from quantlab.quality.sequential import boundary_confidence, schedule

    gates = QualityGates(non_inferiority_margin=0.1, non_inferiority_min_margin=0.05, min_recovery=None)
    fixed = plan_gate("t", 160, gates, family=1, discordance=0.12)
    looked = plan_gate("t", 160, gates, family=1, discordance=0.12, looks=lambda n: schedule(n, 40, 2.0))
    assert looked.p_release_unchanged <= fixed.p_release_unchanged  # the looks cost a little power, never add
    assert 0.3 < looked.p_release_unchanged < 0.8 and looked.samples_to_show > 160
    rng, passed, plan = random.Random(3), 0, schedule(160, 40, 2.0)
    for _ in range(400):
        base = [float(rng.random() < 0.5) for _ in range(160)]
        cand = [1 - b if rng.random() < 0.12 else b for b in base]  # 12% discordant, half each way
        for n in plan:
            rows = [[{"doc_id": i, "filter": "none", "prompt_hash": f"p{i}", "prompt": "", "target": "", "answer": x,
                      "raw": None, "metrics": {"acc": x}} for i, x in enumerate(v[:n])] for v in (base, cand)]
            cmp, _ = compare_task("t", "s", "acc", None, True, *rows, confidence=boundary_confidence(0.95, plan, n),
                                  iters=50, seed=0)
            [ni] = [v for v in comparison_verdicts(cmp, gates, scope="t") if v.gate == "non_inferiority"]
            if ni.verdict != "inconclusive":
                break
        passed += ni.verdict == "pass"
    p = looked.p_release_unchanged
    assert abs(passed / 400 - p) < 3 * (p * (1 - p) / 400) ** 0.5
