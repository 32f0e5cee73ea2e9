"""Paired comparison and quality gate verdicts on hand-made per-sample rows."""

from __future__ import annotations

import random

import pytest

from quantlab.core.errors import CheckError
from quantlab.quality.compare import compare_task, pooled
from quantlab.quality.gates import comparison_verdicts as verdicts, samples_needed
from quantlab.recipe.quality import QualityGates


def rows(values, *, answers=None, prompt="p", metric="acc"):
    return [{"doc_id": i, "filter": "none", "prompt_hash": f"{prompt}{i}", "prompt": f"q{i}", "target": "t",
             "answer": (answers or values)[i], "raw": None, "metrics": {metric: v}} for i, v in enumerate(values)]


def judge(base, cand, gates=None, metric="acc", hib=True):
    cmp, flips = compare_task("t", "general", metric, None, hib, base, cand, confidence=0.95, iters=1000, seed=0)
    return cmp, flips, verdicts(cmp, gates or QualityGates(), scope="t", b=None, c=None)


def by_gate(vs):
    return {v.gate: v.verdict for v in vs}


def test_a_model_against_itself_passes_every_gate():
    rng = random.Random(0)
    base = rows([float(rng.random() < 0.4) for _ in range(150)])
    cmp, flips, vs = judge(base, base, QualityGates(min_recovery=0.9))
    assert cmp.diff == 0 and cmp.mcnemar_p == 1.0 and flips == []
    assert by_gate(vs) == {"min_recovery": "pass", "non_inferiority": "pass"}


def test_a_broken_candidate_fails_with_its_numbers():
    rng = random.Random(1)
    b = [float(rng.random() < 0.6) for _ in range(150)]
    c = [x if rng.random() < 0.2 else 0.0 for x in b]  # most right answers lost
    cmp, flips, vs = judge(rows(b), rows(c), QualityGates(min_recovery=0.9, max_drop=0.05))
    assert by_gate(vs) == {"min_recovery": "fail", "max_drop": "fail", "non_inferiority": "fail"}
    assert cmp.worse == len(flips) > 50 and cmp.better == 0 and cmp.mcnemar_p < 1e-6
    assert all(f["direction"] == "worse" and f["prompt"] and "baseline_answer" in f for f in flips)
    v = next(v for v in vs if v.gate == "min_recovery")
    assert v.value == pytest.approx(cmp.candidate / cmp.baseline) and v.value < 0.5
    assert f"baseline {cmp.baseline:.4g}, candidate {cmp.candidate:.4g} over 150 paired samples" in v.evidence
    # the test behind it, as fields: each gate is non-inferiority at its own margin
    assert v.comparator == "non_inferior" and v.margin == pytest.approx(0.1 * cmp.baseline) and v.test == "tango-score"
    assert v.estimate == pytest.approx(cmp.diff) and v.low < v.estimate < v.high and v.beyond_limit()
    drop = next(v for v in vs if v.gate == "max_drop")
    assert drop.margin == 0.05 and drop.value == pytest.approx(-cmp.diff)


def test_a_small_drop_within_the_noise_is_inconclusive_and_says_how_many_samples_would_tell():
    b = [1.0] * 10 + [0.0] * 10 + [1.0] * 10
    c = list(b)
    c[0] = c[1] = c[2] = 0.0  # 3 of 20 right answers lost: recovery 0.85 on 30 samples
    cmp, _, vs = judge(rows(b), rows(c), QualityGates(min_recovery=0.9))
    assert by_gate(vs)["min_recovery"] == "inconclusive"
    ni = next(v for v in vs if v.gate == "non_inferiority")
    assert ni.verdict == "inconclusive" and ni.samples_to_verdict and ni.samples_to_verdict > 30


def test_too_few_samples_is_inconclusive_even_when_identical():
    base = rows([1.0, 0.0] * 5)
    _, _, vs = judge(base, base)
    assert set(by_gate(vs).values()) == {"inconclusive"}


