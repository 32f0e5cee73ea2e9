"""Paired statistics for the quality stage: pure functions over per-sample values.

Baseline and candidate answer the same prompts, so every comparison is paired:
- pass/fail metrics: exact McNemar test on the discordant pairs, and Tango's score
  interval (Stat. Med. 1998;17:891) for the difference of the paired proportions: the
  inversion of the score test the non-inferiority gates run, whose error at the margin
  stays at its nominal level (exact enumeration: at most 2.50% at nominal 2.5% over
  n 50-1000), where Newcombe's hybrid interval passed 4.8% at few, one-directional
  flips, and a bootstrap interval collapses to [0, 0] at zero discordance;
- other metrics: a paired BCa bootstrap confidence interval (scipy) of the
  candidate-minus-baseline difference (resampling prompts, so the baseline/candidate
  pairing is kept);
- next-token distributions: KL divergence of the candidate from the baseline on the
  top-k log-probabilities both servers return, with the mass outside the top k kept
  as one "rest" bucket (what a top-k API allows; llama.cpp's KL mode sees the whole
  vocabulary).

A per-sample value is a number, or a (numerator, denominator) pair for metrics that
lm-eval aggregates as a ratio of sums (perplexities weighted by words or bytes).
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

Value = float | tuple[float, float]


def mcnemar_exact(base_only: int, cand_only: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts: base_only samples the
    baseline got right and the candidate wrong, cand_only the reverse."""
    from scipy.stats import binomtest

    n = base_only + cand_only
    if n == 0:
        return 1.0
    return float(binomtest(min(base_only, cand_only), n, 0.5, alternative="two-sided").pvalue)


def _as_arrays(values: Sequence[Value]) -> tuple[np.ndarray, np.ndarray]:
    num = np.array([v[0] if isinstance(v, (tuple, list)) else v for v in values], dtype=float)
    den = np.array([v[1] if isinstance(v, (tuple, list)) else 1.0 for v in values], dtype=float)
    return num, den


def aggregate(values: Sequence[Value]) -> float:
    """The task score from per-sample values: a mean, or a ratio of sums for pairs."""
    num, den = _as_arrays(values)
    return float(num.sum() / den.sum()) if den.sum() else float("nan")


@dataclass(frozen=True)
class PairedInterval:
    baseline: float
    candidate: float
    diff: float  # candidate - baseline, on the metric's own scale
    low: float  # confidence interval of diff
    high: float
    confidence: float
    n: int


