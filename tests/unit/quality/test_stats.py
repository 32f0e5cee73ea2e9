"""The quality statistics against values worked out by hand and against simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quantlab.quality.stats import aggregate, kl_summary, mcnemar_exact, paired_bootstrap, top_token, topk_kl


def test_mcnemar_exact_on_a_hand_made_table():
    # 10 samples only the baseline got right, 2 only the candidate: 2 * P(X <= 2 | n=12, 1/2)
    assert mcnemar_exact(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert mcnemar_exact(2, 10) == pytest.approx(mcnemar_exact(10, 2))
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0


def test_bootstrap_interval_covers_the_true_difference_about_95_percent_of_the_time():
    rng = np.random.default_rng(7)
    true_diff, covered, sims, n = -0.1, 0, 200, 200
    for s in range(sims):
        base = rng.random(n) < 0.6
        # the candidate loses 10 points: it flips a right answer to wrong with the right probability
        cand = base & (rng.random(n) >= true_diff / -0.6)
        ci = paired_bootstrap(base.astype(float).tolist(), cand.astype(float).tolist(), iters=500, seed=s)
        covered += ci.low <= true_diff <= ci.high
    assert 0.90 <= covered / sims <= 0.99


def test_bootstrap_of_identical_answers_is_exactly_zero():
    values = [1.0, 0.0, 1.0, 1.0, 0.0] * 10
    ci = paired_bootstrap(values, list(values), iters=300)
    assert (ci.diff, ci.low, ci.high, ci.n) == (0.0, 0.0, 0.0, 50)


def test_ratio_metrics_are_aggregated_as_a_ratio_of_sums_then_transformed():
    # (loglikelihood, words) per document, as lm-eval keeps word_perplexity samples
    base = [(-10.0, 5.0), (-30.0, 10.0)]
    cand = [(-12.0, 5.0), (-33.0, 10.0)]
    assert aggregate(base) == pytest.approx(-40 / 15)
    ci = paired_bootstrap(base, cand, iters=200, transform=lambda x: math.exp(-x))
    assert ci.baseline == pytest.approx(math.exp(40 / 15)) and ci.candidate == pytest.approx(math.exp(45 / 15))
    assert ci.low <= ci.diff <= ci.high


def test_paired_bootstrap_refuses_unpaired_input():
    with pytest.raises(ValueError, match="differ in count"):
        paired_bootstrap([1.0, 0.0], [1.0])


def test_topk_kl_on_hand_computed_distributions():
    log = math.log
    p = {0: log(0.5), 1: log(0.3)}  # rest of the vocabulary: 0.2
    q = {0: log(0.4), 1: log(0.4)}  # rest: 0.2
    assert topk_kl(p, q) == pytest.approx(0.5 * log(0.5 / 0.4) + 0.3 * log(0.3 / 0.4))
    assert topk_kl(p, p) == pytest.approx(0.0, abs=1e-12)
    # token 1 is outside the candidate's top k: it gets the candidate's rest mass (0.1),
    # capped by the candidate's smallest listed probability (0.3)
    q2 = {0: log(0.6), 2: log(0.3)}
    expected = 0.5 * log(0.5 / 0.6) + 0.3 * log(0.3 / 0.1) + 0.2 * log(0.2 / (1 - 0.6 - 0.1))
    assert topk_kl(p, q2) == pytest.approx(expected)


def test_kl_summary_reports_what_llama_cpp_reports():
    s = kl_summary([0.0, 0.1, 0.2, 1.0], [True, True, False, True])
    assert s["tokens"] == 4 and s["mean"] == pytest.approx(0.325) and s["median"] == pytest.approx(0.15)
    assert s["same_top_rate"] == 0.75 and s["max"] == 1.0 and 0.2 < s["p99"] <= 1.0
    assert kl_summary([], [])["mean"] is None
    assert top_token({3: -0.1, 5: -2.0}) == 3


def _simulated_pairs(rng, n, p_base_only, p_cand_only):
    u = rng.random(n)
    both = u < 0.5
    base_only = (u >= 0.5) & (u < 0.5 + p_base_only)
    cand_only = (u >= 0.5 + p_base_only) & (u < 0.5 + p_base_only + p_cand_only)
    return (both | base_only).astype(float).tolist(), (both | cand_only).astype(float).tolist()


def test_the_pass_fail_interval_covers_the_true_difference_at_few_discordant_pairs():
    """Coverage by simulation against a known truth (half the samples right for both, the
    rest split into discordant and both-wrong at the given rates). Measured with 600
    trials: Newcombe 0.92-1.00 over n 20-200, the percentile bootstrap 0.63 at n = 20
    with a 5% one-sided discordance."""
    import numpy as np

    from quantlab.quality.stats import paired_bootstrap, paired_proportion_interval

    rng = np.random.default_rng(1)
    trials = 300
    for n in (20, 60):
        for p_base_only, p_cand_only in ((0.05, 0.0), (0.075, 0.025), (0.15, 0.05)):
            truth = p_cand_only - p_base_only
            covered = 0
            for _ in range(trials):
                b, c = _simulated_pairs(rng, n, p_base_only, p_cand_only)
                ci = paired_proportion_interval(b, c, confidence=0.95)
                covered += ci.low <= truth <= ci.high
            assert covered / trials >= 0.9, (n, p_base_only, p_cand_only, covered / trials)
    bootstrap = sum(paired_bootstrap(*_simulated_pairs(rng, 20, 0.05, 0.0), iters=300).low <= -0.05
                    for _ in range(trials)) / trials
    assert bootstrap < 0.8  # the interval the gates used before, for the same case


def test_newcombe_matches_the_worked_example():
    """Altman et al., Statistics with Confidence (2000), table 6.2: 14 pairs right for
    both, 5 right for one only, 22 for neither; Newcombe's interval, by the published
    formula (biostatUZH's confIntPairedProportion, Wilson without continuity correction)."""
    from quantlab.quality.stats import newcombe_interval

    base = [1.0] * 14 + [0.0] * 5 + [0.0] * 22
    cand = [1.0] * 14 + [1.0] * 5 + [0.0] * 22
    ci = newcombe_interval(base, cand, confidence=0.95)
    assert round(ci.diff, 4) == 0.122 and 0.0 < ci.low < 0.05 and 0.2 < ci.high < 0.25


def test_bca_interval_of_a_skewed_continuous_metric_covers_the_truth():
    """Per-sample scores from a skewed (log-normal) distribution, the candidate 5% lower
    on each: the paired BCa interval of the mean difference holds the true difference in
    about 95% of 200 simulated suites of 40 samples."""
    rng = np.random.default_rng(11)
    covered = 0
    for s in range(200):
        base = rng.lognormal(0.0, 1.0, 40)
        cand = base * 0.95 * rng.lognormal(0.0, 0.05, 40)
        true = float(np.mean(base * 0.95 * np.exp(0.05 ** 2 / 2)) - np.mean(base))  # given these prompts
        ci = paired_bootstrap(base.tolist(), cand.tolist(), iters=500, seed=s)
        covered += ci.low <= true <= ci.high
    assert 0.88 <= covered / 200 <= 0.99


def test_non_inferiority_errs_at_its_nominal_level_at_the_margin():
    """Exact enumeration over every (candidate-only, baseline-only) count: with the
    candidate truly worse by exactly the margin (p10 - p01 = margin), the gate passes
    at most 2.75% of the time at nominal 2.5%, over the grid the decision is used on.
    Newcombe's interval, used before, passed 4.8% at few, one-directional flips."""
    from quantlab.quality.stats import ni_pass_probability

    worst = 0.0
    for margin in (0.05, 0.0875):
        for p01 in (0.0, 0.01, 0.05, 0.10):
            for n in (50, 80, 200, 1000):
                p = ni_pass_probability(n, margin, p_cand_only=p01, p_base_only=p01 + margin, confidence=0.95)
                assert p <= 0.0275, (margin, p01, n, p)
                worst = max(worst, p)
    assert worst > 0.02  # not conservative to the point of no power: near nominal somewhere


def test_tango_interval_matches_the_score_test_it_inverts():
    """The interval's lower end is where the score statistic crosses z: a margin just
    inside it passes the test, just outside does not; no discordant pair in 100 spans
    +-z^2/(n + z^2)."""
    from quantlab.quality.stats import paired_proportion_interval, tango_z

    base = [1.0] * 60 + [1.0] * 8 + [0.0] * 3 + [0.0] * 29
    cand = [1.0] * 60 + [0.0] * 8 + [1.0] * 3 + [0.0] * 29
    ci = paired_proportion_interval(base, cand, confidence=0.95)
    assert ci.diff == pytest.approx(-0.05) and ci.low < -0.05 < ci.high
    assert tango_z(3, 8, 100, ci.low) == pytest.approx(1.959964, abs=1e-4)
    assert tango_z(3, 8, 100, ci.high) == pytest.approx(-1.959964, abs=1e-4)
    same = paired_proportion_interval([1.0] * 100, [1.0] * 100, confidence=0.95)
    assert same.low == pytest.approx(-1.959964 ** 2 / (100 + 1.959964 ** 2), abs=1e-6) == -same.high
