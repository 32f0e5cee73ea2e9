"""The performance intervals: figures recomputed from per-request rows, and what the
gates built on them do with an unchanged model and a slower one (simulated requests)."""

from __future__ import annotations

import numpy as np
import pytest

from quantlab.core.results import PerfPoint
from quantlab.performance.gates import verdicts
from quantlab.performance.metrics import RequestRecord, summarize
from quantlab.performance.noise import RepeatSample, interval, per_repeat_figures, ratio_draws, value_draws
from quantlab.recipe.performance import PerfGates


def requests(rng, n, *, ttft_s=0.2, tpot_s=0.05, tokens=32, slow=1.0, spread=0.3, tpot_spread=0.15):
    """n closed-loop requests with log-normal latencies (tpot_spread None: every TPOT the
    same, no draw for it); wall time as if one at a time."""
    out, t = [], 0.0
    for i in range(n):
        ttft = ttft_s * slow * rng.lognormal(0, spread)
        tpot = tpot_s * slow * (1.0 if tpot_spread is None else rng.lognormal(0, tpot_spread))
        e2e = ttft + tpot * (tokens - 1)
        out.append(RequestRecord(index=i, outcome="ok", sent_at=t, ttft=ttft, e2e=e2e, output_tokens=tokens))
        t += e2e
    return out, t


def test_unresampled_figures_are_the_measured_ones():
    rng = np.random.default_rng(1)
    recs, wall = requests(rng, 20)
    recs.append(RequestRecord(index=20, outcome="error", sent_at=0.0, status=500))  # not part of any figure
    recs.append(RequestRecord(index=21, outcome="ok", sent_at=0.0, ttft=0.1, e2e=0.1, output_tokens=1))  # no TPOT
    m = summarize(recs, wall_s=wall, slo={})
    s = RepeatSample.of(recs, wall)
    identity = np.arange(len(s.e2e))[None, :]
    assert s.figure("output_tokens_per_s", identity)[0] == pytest.approx(m["output_tokens_per_s"])
    assert s.figure("ttft_ms.p99", identity)[0] == pytest.approx(m["ttft_ms"]["p99"])
    assert s.figure("tpot_ms.p99", identity)[0] == pytest.approx(m["tpot_ms"]["p99"])


def pair_point(rng, *, slow=1.0, repeats=2, n=32, draws=1000, fail_alpha=0.05 / 3, seed=0, own_drift=0.0):
    """One point's paired repeats. drift: the machine, shared by the pair measured side by
    side; own_drift: each server's own repeat-level slowness (its requests move together)."""
    b, c = [], []
    for _ in range(repeats):
        drift = rng.lognormal(0, 0.05)
        b.append(RepeatSample.of(*requests(rng, n, slow=drift * rng.lognormal(0, own_drift))))
        c.append(RepeatSample.of(*requests(rng, n, slow=drift * slow * rng.lognormal(0, own_drift))))
    intervals = {}
    for key in ("output_tokens_per_s", "ttft_ms.p99", "tpot_ms.p99"):
        d = ratio_draws(b, c, key, draws=draws, seed=seed)
        intervals[f"ratio:{key}"] = interval(d, confidence=0.95, fail_alpha=fail_alpha, repeats=repeats,
                                             requests=n, per_repeat=per_repeat_figures(b, c, key)).as_dict()
    cmp = {k: {"ratio": float(np.median([
        c[i].figure(k, np.arange(n)[None])[0] / b[i].figure(k, np.arange(n)[None])[0] for i in range(repeats)]))}
        for k in ("output_tokens_per_s", "ttft_ms.p99", "tpot_ms.p99")}
    return PerfPoint(workload="w", point="c1", baseline={}, candidate={"error_rate": 0.0}, baseline_repeats=[{}] * repeats,
                     candidate_repeats=[{}] * repeats, comparison=cmp, monitor={}, intervals=intervals)


GATES = PerfGates(min_throughput_ratio=0.8, max_p99_ttft_ratio=1.5, max_p99_tpot_ratio=1.5, max_error_rate=None)