def paired_bootstrap(base: Sequence[Value], cand: Sequence[Value], *, iters: int = 2000, confidence: float = 0.95,
                     seed: int = 0, transform=None) -> PairedInterval:
    """BCa bootstrap CI (scipy.stats.bootstrap, paired) of aggregate(cand) -
    aggregate(base), resampling sample indices jointly. `transform` maps an aggregate
    before differencing (e.g. a perplexity from a mean log-likelihood). BCa corrects the
    percentile interval's bias and skew (a perplexity difference is skewed); where every
    resample gives the same difference (identical answers) the interval is that point."""
    from scipy.stats import bootstrap

    if len(base) != len(cand):
        raise ValueError(f"paired samples differ in count: {len(base)} baseline vs {len(cand)} candidate")
    if not base:
        raise ValueError("no samples to compare")
    f = np.vectorize(transform) if transform else (lambda x: x)
    bn, bd = _as_arrays(base)
    cn, cd = _as_arrays(cand)
    if not all(np.isfinite(a).all() for a in (bn, bd, cn, cd)):
        raise ValueError("a per-sample value is not a finite number: it cannot be resampled")
    point_b, point_c = float(f(bn.sum() / bd.sum())), float(f(cn.sum() / cd.sum()))

    def difference(b_num, b_den, c_num, c_den, axis=-1):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return f(c_num.sum(axis) / c_den.sum(axis)) - f(b_num.sum(axis) / b_den.sum(axis))

    n = len(base)
    if n < 2:
        return PairedInterval(point_b, point_c, point_c - point_b, point_c - point_b, point_c - point_b,
                              confidence, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on a degenerate distribution; handled below
        res = bootstrap((bn, bd, cn, cd), difference, paired=True, vectorized=True, n_resamples=iters,
                        confidence_level=confidence, method="BCa", rng=np.random.default_rng(seed))
    diffs = res.bootstrap_distribution
    if not np.isfinite(diffs).all():  # dropping them would narrow the interval without saying so
        raise ValueError(f"{int((~np.isfinite(diffs)).sum())} of {iters} bootstrap resamples gave a difference that "
                         "is not a finite number (a zero denominator, or a transform that overflows)")
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if np.ptp(diffs) == 0:
        low = high = float(diffs[0])
    elif not (np.isfinite(low) and np.isfinite(high)):  # BCa undefined (e.g. a constant jackknife): percentiles
        alpha = (1 - confidence) / 2
        low, high = (float(x) for x in np.quantile(diffs, [alpha, 1 - alpha]))
    return PairedInterval(point_b, point_c, point_c - point_b, low, high, confidence, n)


def is_binary(values: Sequence[Value]) -> bool:
    return bool(values) and all(not isinstance(v, tuple) and v in (0.0, 1.0) for v in values)


def newcombe_interval(base: Sequence[Value], cand: Sequence[Value], *, confidence: float = 0.95
                      ) -> PairedInterval:
    """Newcombe's hybrid score interval (Stat. Med. 1998;17:2635, method 10), which the
    gates used before Tango's: kept to show, in the tests and the error-rate benchmark,
    why it was replaced (anti-conservative at few, one-directional flips)."""
    from scipy.stats import binomtest

    n, both, cand_only, base_only, neither = _paired_counts(base, cand)
    p1, p2 = (both + cand_only) / n, (both + base_only) / n  # candidate, baseline

    def wilson(k: int) -> tuple[float, float]:
        ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
        return float(ci.low), float(ci.high)

    (l1, u1), (l2, u2) = wilson(both + cand_only), wilson(both + base_only)
    margins = (both + cand_only) * (base_only + neither) * (both + base_only) * (cand_only + neither)
    b = both * neither - cand_only * base_only
    c = b - n / 2 if b > n / 2 else (b if b < 0 else 0.0)
    phi = c / math.sqrt(margins) if margins > 0 else 0.0
    d = p1 - p2
    low = d - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = d + math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    return PairedInterval(p2, p1, d, max(-1.0, low), min(1.0, high), confidence, n)


def _paired_counts(base: Sequence[Value], cand: Sequence[Value]) -> tuple[int, int, int, int, int]:
    """(n, both right, candidate only, baseline only, neither) of paired pass/fail samples."""
    if len(base) != len(cand):
        raise ValueError(f"paired samples differ in count: {len(base)} baseline vs {len(cand)} candidate")
    if not base:
        raise ValueError("no samples to compare")
    n = len(base)
    both = sum(1 for x, y in zip(base, cand) if x and y)
    cand_only = sum(1 for x, y in zip(base, cand) if y and not x)
    base_only = sum(1 for x, y in zip(base, cand) if x and not y)
    return n, both, cand_only, base_only, n - both - cand_only - base_only


def tango_z(cand_only, base_only, n: int, d0: float):
    """Tango's score statistic for H0: p(candidate right) - p(baseline right) = d0, from
    the discordant counts (numbers or numpy arrays of the same shape). Large positive:
    the candidate is better than d0; it depends on the pairs only through the two
    discordant counts and n. Variance from the restricted maximum-likelihood estimate of
    the baseline-only cell under H0 (a closed-form quadratic root)."""
    b = np.asarray(cand_only, dtype=float)
    c = np.asarray(base_only, dtype=float)
    a2 = 2.0 * n
    b2 = -b - c + (2.0 * n - b + c) * d0
    c2 = -c * d0 * (1.0 - d0)
    p21 = (np.sqrt(np.maximum(b2 * b2 - 4.0 * a2 * c2, 0.0)) - b2) / (2.0 * a2)
    var = n * (2.0 * p21 + d0 * (1.0 - d0))
    num = b - c - n * d0
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 1e-12, num / np.sqrt(np.maximum(var, 1e-12)), np.sign(num) * np.inf)
    z = np.where(np.isnan(z), 0.0, z)
    return float(z) if z.ndim == 0 else z


