"""How far a performance figure can be trusted: intervals from the paired repeats, the
requests inside them, and the host's calibrated spread between repeats (pure: numpy and
scipy).

A gated figure (P99 TTFT, P99 TPOT, output tokens/s) comes from a few paired repeats,
each a few dozen to a few hundred requests. Two sources of noise move it: which requests
happened to be slow (within a repeat) and what the machine was doing (between repeats).

The bootstrap draws both, hierarchically: per draw, the repeats (paired baseline and
candidate blocks, measured next to each other) are resampled with replacement, and the
requests inside each chosen block are resampled too; the figure of each block is
recomputed, the candidate/baseline ratio taken per pair, and the median over the drawn
pairs kept. Quantiles of the draws give the interval. The bootstrap is left plain (no
stratifying by order): at 2-3 repeats its draws of pairs are the few pairs themselves,
and an uneven draw of the two orders only widens it; cancelling the order effect is the
t bound's job (below).

A P99 is numpy's linear percentile of a repeat's requests. The Harrell-Davis estimate
(every order statistic, Beta weights) was tried and measured noisier between repeats on
the committed A/A rows at 100 requests (P99 TPOT log-ratio SD 0.065 against 0.046; TTFT
equal): it puts about 63% of its weight on the slowest request. Throughput under
resampling: a point's wall time is scaled by the resampled mean end-to-end time over the
observed one (closed loop: the time to serve n requests at concurrency C is about
n x mean(E2E) / C), and the output tokens summed over the drawn requests. With no
resampling it equals the measured figure.

The spread between repeats enters a second way, because the requests of one repeat are
not independent draws: in closed loop they come in waves (a P99 TTFT at 8 in flight is
the prefill wait of one wave), and what moves the figure is the repeat. So each bound is
also a Student t bound on the per-repeat log ratios, and the interval is the wider of the
two on each side. The t bound's parts:

- centre: with both orders present (the stage alternates who goes first: repeat 0 the
  baseline, repeat 1 the candidate, ...) the mean of the two order groups' mean log
  ratios, whose variance factor is 1/(4 n1) + 1/(4 n2): an order (and core placement)
  effect cancels for any k >= 2. With one order only, the plain mean (factor 1/k).
- spread: a run of 2-3 repeats knows its own spread with 1-2 df, and t at 1 df is
  enormous. With `HostNoise` (the same figure's between-repeat log-ratio sum of squares
  measured on this host outside the run) the variance is pooled:
  s^2 = (SS_run + SS_host) / (df_run + df_host). SS_run is taken within the order groups
  (df k - 2) when both orders are present and k >= 3; at k = 2 (one of each) the order
  effect cannot be separated from the spread, so SS_run is taken about the mean (1 df,
  the order effect counted as spread, which errs wide).
- guard: the host's spread stands in for the run's only if the run is not noisier than
  calibrated: a one-sided F test of the run's variance against the host's (0.05). When
  it rejects, the host noise is not pooled and the run is judged on its own repeats, and
  the interval says why. With df_run 1 (two or three repeats) the test catches only a
  gross mismatch (against 20 host df: a run 2x noisier in SD is caught 31% of the time,
  3x 49%, 5x 68%); with one repeat it sees nothing, and the bound is the host's spread
  alone (a gate then may fail on it, never pass: performance/gates.py).
- on the run's own repeats (no host noise, or refused): SS about the plain mean, k - 1
  df (the order effect, if any, counted as spread: one df more is worth more here than
  purging it), around the same centre.

`Interval.noise_model` says in a sentence which of these judged, `between_df` the df the
t bound used (0: the bootstrap alone), `host_df` the df the host offered.

Limits, stated where the verdict is: a P99 from n requests carries about 1/n of the tail
in each; at 100 requests its per-repeat spread is mostly that of its top few requests,
and the host's calibration of that spread is only as good as its workload's likeness to
the run's.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np

from quantlab.performance.metrics import RequestRecord

# metrics whose value can be recomputed from per-request rows
RESAMPLED = ("output_tokens_per_s", "ttft_ms.p99", "tpot_ms.p99")


@dataclass(frozen=True)
class RepeatSample:
    """One server's requests at one workload point in one repeat (successful ones)."""

    ttft: np.ndarray  # seconds
    tpot: np.ndarray  # seconds; NaN for a request with fewer than two output tokens
    e2e: np.ndarray  # seconds
    tokens: np.ndarray  # output tokens
    wall_s: float

    @classmethod
    def of(cls, records: list[RequestRecord], wall_s: float) -> "RepeatSample":
        ok = [r for r in records if r.outcome == "ok" and r.ttft is not None and r.e2e is not None]
        return cls(ttft=np.array([r.ttft for r in ok], dtype=float),
                   tpot=np.array([np.nan if r.tpot is None else r.tpot for r in ok], dtype=float),
                   e2e=np.array([r.e2e for r in ok], dtype=float),
                   tokens=np.array([r.output_tokens or 0 for r in ok], dtype=float),
                   wall_s=float(wall_s))

    def figure(self, key: str, idx: np.ndarray) -> np.ndarray:
        """The metric over each row of request indices idx (draws x n); NaN where undefined."""
        if key == "output_tokens_per_s":
            mean_e2e = float(self.e2e.mean())
            wall = self.wall_s * self.e2e[idx].mean(axis=1) / mean_e2e
            return self.tokens[idx].sum(axis=1) / np.maximum(wall, 1e-9)
        values = {"ttft_ms.p99": self.ttft, "tpot_ms.p99": self.tpot}[key][idx] * 1000.0
        return row_percentile(values, 99)


