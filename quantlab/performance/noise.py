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

Limits, stated where the verdict is: with n requests a P99 is set by its slowest one or
two, and a percentile bootstrap cannot draw a tail worse than the slowest request seen,
so a P99 interval from few requests is too narrow on its upper side; one repeat has no
between-run spread to draw.
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


@dataclass(frozen=True)
class Interval:
    """A figure's bootstrap interval at the two levels a gate uses: `pass_*` one-sided at
    the gate's confidence, `fail_*` one-sided at the family-adjusted confidence."""

    pass_low: float
    pass_high: float
    fail_low: float
    fail_high: float
    fail_alpha: float
    draws: int
    repeats: int
    requests: int  # the fewest successful requests behind one block's figure
    pass_alpha: float = 0.05  # one-sided, of the pass bounds (1 - confidence, split over the looks)

    def as_dict(self) -> dict:
        return asdict(self)


def interval(draws: np.ndarray, *, confidence: float, fail_alpha: float, repeats: int, requests: int) -> Interval:
    a = 1.0 - confidence
    q = np.quantile(draws, [a, 1.0 - a, fail_alpha, 1.0 - fail_alpha])
    return Interval(pass_low=float(q[0]), pass_high=float(q[1]), fail_low=float(q[2]), fail_high=float(q[3]),
                    fail_alpha=fail_alpha, draws=len(draws), repeats=repeats, requests=requests, pass_alpha=a)