def interval_z(confidence: float) -> float:
    """The two-sided interval's normal quantile (each side at (1 - confidence) / 2)."""
    from scipy.stats import norm

    return float(norm.ppf(1 - (1 - confidence) / 2))


def tango_bounds(cand_only: int, base_only: int, n: int, confidence: float) -> tuple[float, float]:
    """Tango's score interval of p(candidate) - p(baseline): the d0 where the score
    statistic crosses +-z (it falls as d0 rises)."""
    from scipy.optimize import brentq

    z = interval_z(confidence)
    lo_end, hi_end = -1 + 1e-9, 1 - 1e-9

    def root(target: float) -> float:
        f = lambda d0: tango_z(cand_only, base_only, n, d0) - target  # noqa: E731
        if f(lo_end) < 0:
            return lo_end
        if f(hi_end) > 0:
            return hi_end
        return float(brentq(f, lo_end, hi_end, xtol=1e-10))

    return max(-1.0, root(z)), min(1.0, root(-z))


def paired_proportion_interval(base: Sequence[Value], cand: Sequence[Value], *, confidence: float = 0.95
                               ) -> PairedInterval:
    """Tango's score interval for p(candidate right) - p(baseline right) over paired
    pass/fail samples. With no discordant pair in n samples it still spans about
    +-z^2/(n + z^2) (3.7 points at n = 100)."""
    n, both, cand_only, base_only, _ = _paired_counts(base, cand)
    low, high = tango_bounds(cand_only, base_only, n, confidence)
    p1, p2 = (both + cand_only) / n, (both + base_only) / n  # candidate, baseline
    return PairedInterval(p2, p1, p1 - p2, low, high, confidence, n)


EXACT_MAX_N = 2000  # past this, the planner's probabilities use the normal approximation (the grid is n^2 / 2)


def ni_pass_probability(n: int, margin: float, p_cand_only: float, p_base_only: float,
                        confidence: float) -> float:
    """P(the non-inferiority gate passes) when the pairs fall into candidate-only and
    baseline-only at these rates: exact, summed over every (candidate-only,
    baseline-only) count of n pairs (a trinomial), the gate passing where Tango's lower
    bound at `confidence` is above -margin (the score statistic at -margin above z)."""
    if n > EXACT_MAX_N:
        return _normal_probability(n, margin, p_cand_only, p_base_only, confidence, side="pass")
    z = score_z_grid(n, round(-margin, 12))
    return _trinomial_mass(n, p_cand_only, p_base_only, z > interval_z(confidence))


def ni_fail_probability(n: int, margin: float, p_cand_only: float, p_base_only: float,
                        confidence: float) -> float:
    """P(the gate fails): the whole interval at `confidence` (the fail side's) below -margin."""
    if n > EXACT_MAX_N:
        return _normal_probability(n, margin, p_cand_only, p_base_only, confidence, side="fail")
    z = score_z_grid(n, round(-margin, 12))
    return _trinomial_mass(n, p_cand_only, p_base_only, z < -interval_z(confidence))


def _normal_probability(n: int, margin: float, p1: float, p2: float, confidence: float, *, side: str) -> float:
    """The score test's pass (or fail) probability by the normal approximation: the
    difference of the discordant rates, with its variance at the true rates."""
    from scipy.stats import norm

    delta = p1 - p2
    sd = math.sqrt(max(1e-12, (p1 + p2 - delta * delta) / n))
    z = interval_z(confidence)
    return float(norm.sf((-margin - delta) / sd + z) if side == "pass" else norm.cdf((-margin - delta) / sd - z))