def row_percentile(values: np.ndarray, q: float) -> np.ndarray:
    """numpy's linear percentile of each row, NaNs left out (NaN for a row of only NaNs).
    np.nanpercentile does the same about 60x slower on draws x requests arrays."""
    ordered = np.sort(values, axis=1)  # NaNs sort last
    count = np.sum(~np.isnan(values), axis=1)
    pos = np.maximum(count - 1, 0) * (q / 100.0)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, np.maximum(count - 1, 0))
    rows = np.arange(len(ordered))
    out = ordered[rows, lo] + (ordered[rows, hi] - ordered[rows, lo]) * (pos - lo)
    return np.where(count > 0, out, np.nan)


@contextmanager
def _quiet_all_nan():
    """nanpercentile warns on a row with no value (a draw of only one-token requests); that row is NaN, as meant."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _figure_draws(sample: RepeatSample, key: str, draws: int, rng: np.random.Generator) -> np.ndarray:
    n = len(sample.e2e)
    if n == 0:
        return np.full(draws, np.nan)
    return sample.figure(key, rng.integers(0, n, size=(draws, n)))


def ratio_draws(baseline: list[RepeatSample], candidate: list[RepeatSample], key: str, *, draws: int = 4000,
                seed: int = 0) -> np.ndarray | None:
    """Draws of median-over-repeats(candidate / baseline) for one metric, or None when no
    pair has the figure on both sides."""
    pairs = [(b, c) for b, c in zip(baseline, candidate, strict=False) if len(b.e2e) and len(c.e2e)]
    if not pairs:
        return None
    rng = np.random.default_rng(seed)
    with np.errstate(all="ignore"):
        per_pair = np.stack([_figure_draws(c, key, draws, rng) / _figure_draws(b, key, draws, rng)
                             for b, c in pairs], axis=1)  # draws x pairs
    return _median_of_drawn_repeats(per_pair, rng)


def value_draws(samples: list[RepeatSample], key: str, *, draws: int = 4000, seed: int = 0) -> np.ndarray | None:
    """Draws of median-over-repeats of one server's metric (for absolute limits)."""
    samples = [s for s in samples if len(s.e2e)]
    if not samples:
        return None
    rng = np.random.default_rng(seed)
    per_rep = np.stack([_figure_draws(s, key, draws, rng) for s in samples], axis=1)
    return _median_of_drawn_repeats(per_rep, rng)