def test_lower_is_better_metrics_are_oriented():
    base = [{"doc_id": i, "filter": "none", "prompt_hash": str(i), "metrics": {"word_perplexity": [-100.0, 50]}}
            for i in range(30)]
    worse = [{**r, "metrics": {"word_perplexity": [-160.0, 50]}} for r in base]
    cmp, _, vs = judge(base, worse, QualityGates(min_recovery=0.9), metric="word_perplexity", hib=False)
    assert cmp.candidate > cmp.baseline and cmp.recovery < 0.9
    assert by_gate(vs) == {"min_recovery": "fail", "non_inferiority": "fail"}
    better = [{**r, "metrics": {"word_perplexity": [-90.0, 50]}} for r in base]
    _, _, vs = judge(base, better, QualityGates(min_recovery=0.9), metric="word_perplexity", hib=False)
    assert by_gate(vs) == {"min_recovery": "pass", "non_inferiority": "pass"}


def test_prompts_that_differ_are_refused_not_compared():
    with pytest.raises(CheckError, match="prompts differ"):
        judge(rows([1.0] * 30), rows([1.0] * 30, prompt="other"))
    with pytest.raises(CheckError, match="different samples"):
        judge(rows([1.0] * 30), rows([1.0] * 29))
    with pytest.raises(CheckError, match="no per-sample 'acc'"):
        judge(rows([1.0] * 30), rows([1.0] * 30, metric="exact_match"))


def test_slice_pools_its_rate_tasks():
    cmp_a, _ = compare_task("a", "k", "acc", None, True, rows([1.0] * 20), rows([1.0] * 20), confidence=0.95,
                            iters=200, seed=0)
    cmp_b, _ = compare_task("b", "k", "acc", None, True, rows([0.0] * 20), rows([1.0] * 20), confidence=0.95,
                            iters=200, seed=0)
    values = {"a": ([1.0] * 20, [1.0] * 20), "b": ([0.0] * 20, [1.0] * 20)}
    cmp, b, c = pooled([cmp_a, cmp_b], values, "k", confidence=0.95, iters=200, seed=0)
    assert cmp.n == 40 and cmp.tasks == ["a", "b"] and cmp.better == 20 and cmp.diff == pytest.approx(0.5)
    assert pooled([cmp_a], values, "k", confidence=0.95, iters=200, seed=0) is None


def test_samples_needed_grows_as_the_gap_to_the_margin_shrinks():
    # half-width 0.1 must shrink to the 0.05 gap between the difference and the margin: 4x
    assert samples_needed(100, -0.05, -0.15, 0.05, 0.1) == 400
    # a difference on the margin (up to rounding: -0.425 + 0.375 is not exactly -0.05) has no count
    assert samples_needed(80, 0.375 - 0.425, -0.1476, 0.04944, 0.05) is None
    assert samples_needed(100, -0.08, -0.18, 0.02, 0.1) == 2500
    assert samples_needed(100, -0.1, -0.2, 0.0, 0.1) is None  # the difference sits on the margin


def test_a_sample_that_is_not_a_number_is_an_error_naming_task_and_sample():
    """One NaN used to make recovery undefined (a pass) and drop out of the bootstrap."""
    base = rows([1.0, 0.0] * 20)
    cand = rows([1.0, 0.0] * 20)
    cand[7]["metrics"]["acc"] = float("nan")
    with pytest.raises(CheckError, match=r"task 't': the candidate's 'acc' is not a finite number for 1 sample\(s\) "
                                         r"\(doc id 7: nan\)"):
        judge(base, cand)


def test_a_zero_baseline_score_tests_recovery_at_a_margin_of_zero_or_the_floor():
    """A recovery of a zero score allows no worsening: non-inferiority at margin 0 (or
    non_inferiority_min_margin), judged on the interval like every gate."""
    zero, better = rows([0.0] * 40, metric="f1"), rows([0.0] * 30 + [0.5] * 10, metric="f1")
    cmp, _, vs = judge(zero, better, QualityGates(min_recovery=0.9), metric="f1")
    assert cmp.recovery is None and by_gate(vs)["min_recovery"] == "pass"
    negative, worse = rows([0.5] * 20 + [-0.5] * 20, metric="f1"), rows([0.5] * 20 + [-0.6] * 20, metric="f1")
    cmp, _, vs = judge(negative, worse, QualityGates(min_recovery=0.9), metric="f1")
    assert cmp.recovery is None and by_gate(vs)["min_recovery"] == "fail"  # worse beyond its interval, margin 0
    floored = QualityGates(min_recovery=0.9, non_inferiority_min_margin=0.1)
    _, _, vs = judge(negative, worse, floored, metric="f1")
    assert by_gate(vs)["min_recovery"] == "pass"  # 0.05 worse, well inside a 0.1 floor


