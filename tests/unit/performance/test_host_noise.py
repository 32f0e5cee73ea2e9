"""The between-repeat t bound with the host's calibrated spread: pooling, the homogeneity
guard, the order-balanced centre, and what the gates do with them."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import t

from quantlab.core.results import PerfPoint
from quantlab.performance.gates import verdicts
from quantlab.performance.noise import (HostNoise, RepeatSample, interval, per_repeat_figures, ratio_draws,
                                        repeat_spread)
from quantlab.recipe.performance import PerfGates
from tests.unit.performance.test_noise import requests

def crossover_orders(repeats: int) -> np.ndarray:
    """The stage's alternation side by side: the baseline first in repeats 0, 2, ..., the candidate in 1, 3, ..."""
    return np.where(np.arange(repeats) % 2 == 0, 1, -1)


HOST = HostNoise(ss=20 * 0.04 ** 2, df=20, sources=("20 A/A repeats (calibration)",))


def test_the_host_noise_is_pooled_with_the_runs_repeats():
    """Two repeats (one of each order) and 20 host df: the t bound uses 21 df and the
    pooled variance; without host noise it uses the run's one df."""
    per = np.array([0.97, 1.03])
    logs = np.log(per)
    own = repeat_spread(per, orders=crossover_orders(2))
    assert own.df == 1 and own.model.startswith("run's own repeats: 1 df")
    pooled = repeat_spread(per, host_noise=HOST, orders=crossover_orders(2))
    run_ss = float(((logs - logs.mean()) ** 2).sum())
    assert pooled.df == 21 and pooled.variance == pytest.approx((run_ss + HOST.ss) / 21)
    assert pooled.factor == pytest.approx(0.5) and pooled.centre == pytest.approx(logs.mean())
    assert pooled.model.startswith("pooled: run 1 df + host 20 df (20 A/A repeats (calibration))")
    d = np.exp(np.random.default_rng(0).normal(logs.mean(), 0.001, 2000))  # a bootstrap narrower than either t
    iv = interval(d, confidence=0.95, fail_alpha=0.01, repeats=2, requests=100, per_repeat=per,
                  host_noise=HOST, orders=crossover_orders(2))
    half = t.ppf(0.99, 21) * np.sqrt(pooled.variance * 0.5)
    assert iv.between_df == 21 and iv.host_df == 20 and iv.noise_model == pooled.model
    assert iv.fail_high == pytest.approx(np.exp(logs.mean() + half)) and iv.between_widened
    alone = interval(d, confidence=0.95, fail_alpha=0.01, repeats=2, requests=100, per_repeat=per)
    assert alone.between_df == 1 and alone.host_df is None and alone.fail_high > 2 * iv.fail_high


def test_a_run_far_noisier_than_calibrated_is_judged_on_its_own_repeats():
    per = np.array([0.6, 1.0, 1.6])  # the two baseline-first repeats 0.98 apart in log against host sd 0.04
    s = repeat_spread(per, host_noise=HOST, orders=crossover_orders(3))
    assert s.df == 2 and s.host_df == 20  # its own k - 1, not 1 + 20
    assert s.model.startswith("host noise not pooled: the run's spread") and "larger than calibrated" in s.model
    assert "F p=" in s.model and "run's own repeats: 2 df" in s.model
    # as noisy as calibrated: pooled
    calm = repeat_spread(np.array([0.97, 1.0, 1.05]), host_noise=HOST, orders=crossover_orders(3))
    assert calm.df == 21 and calm.model.startswith("pooled: run 1 df + host 20 df")


def test_the_order_balanced_centre_cancels_a_planted_order_effect():
    """Baseline-first repeats read 10% slower than candidate-first ones (a placement or
    position effect), the true ratio 1: at k = 3 the plain mean is off by a third of the
    effect, the balanced centre is not; the spread within the order groups leaves it out."""
    delta = 0.1
    for k in (2, 3, 4, 5):
        orders = crossover_orders(k)
        per = np.exp(delta * orders)
        s = repeat_spread(per, orders=orders, host_noise=HOST)
        assert s.centre == pytest.approx(0.0, abs=1e-12), k
        n1, n2 = (orders == 1).sum(), (orders == -1).sum()
        assert s.factor == pytest.approx(1 / (4 * n1) + 1 / (4 * n2))
        if k >= 3:  # the order effect estimated: no spread left within the groups, k - 2 run df
            assert s.df == k - 2 + 20 and s.variance == pytest.approx(HOST.ss / s.df)
    assert abs(np.log(per[:3]).mean()) == pytest.approx(delta / 3)
    assert repeat_spread(per[:3]).centre == pytest.approx(delta / 3)  # no orders given: the plain mean
    # one order only (a single repeat, or repeats not alternated): the plain mean
    assert repeat_spread(np.array([1.1, 1.2]), orders=np.array([1, 1])).centre == pytest.approx(
        np.log([1.1, 1.2]).mean())