def _median_of_drawn_repeats(per_rep: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    draws, reps = per_rep.shape
    pick = rng.integers(0, reps, size=(draws, reps)) if reps > 1 else np.zeros((draws, 1), dtype=int)
    chosen = np.take_along_axis(per_rep, pick, axis=1)
    with np.errstate(all="ignore"), _quiet_all_nan():
        out = np.nanmedian(chosen, axis=1)
    out = out[np.isfinite(out)]
    # a figure missing from most draws is not a figure to gate on
    return out if len(out) >= 0.9 * draws else None


def per_repeat_figures(baseline: list[RepeatSample], candidate: list[RepeatSample] | None, key: str) -> np.ndarray:
    """The measured figure of each repeat: candidate / baseline per pair (a ratio gate) or
    the one server's (candidate None). One entry per repeat, in repeat order, NaN where a
    repeat has no figure (so it lines up with the repeats' orders; interval() drops it)."""
    def measured(s: RepeatSample) -> float:
        return float(s.figure(key, np.arange(len(s.e2e))[None, :])[0]) if len(s.e2e) else np.nan

    if candidate is None:
        values = np.array([measured(s) for s in baseline], dtype=float)
    else:
        with np.errstate(all="ignore"):
            values = np.array([measured(c) / measured(b) for b, c in zip(baseline, candidate, strict=False)],
                              dtype=float)
    return np.where(np.isfinite(values) & (values > 0), values, np.nan)


@dataclass(frozen=True)
class HostNoise:
    """Evidence about one gated figure's between-repeat spread from outside this run (a
    calibration of this host, engine, model and workload; performance/noise_store.py),
    as log-ratio-equivalent sums of squares: `ss` over `df` degrees of freedom. Pooled
    with the run's own repeats, it lets a run of 2-3 repeats judge with tens of df.

    sources: one line per contribution, e.g. "12 A/A repeats (quantlab calibrate,
    2026-12-06)", "9 df from 9 earlier runs' baseline repeats"."""

    ss: float
    df: int
    sources: tuple[str, ...] = ()

    def __post_init__(self):
        if self.df < 0 or self.ss < 0:
            raise ValueError(f"HostNoise needs ss >= 0 and df >= 0, got ss={self.ss}, df={self.df}")

    @property
    def variance(self) -> float | None:
        return self.ss / self.df if self.df else None


# the homogeneity guard's level: a run noisier than calibrated at this one-sided level is judged on its own repeats
HOMOGENEITY_ALPHA = 0.05


@dataclass(frozen=True)
class RepeatSpread:
    """The t bound's parts from the per-repeat log ratios: the centre (log), its variance
    factor, and the variance estimate with its df; `model` says which judged."""

    centre: float
    factor: float
    variance: float
    df: int
    model: str
    host_df: int | None = None

    def bounds(self, alphas: tuple[float, ...]) -> list[tuple[float, float]] | None:
        """Per one-sided alpha, (low, high) on the figure's own scale; None without df."""
        from scipy.stats import t

        if self.df < 1:
            return None
        se = float(np.sqrt(self.variance * self.factor))
        return [(float(np.exp(self.centre - t.ppf(1 - a, self.df) * se)),
                 float(np.exp(self.centre + t.ppf(1 - a, self.df) * se))) for a in alphas]


def repeat_spread(figures: np.ndarray, *, host_noise: HostNoise | None = None,
                  orders: np.ndarray | None = None) -> RepeatSpread | None:
    """The centre and spread of the per-repeat figures (module docstring: order-balanced
    centre, host noise pooled unless the run is noisier than calibrated); None for no
    repeat with a figure. figures and orders line up by repeat; NaNs are dropped."""
    figures = np.asarray(figures, dtype=float)
    keep = np.isfinite(figures) & (figures > 0)
    logs = np.log(figures[keep])
    k = len(logs)
    if k == 0:
        return None
    ords = None if orders is None else np.asarray(orders)[keep]
    groups = [logs[ords == 1], logs[ords == -1]] if ords is not None else []
    balanced = len(groups) == 2 and all(len(g) for g in groups)
    if balanced:
        centre = float((groups[0].mean() + groups[1].mean()) / 2)
        factor = 1 / (4 * len(groups[0])) + 1 / (4 * len(groups[1]))
        how = f"order-balanced centre ({len(groups[0])} baseline-first, {len(groups[1])} candidate-first)"
    else:
        centre, factor, how = float(logs.mean()), 1.0 / k, "plain mean"
    own_ss, own_df = float(((logs - logs.mean()) ** 2).sum()), k - 1
    own = RepeatSpread(centre, factor, own_ss / own_df if own_df else 0.0, own_df,
                       f"run's own repeats: {own_df} df, {how}" if own_df else
                       "one repeat: the bootstrap alone (no spread between repeats to measure)",
                       host_df=host_noise.df if host_noise is not None else None)
    if host_noise is None or not host_noise.df:
        return own
    if balanced and k >= 3:  # the order effect estimated: spread within the order groups
        run_ss, run_df = float(sum(((g - g.mean()) ** 2).sum() for g in groups)), k - 2
    else:
        run_ss, run_df = own_ss, own_df
    refused = _noisier_than_calibrated(run_ss, run_df, host_noise)
    if refused:
        return RepeatSpread(centre, factor, own.variance, own.df, f"host noise not pooled: {refused}; {own.model}",
                            host_df=host_noise.df)
    df = run_df + host_noise.df
    where = "; ".join(host_noise.sources) or "source not recorded"
    return RepeatSpread(centre, factor, (run_ss + host_noise.ss) / df, df,
                        f"pooled: run {run_df} df + host {host_noise.df} df ({where}), {how}", host_df=host_noise.df)


def _noisier_than_calibrated(run_ss: float, run_df: int, host: HostNoise) -> str | None:
    """Why the run's spread cannot be pooled with the host's (one-sided F test), or None."""
    from scipy.stats import f

    if run_df < 1:
        return None  # nothing of the run's own to test: the host's spread stands alone
    run_var, host_var = run_ss / run_df, host.ss / host.df
    p = float(f.sf(run_var / host_var, run_df, host.df)) if host_var > 0 else (0.0 if run_var > 0 else 1.0)
    if p >= HOMOGENEITY_ALPHA:
        return None
    return (f"the run's spread (log-ratio sd {np.sqrt(run_var):.3g}, {run_df} df) is larger than calibrated "
            f"(sd {np.sqrt(host_var):.3g}, {host.df} df; F p={p:.2g}): the candidate, or the host today, is noisier "
            "than its calibration")


@dataclass(frozen=True)
class Interval:
    """A figure's interval (the bootstrap's, widened by the between-repeat t) at the two
    levels a gate uses: `pass_*` one-sided at the gate's confidence, `fail_*` one-sided at
    the family-adjusted confidence."""

    pass_low: float
    pass_high: float
    fail_low: float
    fail_high: float
    fail_alpha: float
    draws: int
    repeats: int
    requests: int  # the fewest successful requests behind one block's figure
    pass_alpha: float = 0.05  # one-sided, of the pass bounds (1 - confidence, split over the looks)
    between_df: int | None = None  # df the t bounds used: 0 for none (bootstrap only), None unasked
    between_widened: bool = False  # whether the t bounds were wider than the bootstrap's on some side
    noise_model: str | None = None  # which spread judged, in a sentence (RepeatSpread.model)
    host_df: int | None = None  # df the host's calibration offered (pooled or not); None when none was given
    centre: float | None = None  # the t bound's centre on the figure's scale (may differ from the reported median)

    def as_dict(self) -> dict:
        return asdict(self)


def interval(draws: np.ndarray, *, confidence: float, fail_alpha: float, repeats: int, requests: int,
             per_repeat: np.ndarray | None = None, host_noise: HostNoise | None = None,
             orders: np.ndarray | None = None) -> Interval:
    """The bootstrap's one-sided bounds, each widened to the between-repeat t bound where
    that is wider (per_repeat: the measured figure of each repeat, see per_repeat_figures;
    host_noise: the host's calibrated spread of the same figure; orders: +1 where the
    baseline went first in that repeat, -1 where the candidate did, see result.crossover_orders)."""
    a = 1.0 - confidence
    if per_repeat is not None:  # a repeat with no figure (every request failed) is not evidence: a pass needs two
        repeats = min(repeats, int(np.isfinite(np.asarray(per_repeat, dtype=float)).sum()))
    q = [float(x) for x in np.quantile(draws, [a, 1.0 - a, fail_alpha, 1.0 - fail_alpha])]
    spread = repeat_spread(per_repeat, host_noise=host_noise, orders=orders) if per_repeat is not None else None
    t_bounds = spread.bounds((a, fail_alpha)) if spread else None
    widened = False
    if t_bounds:
        (p_lo, p_hi), (f_lo, f_hi) = t_bounds
        wider = [min(q[0], p_lo), max(q[1], p_hi), min(q[2], f_lo), max(q[3], f_hi)]
        widened, q = wider != q, wider
    return Interval(pass_low=q[0], pass_high=q[1], fail_low=q[2], fail_high=q[3], fail_alpha=fail_alpha,
                    draws=len(draws), repeats=repeats, requests=requests, pass_alpha=a,
                    between_df=None if per_repeat is None else (spread.df if spread else 0), between_widened=widened,
                    noise_model=spread.model if spread else None,
                    host_df=host_noise.df if host_noise is not None else None,
                    centre=float(np.exp(spread.centre)) if spread else None)