def test_recovery_and_drop_never_pass_on_the_point_estimate():
    """Before, a recovery at or above its limit passed on the point estimate alone (at the
    limit a coin toss): 150 samples, recovery 0.95 against a limit of 0.9 is not shown."""
    b = [1.0] * 100 + [0.0] * 50
    c = [1.0] * 95 + [0.0] * 55  # 5 of 100 right answers lost: recovery 0.95, drop 0.033
    cmp, _, vs = judge(rows(b), rows(c), QualityGates(min_recovery=0.9, max_drop=0.05, non_inferiority_margin=None))
    assert cmp.recovery == pytest.approx(0.95)
    assert by_gate(vs) == {"min_recovery": "inconclusive", "max_drop": "inconclusive"}
    assert all(not v.beyond_limit() for v in vs)  # within its limit: the estimate is; the interval is not yet


def test_zero_discordance_at_20_samples_does_not_show_non_inferiority():
    """The percentile bootstrap gave [0, 0] here, so non-inferiority passed with no
    uncertainty; 20 agreeing pairs leave a drop of several points plausible."""
    same = rows([1.0, 0.0] * 10)
    cmp, _, vs = judge(same, same, QualityGates(non_inferiority_margin=0.1))
    assert cmp.ci_low < -0.05 and cmp.ci_high > 0.05
    [ni] = [v for v in vs if v.gate == "non_inferiority"]
    assert ni.verdict == "inconclusive" and ni.samples_to_verdict and ni.samples_to_verdict > 20


def test_one_gain_in_60_cannot_show_a_1_5_point_margin():
    """Seen end to end: 60 items, one flip (a gain), no loss, margin 0.015 passed."""
    base = [1.0] * 40 + [0.0] * 20
    cand = [1.0] * 41 + [0.0] * 19
    cmp, _, vs = judge(rows(base), rows(cand), QualityGates(non_inferiority_margin=0.015 / (40 / 60)))
    assert cmp.worse == 0 and cmp.better == 1
    assert {v.gate: v.verdict for v in vs}["non_inferiority"] == "inconclusive"


def test_the_fail_side_is_adjusted_for_the_family_of_gates():
    """One gate failing is enough to block, so with many gates each fails only beyond a
    Bonferroni-adjusted interval: a marginal loss alone among 12 is not a block, a large
    one still is; passing still needs every gate at its own confidence."""
    from quantlab.quality import gates as quality_gates
    from quantlab.quality.compare import paired_values
    from quantlab.recipe.quality import QualitySpec

    spec = QualitySpec.model_validate({})

    def paired(name, base, cand):
        b_rows, c_rows = rows(base, prompt=name), rows(cand, prompt=name)
        cmp, _ = compare_task(name, name, "acc", None, True, b_rows, c_rows, confidence=0.95, iters=500, seed=0)
        _, bv, cv = paired_values(name, "acc", None, b_rows, c_rows)
        return cmp, bv, cv

    good = [1.0] * 60 + [0.0] * 40
    # 20 right answers lost, 4 gained: 16 points worse, beyond the 6-point margin at the 95% interval but not
    # at the family's
    marginal = [1.0] * 40 + [0.0] * 20 + [1.0] * 4 + [0.0] * 36
    large = [1.0] * 20 + [0.0] * 80
    tasks = [paired(f"t{i}", good, good) for i in range(10)] + [paired("marginal", good, marginal),
                                                                 paired("large", good, large)]
    alone = {v.gate: v.verdict for v in quality_gates.verdicts(spec, tasks[-2:-1], [], None)}
    family = {(v.gate, v.scope): v for v in quality_gates.verdicts(spec, tasks, [], None)}
    assert alone["non_inferiority"] == "fail"
    marginal_v = family[("non_inferiority", "marginal")]
    assert marginal_v.verdict == "inconclusive"
    assert "Bonferroni over 12 gated comparisons" in marginal_v.evidence
    # it says why: worse beyond its own interval, not beyond the family's (not "within the noise")
    assert "interval is below -0.06, but not the fail side's" in marginal_v.evidence
    assert marginal_v.fail_confidence == pytest.approx(1 - 0.05 / 12) and marginal_v.confidence == 0.95
    assert family[("non_inferiority", "large")].verdict == "fail"
    assert family[("non_inferiority", "t0")].verdict == "pass"