def test_an_unchanged_model_is_rarely_blocked_and_a_slower_one_is():
    """A/A: the same latency distribution on both sides, 200 simulated runs of 3 paired
    repeats x 100 requests (what a P99 gate needs to pass): the three gates together block
    at most 5% of runs and decide most. A candidate twice as slow is blocked in nearly
    every run, at 32 requests a repeat too. At 2 repeats the t bound has one degree of
    freedom: fewer runs are decided there, none blocked."""
    rng = np.random.default_rng(7)
    for repeats, decided in ((3, 0.8), (2, 0.25)):
        aa = [verdicts([pair_point(rng, seed=i, n=100, repeats=repeats)], GATES) for i in range(200)]
        assert sum(any(v.verdict == "fail" for v in vs) for vs in aa) / 200 <= 0.05
        passed = sum(all(v.verdict == "pass" for v in vs) for vs in aa)
        assert passed / 200 > decided, (repeats, passed)
    slow = [verdicts([pair_point(rng, slow=2.0, seed=i, repeats=3)], GATES) for i in range(60)]
    assert sum(any(v.verdict == "fail" for v in vs) for vs in slow) >= 57


def test_the_spread_between_repeats_widens_the_interval():
    """Requests of one repeat that move together, as measured in closed loop (TTFTs within
    a repeat 2% apart, each server's own repeat-level slowness 6%, not shared with its
    pair): at 2 repeats the request bootstrap alone holds the true ratio 1.0 in far fewer
    runs than its level says; with the between-repeat t bound the interval holds it at
    about its level. One repeat cannot pass a gate: its spread is unknown."""
    rng = np.random.default_rng(11)
    boot, widened = 0, 0
    for i in range(120):
        b, c = [], []
        for _ in range(2):
            b.append(RepeatSample.of(*requests(rng, 100, slow=rng.lognormal(0, 0.06), spread=0.02)))
            c.append(RepeatSample.of(*requests(rng, 100, slow=rng.lognormal(0, 0.06), spread=0.02)))
        d = ratio_draws(b, c, "ttft_ms.p99", draws=800, seed=i)
        alone = interval(d, confidence=0.95, fail_alpha=0.01, repeats=2, requests=100)
        both = interval(d, confidence=0.95, fail_alpha=0.01, repeats=2, requests=100,
                        per_repeat=per_repeat_figures(b, c, "ttft_ms.p99"))
        assert both.pass_low <= alone.pass_low and both.pass_high >= alone.pass_high and both.between_df == 1
        boot += alone.pass_low <= 1.0 <= alone.pass_high
        widened += both.pass_low <= 1.0 <= both.pass_high
    assert widened / 120 >= 0.85 and widened - boot >= 12, (boot, widened)
    one = pair_point(rng, repeats=1, n=100)
    vs = verdicts([one], GATES)
    assert all(v.verdict != "pass" for v in vs)
    assert any("a pass needs >= 2 paired repeats" in v.evidence for v in vs)
    # the reason is in the finding's first part, the one a run's summary line shows
    assert all("a pass needs >= 2 paired repeats" in v.evidence.split("; ")[0] for v in vs)
    assert one.intervals["ratio:ttft_ms.p99"]["between_df"] == 0


def test_interval_covers_the_true_ratio():
    """Coverage against known truth: candidate latency 1.3x the baseline's; the one-sided
    95% bounds of the P99 TPOT ratio hold 1.3 between them in about 90% of runs or more
    (percentile bootstrap of a P99 from 64 requests is known to run a little narrow)."""
    rng = np.random.default_rng(3)
    covered = 0
    for i in range(150):
        p = pair_point(rng, slow=1.3, repeats=3, n=64, draws=800, seed=i)
        iv = p.intervals["ratio:tpot_ms.p99"]
        covered += iv["pass_low"] <= 1.3 <= iv["pass_high"]
    assert covered / 150 >= 0.85


def test_value_draws_and_empty_sides():
    rng = np.random.default_rng(0)
    s = [RepeatSample.of(*requests(rng, 16)) for _ in range(2)]
    d = value_draws(s, "ttft_ms.p99", draws=500)
    assert d is not None and len(d) == 500 and (d > 0).all()
    empty = RepeatSample.of([RequestRecord(index=0, outcome="error", sent_at=0.0)], 1.0)
    assert ratio_draws([empty], [empty], "ttft_ms.p99") is None
    assert value_draws([empty], "ttft_ms.p99") is None