def demo_point(rng, *, slow, host_noise=None, repeats=2, n=100, fail_alpha=0.025 / 6):
    """A point of the demo's kind: the candidate `slow` times slower, each server's repeats
    their own few percent off (the pair's log ratio about sd 0.03, within the host's 0.04)."""
    b, c = [], []
    for _ in range(repeats):
        drift = rng.lognormal(0, 0.05)
        b.append(RepeatSample.of(*requests(rng, n, slow=drift * rng.lognormal(0, 0.02))))
        c.append(RepeatSample.of(*requests(rng, n, slow=drift * slow * rng.lognormal(0, 0.02))))
    orders = crossover_orders(repeats)
    intervals, cmp = {}, {}
    for key in ("output_tokens_per_s", "ttft_ms.p99", "tpot_ms.p99"):
        per = per_repeat_figures(b, c, key)
        intervals[f"ratio:{key}"] = interval(ratio_draws(b, c, key, draws=2000, seed=1), confidence=0.95,
                                             fail_alpha=fail_alpha, repeats=repeats, requests=n, per_repeat=per,
                                             host_noise=host_noise, orders=orders).as_dict()
        cmp[key] = {"ratio": float(np.median(per))}
    return PerfPoint(workload="w", point="c8", baseline={}, candidate={"error_rate": 0.0},
                     baseline_repeats=[{}] * repeats, candidate_repeats=[{}] * repeats, comparison=cmp, monitor={},
                     intervals=intervals)


GATES = PerfGates(min_throughput_ratio=0.8, max_p99_ttft_ratio=None, max_p99_tpot_ratio=None, max_error_rate=None)


def test_a_056x_throughput_at_two_repeats_is_blocked_with_host_noise_and_not_shown_without():
    """make demo's W4A16 throughput at 8 in flight: 0.56x against 0.8 at two repeats. On
    the run's one df the fail side reaches past 0.8 (not shown); pooled with 20 host df at
    sd 0.04 it is blocked, and the evidence names the noise model."""
    for seed in range(5):
        rng = np.random.default_rng(seed)
        state = rng.bit_generator.state
        alone = verdicts([demo_point(rng, slow=1 / 0.56)], GATES)[0]
        rng.bit_generator.state = state  # the same requests, judged with the host's spread
        pooled = verdicts([demo_point(rng, slow=1 / 0.56, host_noise=HOST)], GATES)[0]
        assert alone.value == pytest.approx(0.56, abs=0.03) and alone.value == pooled.value
        assert alone.verdict == "inconclusive", alone.evidence
        assert "noise model: run's own repeats: 1 df" in alone.evidence
        assert pooled.verdict == "fail", pooled.evidence
        assert "noise model: pooled: run 1 df + host 20 df" in pooled.evidence and "(21 df;" in pooled.evidence


def test_an_unchanged_model_passes_with_host_noise_at_two_repeats():
    """A/A at two repeats: with the host's 20 df the throughput gate passes in nearly every
    run, never fails, and its fail side is far narrower than on the run's one df (which
    passes often too here: its pass side is at 0.05, where t at 1 df is 6.3, not 75)."""
    rng = np.random.default_rng(9)
    alone, pooled = [], []
    for _ in range(40):
        state = rng.bit_generator.state
        alone.append(demo_point(rng, slow=1.0))
        rng.bit_generator.state = state
        pooled.append(demo_point(rng, slow=1.0, host_noise=HOST))
    alone_v, pooled_v = ([verdicts([p], GATES)[0].verdict for p in ps] for ps in (alone, pooled))
    assert "fail" not in alone_v + pooled_v
    assert pooled_v.count("pass") >= 38 and pooled_v.count("pass") >= alone_v.count("pass"), (alone_v, pooled_v)
    # the fail side, at 0.025 / 6: on one df it reaches far below 1, pooled it stays near
    fail_low = {name: np.median([p.intervals["ratio:output_tokens_per_s"]["fail_low"] for p in ps])
                for name, ps in (("alone", alone), ("pooled", pooled))}
    assert fail_low["pooled"] > 0.85 and fail_low["alone"] < 0.5, fail_low


def test_one_repeat_with_host_noise_may_fail_but_never_passes():
    """The host's spread gives one repeat a t bound, but one repeat cannot show the
    calibration holds for this run: a gate may fail on it, never pass."""
    rng = np.random.default_rng(3)
    fine = verdicts([demo_point(rng, slow=1.0, host_noise=HOST, repeats=1)], GATES)[0]
    assert fine.verdict == "inconclusive" and "a pass needs >= 2 paired repeats" in fine.evidence
    assert "pooled: run 0 df + host 20 df" in fine.evidence
    slow = verdicts([demo_point(rng, slow=2.0, host_noise=HOST, repeats=1)], GATES)[0]
    assert slow.verdict == "fail"