def test_a_margin_floor_lets_a_low_scoring_task_show_non_inferiority():
    """10% of an 11% score is about one point, which 300 samples cannot show even with
    only 2 answers changing; a floor of 5 points can be shown, and the detail says which
    margin applied."""
    base = [1.0] * 33 + [0.0] * 267
    cand = [1.0] * 32 + [0.0] * 268  # one right answer lost ...
    cand[40] = 1.0  # ... and one gained: 2 of 300 pairs differ
    relative = QualityGates(non_inferiority_margin=0.1)
    _, _, vs = judge(rows(base), rows(cand), relative)
    assert by_gate(vs)["non_inferiority"] == "inconclusive"
    floored = QualityGates(non_inferiority_margin=0.1, non_inferiority_min_margin=0.05)
    _, _, vs = judge(rows(base), rows(cand), floored)
    [ni] = [v for v in vs if v.gate == "non_inferiority"]
    assert ni.verdict == "pass" and ni.limit == pytest.approx(-0.05) and "non_inferiority_min_margin" in ni.evidence
    # the floor never lowers a larger relative margin
    high = rows([1.0] * 270 + [0.0] * 30)
    _, _, vs = judge(high, high, floored)
    [ni] = [v for v in vs if v.gate == "non_inferiority"]
    assert ni.limit == pytest.approx(-0.09)


def test_a_task_that_could_not_run_is_a_required_gate_not_a_silence():
    """A task skipped for a short served context used to land only in the result's
    notes: a task, or a whole slice, vanished from the decision."""
    from quantlab.quality.gates import skipped_verdicts
    from quantlab.recipe.quality import QualitySpec
    from quantlab.release.decision import DecisionPolicy, decide

    spec = QualitySpec.model_validate({"task_gates": {"ql_off": {"disabled": True}}})
    vs = skipped_verdicts(spec, [("ql_passkey_1300w", "needs max_model_len >= 2048, served 512"),
                                 ("ql_off", "needs max_model_len >= 2048, served 512")])
    [v] = vs
    assert (v.gate, v.scope, v.verdict) == ("skipped", "ql_passkey_1300w", "inconclusive")
    assert "served 512" in v.evidence and "quality.tasks" in v.evidence
    for policy in (DecisionPolicy(), DecisionPolicy(not_shown="warn")):  # no warning lets it through
        d = decide(vs, policy).record
        assert d.decision == "not_shown" and d.not_shown_gates == ["quality.skipped@ql_passkey_1300w"]


def test_the_pooled_gate_sees_a_small_drop_spread_over_every_task():
    """Five tasks of 400 items each lose 4 points each: within every task's own margin
    (10% of a 0.6 score), but over all 2,000 items beyond the pooled gate's 2 points."""
    from quantlab.quality import gates as quality_gates
    from quantlab.quality.compare import paired_values, pooled_all
    from quantlab.recipe.quality import QualitySpec

    spec = QualitySpec.model_validate({})

    def paired(name):
        base = [1.0] * 240 + [0.0] * 160
        cand = [1.0] * 224 + [0.0] * 16 + [0.0] * 160  # 16 of 400 right answers lost: 4 points
        b_rows, c_rows = rows(base, prompt=name), rows(cand, prompt=name)
        cmp, _ = compare_task(name, name, "acc", None, True, b_rows, c_rows, confidence=0.95, iters=200, seed=0)
        _, bv, cv = paired_values(name, "acc", None, b_rows, c_rows)
        return cmp, bv, cv

    tasks = [paired(f"t{i}") for i in range(5)]
    everything = pooled_all([t[0] for t in tasks], {t[0].task: t[1:] for t in tasks}, confidence=0.95, iters=200,
                            seed=0)
    assert everything[0].n == 2000 and everything[0].tasks == [f"t{i}" for i in range(5)]
    vs = quality_gates.verdicts(spec, tasks, [], None, everything)
    by_scope = {v.scope: v.verdict for v in vs}
    assert all(by_scope[f"t{i}"] != "fail" for i in range(5))  # no task alone blocks
    assert by_scope["pooled"] == "fail"
    [p] = [v for v in vs if v.scope == "pooled"]
    assert p.margin == 0.02 and "quality.pooled.margin 0.02" in p.evidence
    assert "Bonferroni over 6 gated comparisons" in p.evidence
    off = QualitySpec.model_validate({"pooled": None})
    assert "pooled" not in {v.scope for v in quality_gates.verdicts(off, tasks, [], None, everything)}
