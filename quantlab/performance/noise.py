"""How far a performance figure can be trusted: bootstrap intervals from the paired
repeats and the requests inside them (pure, numpy only).

A gated figure (P99 TTFT, P99 TPOT, output tokens/s) is a median over repeats, each
repeat a few dozen requests. Two sources of noise move it: which requests happened to
be slow (within a repeat) and what the machine was doing (between repeats). The
interval here draws both, hierarchically: per draw, the repeats (paired baseline and
candidate blocks, measured next to each other) are resampled with replacement, and the
requests inside each chosen block are resampled too; the figure of each block is
recomputed, the candidate/baseline ratio taken per pair, and the median over the drawn
pairs kept. Quantiles of the draws give the interval.

Throughput under resampling: a point's wall time is scaled by the resampled mean
end-to-end time over the observed one (closed loop: the time to serve n requests at
concurrency C is about n x mean(E2E) / C), and the output tokens summed over the drawn
requests. With no resampling it equals the measured figure.

The spread between repeats enters the interval a second way, because the requests of
one repeat are not independent draws: in closed loop they come in waves (a P99 TTFT at
8 in flight is the prefill wait of one wave, the same to a few ms for every request in
it), and what moves the figure is the repeat. Measured on 10 A/A runs (the same weights
on both servers, 2 repeats x 100 requests): the per-repeat log ratio of P99 TTFT had a
spread of 0.063 against 0.010 from resampling requests, and the bootstrap interval held
1.0 in 7 of 10. So each bound is also taken from Student's t over the paired repeats'
log ratios (k - 1 degrees of freedom, at the same one-sided level), and the interval is
the wider of the two. With one repeat there is no spread between repeats to measure:
the interval is the bootstrap's alone and `between_df` is 0 (a gate then cannot pass on
it; performance/gates.py).

Limits, stated where the verdict is: with n requests a P99 is set by its slowest one or
two, and a percentile bootstrap cannot draw a tail worse than the slowest request seen,
so a P99 interval from few requests is too narrow on its upper side; with two repeats
the t bound has one degree of freedom and is wide, which is the price of knowing the
spread from two measurements (adaptive repeats narrow it).
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
    the one server's (candidate None), finite values only."""
    def measured(s: RepeatSample) -> float:
        return float(s.figure(key, np.arange(len(s.e2e))[None, :])[0]) if len(s.e2e) else np.nan

    if candidate is None:
        values = np.array([measured(s) for s in baseline], dtype=float)
    else:
        with np.errstate(all="ignore"):
            values = np.array([measured(c) / measured(b) for b, c in zip(baseline, candidate, strict=False)],
                              dtype=float)
    return values[np.isfinite(values) & (values > 0)]


def between_repeat_bounds(figures: np.ndarray, alphas: tuple[float, ...]) -> list[tuple[float, float]] | None:
    """Per one-sided alpha, (low, high) for the figure from the spread of its per-repeat
    values: the geometric mean's Student t bounds, k - 1 degrees of freedom (None for fewer
    than two repeats)."""
    from scipy.stats import t

    k = len(figures)
    if k < 2:
        return None
    logs = np.log(figures)
    centre, se = float(logs.mean()), float(logs.std(ddof=1)) / np.sqrt(k)
    return [(float(np.exp(centre - t.ppf(1 - a, k - 1) * se)), float(np.exp(centre + t.ppf(1 - a, k - 1) * se)))
            for a in alphas]


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
    between_df: int | None = None  # df of the between-repeat t bounds: 0 for one repeat (bootstrap only), None unasked
    between_widened: bool = False  # whether the t bounds were wider than the bootstrap's on some side

    def as_dict(self) -> dict:
        return asdict(self)


def interval(draws: np.ndarray, *, confidence: float, fail_alpha: float, repeats: int, requests: int,
             per_repeat: np.ndarray | None = None) -> Interval:
    """The bootstrap's one-sided bounds, each widened to the between-repeat t bound where
    that is wider (per_repeat: the measured figure of each repeat, see per_repeat_figures)."""
    a = 1.0 - confidence
    q = [float(x) for x in np.quantile(draws, [a, 1.0 - a, fail_alpha, 1.0 - fail_alpha])]
    t_bounds = between_repeat_bounds(per_repeat, (a, fail_alpha)) if per_repeat is not None else None
    widened = False
    if t_bounds:
        (p_lo, p_hi), (f_lo, f_hi) = t_bounds
        wider = [min(q[0], p_lo), max(q[1], p_hi), min(q[2], f_lo), max(q[3], f_hi)]
        widened, q = wider != q, wider
    return Interval(pass_low=q[0], pass_high=q[1], fail_low=q[2], fail_high=q[3], fail_alpha=fail_alpha,
                    draws=len(draws), repeats=repeats, requests=requests, pass_alpha=a,
                    between_df=None if per_repeat is None else max(len(per_repeat) - 1, 0), between_widened=widened)