@functools.lru_cache(maxsize=4)
def _counts_grid(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(candidate-only, baseline-only, the rest, log multinomial coefficient, valid) over n pairs."""
    from scipy.special import gammaln

    i = np.arange(n + 1)[:, None].astype(float)
    j = np.arange(n + 1)[None, :].astype(float)
    ok = i + j <= n
    k = np.where(ok, n - i - j, 0.0)
    coef = gammaln(n + 1) - gammaln(i + 1) - gammaln(j + 1) - gammaln(k + 1)
    return np.broadcast_to(i, ok.shape), np.broadcast_to(j, ok.shape), k, coef, ok


@functools.lru_cache(maxsize=8)
def score_z_grid(n: int, d0: float) -> np.ndarray:
    i, j, _, _, _ = _counts_grid(n)
    return tango_z(i, j, n, d0)


def _trinomial_mass(n: int, p1: float, p2: float, where: np.ndarray) -> float:
    from scipy.special import xlogy

    i, j, k, coef, ok = _counts_grid(n)
    rest = max(0.0, 1.0 - p1 - p2)
    logp = coef + xlogy(i, p1) + xlogy(j, p2) + xlogy(k, rest)
    return float(np.exp(logp[ok & where]).sum())


def paired_interval(base: Sequence[Value], cand: Sequence[Value], *, confidence: float, iters: int, seed: int,
                    transform=None) -> PairedInterval:
    """The interval a gate judges: Tango's for pass/fail samples, else the bootstrap."""
    if transform is None and is_binary(base) and is_binary(cand):
        return paired_proportion_interval(base, cand, confidence=confidence)
    return paired_bootstrap(base, cand, iters=iters, confidence=confidence, seed=seed, transform=transform)


def topk_kl(base: dict[int, float], cand: dict[int, float]) -> float:
    """KL(baseline || candidate) in nats for one position, from top-k log-probabilities
    (token id -> logprob). The support is the baseline's top k plus one bucket for the
    rest of the vocabulary. A baseline token missing from the candidate's top k gets an
    equal share of the candidate's rest mass, but at most the candidate's smallest
    listed probability (it ranked below all of them)."""
    p = {t: math.exp(lp) for t, lp in base.items()}
    q_listed = {t: math.exp(lp) for t, lp in cand.items()}
    q_rest = max(0.0, 1.0 - sum(q_listed.values()))
    missing = [t for t in p if t not in q_listed]
    floor = min(q_listed.values()) if q_listed else 1.0
    share = min(floor, q_rest / len(missing)) if missing else 0.0
    q = {t: q_listed.get(t, share) for t in p}
    p_rest = max(0.0, 1.0 - sum(p.values()))
    q_rest_left = max(0.0, 1.0 - sum(q.values()))
    eps = 1e-12
    kl = sum(pt * (math.log(max(pt, eps)) - math.log(max(q[t], eps))) for t, pt in p.items() if pt > 0)
    if p_rest > eps:
        kl += p_rest * (math.log(p_rest) - math.log(max(q_rest_left, eps)))
    return max(0.0, kl)


def top_token(dist: dict[int, float]) -> int | None:
    return max(dist, key=dist.get) if dist else None


def kl_summary(per_token_kl: Sequence[float], same_top: Sequence[bool]) -> dict[str, float | int | None]:
    """What llama.cpp's KL-divergence mode reports: mean, median and P99 of per-token KL,
    and how often the two models' most likely next token is the same."""
    if not per_token_kl:
        return {"tokens": 0, "mean": None, "median": None, "p99": None, "max": None, "same_top_rate": None}
    arr = np.asarray(per_token_kl, dtype=float)
    return {"tokens": int(arr.size), "mean": float(arr.mean()), "median": float(np.median(arr)),
            "p99": float(np.quantile(arr, 0.99)), "max": float(arr.max()),
            "same_top_rate": float(np.mean(same_top)) if len(same_top) else None}


_z, _z_grid = interval_z, score_z_grid  # the names scripts/bench_warn_at_margin.py reads