def test_a_verdict_never_passes_on_an_interval_that_does_not_hold_its_value():
    """The reported value (median of per-pair ratios) and the interval's centre (balanced
    mean of the per-repeat log ratios) may differ: the bounds are widened to hold the value."""
    gates = PerfGates(min_throughput_ratio=None, max_p99_ttft_ratio=1.5, max_p99_tpot_ratio=None, max_error_rate=None)
    iv = {"pass_low": 1.2, "pass_high": 1.45, "fail_low": 1.1, "fail_high": 1.6, "fail_alpha": 0.004, "draws": 4000,
          "repeats": 3, "requests": 100, "between_df": 21, "centre": 1.32,
          "noise_model": "pooled: run 1 df + host 20 df"}

    def judged(value):
        p = PerfPoint(workload="w", point="c8", baseline={}, candidate={"error_rate": 0.0}, baseline_repeats=[{}] * 3,
                      candidate_repeats=[{}] * 3, comparison={"ttft_ms.p99": {"ratio": value}}, monitor={},
                      intervals={"ratio:ttft_ms.p99": iv})
        return verdicts([p], gates)[0]

    assert judged(1.3).verdict == "pass" and "widened" not in judged(1.3).evidence
    v = judged(1.52)  # beyond the limit while the interval's pass bound is within it
    assert v.verdict == "inconclusive" and v.high == pytest.approx(1.52)
    assert "widened to hold the reported value; the interval's centre is 1.32" in v.evidence
    assert judged(1.05).verdict == "pass" and judged(1.05).low == pytest.approx(1.05)
    # an interval wholly beyond the limit, a value within it: not blocked
    iv.update(pass_low=1.6, pass_high=1.8, fail_low=1.55, fail_high=1.9)
    assert judged(1.45).verdict != "fail"


def test_a_repeat_with_no_figure_is_not_counted_towards_a_pass():
    """Two repeats measured, but every request of the second baseline block failed: one
    pair has a figure. With the host's spread its bound may be narrow, yet a pass needs two
    repeats with a figure, so the gate is not shown (and the interval says 1 repeat)."""
    rng = np.random.default_rng(4)
    b = [RepeatSample.of(*requests(rng, 100)), RepeatSample.of([], 10.0)]
    c = [RepeatSample.of(*requests(rng, 100)), RepeatSample.of(*requests(rng, 100))]
    key = "output_tokens_per_s"
    per = per_repeat_figures(b, c, key)
    assert np.isnan(per[1])
    iv = interval(ratio_draws(b, c, key, draws=2000, seed=1), confidence=0.95, fail_alpha=0.025 / 6, repeats=2,
                  requests=100, per_repeat=per, host_noise=HOST, orders=crossover_orders(2)).as_dict()
    assert iv["repeats"] == 1
    point = PerfPoint(workload="w", point="c8", baseline={}, candidate={"error_rate": 0.0},
                      baseline_repeats=[{}] * 2, candidate_repeats=[{}] * 2,
                      comparison={key: {"ratio": float(np.nanmedian(per))}}, monitor={},
                      intervals={f"ratio:{key}": iv})
    v = verdicts([point], GATES)[0]
    assert v.verdict == "inconclusive" and "a pass needs >= 2 paired repeats" in v.evidence


def test_the_dry_runs_decision_band_is_where_the_t_bound_meets_the_limit():
    """gates.decision_band forecasts, from the host's spread, the ratio a gate needs: a run
    whose two repeats spread as calibrated and centre exactly there has its t bound exactly
    at the limit (pass side and fail side)."""
    from quantlab.performance.gates import decision_band
    from quantlab.performance.noise import repeat_spread

    var, df, pass_alpha, fail_alpha = 0.054 ** 2, 8, 0.05, 0.025 / 6
    host = HostNoise(ss=var * df, df=df)
    pass_at, fail_at = decision_band(0.8, "min", variance=var, df=df + 1, repeats=2, pass_alpha=pass_alpha,
                                     fail_alpha=fail_alpha)
    assert fail_at < 0.8 < pass_at
    d = np.sqrt(var / 2)  # two repeats whose own spread is the host's: the pooled variance stays var
    for centre, side, alpha in ((pass_at, 0, pass_alpha), (fail_at, 1, fail_alpha)):
        per = np.array([centre * np.exp(d), centre * np.exp(-d)])
        spread = repeat_spread(per, host_noise=host, orders=crossover_orders(2))
        (low, high), = spread.bounds((alpha,))
        assert (low if side == 0 else high) == pytest.approx(0.8, rel=1e-9)
    # a max gate mirrors it
    p_max, f_max = decision_band(1.5, "max", variance=var, df=df + 1, repeats=2, pass_alpha=pass_alpha,
                                 fail_alpha=fail_alpha)
    assert p_max < 1.5 < f_max and p_max * f_max == pytest.approx(1.5 ** 2 * 0.8 ** 2 / (pass_at * fail_at))
