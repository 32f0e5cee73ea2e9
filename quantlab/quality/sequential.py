"""Evaluate until decided (`quality.samples: auto`), the pure part: how each task's
sample grows from look to look, the nominal level each look is judged at, and which
tasks are decided.

The design: a group-sequential test on each side of each gate. A task with N samples
available is looked at after `first`, `first x growth`, ... samples and finally after
all N: K looks at information t_k = n_k / N. Each side of a gate's interval is a
one-sided test at alpha = (1 - c) / 2 (c its confidence), and the looks spend it with
the O'Brien-Fleming-type function of Lan and DeMets, A(t) = 2 - 2 Phi(z_(1-alpha/2) /
sqrt(t)) (gsDesign's sfLDOF): early looks spend almost nothing (only a clear case stops
there), the last look most of it. The boundary: look k's critical value z_k makes the
chance of a first crossing at look k, under the null, equal A(t_k) - A(t_(k-1)), with
the looks' statistics jointly normal (corr sqrt(t_i / t_j), independent increments),
found by the recursive numerical integration of Armitage, McPherson and Rowe (1969).
Look k is then judged at the nominal level 1 - Phi(z_k): an interval at confidence
1 - 2 (1 - Phi(z_k)). The nominal levels add up to more than alpha (the looks are
correlated, so a path that crosses late has mostly been near the boundary before); the
chance that any look crosses is alpha. Each look judged at its increment alone, as
before, is a union bound (Bonferroni over the increments): valid, but the last look of
40 / 80 / 160 / 320 / 400 samples was judged at z 2.30 where the boundary's is 2.03.

The gates' statistics are discrete (Tango score bounds on counts), so the normal
boundary is an approximation there; docs/decisions.md gives the false-release rate it
gives at the margin, simulated (scripts/bench_gate_error_rates.py --samples auto).
Slices and the pooled gate, whose members stop at different looks, keep the Bonferroni
split over the most looks of a member task (look_confidence): their looks are not one
sequence of nested samples. A task stops at the first look where none of its gates, nor
its slice's, is inconclusive, or when its data runs out."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import lru_cache

from quantlab.core.verdicts import GateVerdict

RULE = ("each side of a task's interval a one-sided test at (1 - confidence) / 2, spent over its looks by a "
        "Lan-DeMets O'Brien-Fleming-type boundary (gsDesign's sfLDOF; the looks jointly normal, corr "
        "sqrt(t_i / t_j)): look k judged at the nominal level whose first crossing spends A(t_k) - A(t_(k-1)); "
        "slices and the pooled gate split 1 - confidence over the most looks of a member task (Bonferroni)")
_LOW = -12.0  # the integration's lower end (a z below it carries under 1e-32 of the mass)
_HIGH = 12.0  # a boundary above it is taken as never crossed there


def schedule(available: int, first: int, growth: float) -> list[int]:
    """Cumulative sample counts at each look: first, first x growth, ..., available."""
    if available <= first:
        return [available]
    sizes, n = [], float(first)
    while int(n) < available:
        if not sizes or int(n) > sizes[-1]:  # a small first x growth repeats a size: one look at it
            sizes.append(int(n))
        n *= growth
    return sizes + [available]


def look_confidence(confidence: float, looks: int) -> float:
    """Bonferroni: the confidence every look is judged at, so all looks together keep
    `confidence` (slices and the pooled gate)."""
    return 1 - (1 - confidence) / max(1, looks)


def spending(alpha: float, t: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending (sfLDOF): the one-sided alpha spent by information t."""
    from scipy.stats import norm

    if t <= 0:
        return 0.0
    if t >= 1:
        return alpha
    return float(min(alpha, 2 - 2 * norm.cdf(norm.ppf(1 - alpha / 2) / math.sqrt(t))))


def _simpson(lo: float, hi: float, step: float):
    """Simpson's rule on [lo, hi]: the nodes and their weights."""
    import numpy as np

    m = max(2, int(math.ceil((hi - lo) / step)))
    m += m % 2
    z = np.linspace(lo, hi, m + 1)
    w = np.ones(m + 1)
    w[1:-1:2], w[2:-1:2] = 4, 2
    return z, w * (hi - lo) / (3 * m)


@lru_cache(maxsize=256)
def boundary(alpha: float, times: tuple[float, ...]) -> tuple[float, ...]:
    """The one-sided critical z of each look at information `times` (increasing, the last
    1), so that under the null the first crossing at look k has chance A(t_k) -
    A(t_(k-1)) and any crossing alpha. Recursive numerical integration (Armitage,
    McPherson and Rowe; Jennison and Turnbull, ch. 19): the density of Z_k on the paths
    that have not crossed, carried from look to look on a Simpson grid. Agrees with
    gsDesign's published bounds to 1e-6 (tests/unit/quality/test_sequential.py)."""
    import numpy as np
    from scipy.optimize import brentq
    from scipy.stats import norm

    out: list[float] = []
    z = weighted = None  # nodes, and density x weight, of the paths still going after the last look
    before_t = before_a = 0.0
    for t in times:
        spend = spending(alpha, t) - before_a
        before_a += spend
        if z is None:
            b = float(norm.isf(spend)) if spend > 0 else math.inf
        else:
            sd = math.sqrt(t - before_t)

            def crossing(b: float, z=z, weighted=weighted, sd=sd, t=t, t0=before_t) -> float:
                return float(np.dot(weighted, norm.sf((b * math.sqrt(t) - z * math.sqrt(t0)) / sd)))

            b = brentq(lambda b: crossing(b) - spend, -10.0, 40.0, xtol=1e-10) if spend > 1e-300 else math.inf
        top = min(b, _HIGH)
        if z is None:
            z, w = _simpson(_LOW, top, 0.01)
            weighted = w * norm.pdf(z)
        else:
            sd = math.sqrt(t - before_t)
            new, w = _simpson(_LOW, top, min(0.01, sd / math.sqrt(t) / 8))  # finer where looks are close
            kernel = norm.pdf((new[:, None] * math.sqrt(t) - z[None, :] * math.sqrt(before_t)) / sd)
            z, weighted = new, w * (kernel @ weighted) * math.sqrt(t) / sd
        out.append(b)
        before_t = t
    return tuple(out)


def nominal_levels(alpha: float, plan: Sequence[int]) -> list[float]:
    """Each look's one-sided nominal level under the boundary (1 - Phi(z_k))."""
    from scipy.stats import norm

    times = tuple(size / plan[-1] for size in plan)
    return [float(norm.sf(z)) for z in boundary(alpha, times)]


def look_of(plan: Sequence[int], n: int) -> int:
    """The look (0-based) whose sample a task of n answered samples reached."""
    return next((i for i, size in enumerate(plan) if size >= n), len(plan) - 1)


def boundary_confidence(confidence: float, plan: Sequence[int], n: int) -> float:
    """The two-sided confidence of a task's interval at its look at n samples: each side
    at that look's nominal level of a one-sided boundary at (1 - confidence) / 2."""
    if len(plan) <= 1:
        return confidence
    level = nominal_levels((1 - confidence) / 2, tuple(plan))[look_of(plan, n)]
    return 1 - 2 * max(5e-13, level)  # an interval's quantile stays finite


def sequential_ni_probability(plan: Sequence[int], margin: float, p_cand_only: float, p_base_only: float,
                              confidence: float, fail_confidence: float | None = None) -> tuple[float, float]:
    """(P(pass), P(fail)) of one non-inferiority gate judged look by look at `plan`'s
    sizes, stopping at its first pass or fail, when each pair is candidate-only or
    baseline-only at these rates: exact, the discordant counts' distribution carried from
    look to look (a trinomial added per look) and the paths that crossed removed, each
    look judged by the gates' own score test at its boundary level (boundary_confidence;
    the fail side's from `fail_confidence`, none when None). Past stats.EXACT_MAX_N items
    the last look alone, by the normal approximation (a slight underestimate of the pass
    chance). With a stopping rule that also waits on other gates a task can be judged at
    a later look than its first crossing; any look's crossing is within the boundary's
    alpha either way."""
    import numpy as np
    from scipy.signal import fftconvolve
    from scipy.special import gammaln, xlogy

    from quantlab.quality.stats import (EXACT_MAX_N, interval_z, ni_fail_probability, ni_pass_probability,
                                        score_z_grid)

    if plan[-1] > EXACT_MAX_N or len(plan) <= 1:
        conf = boundary_confidence(confidence, plan, plan[-1])
        fail = 0.0 if fail_confidence is None else ni_fail_probability(
            plan[-1], margin, p_cand_only, p_base_only, boundary_confidence(fail_confidence, plan, plan[-1]))
        return ni_pass_probability(plan[-1], margin, p_cand_only, p_base_only, conf), fail
    rest = max(0.0, 1.0 - p_cand_only - p_base_only)
    alive = np.ones((1, 1))
    passed = failed = 0.0
    before = 0
    for n in plan:
        m = n - before
        i = np.arange(m + 1)[:, None].astype(float)
        j = np.arange(m + 1)[None, :].astype(float)
        k = m - i - j
        ok = k >= 0
        logp = (gammaln(m + 1) - gammaln(i + 1) - gammaln(j + 1) - gammaln(np.where(ok, k, 0) + 1)
                + xlogy(i, p_cand_only) + xlogy(j, p_base_only) + xlogy(np.where(ok, k, 0), rest))
        step = np.where(ok, np.exp(logp), 0.0)
        alive = np.clip(fftconvolve(alive, step), 0.0, None) if m else alive
        z = score_z_grid(n, round(-margin, 12))
        cross = z > interval_z(boundary_confidence(confidence, plan, n))
        passed += float(alive[cross].sum())
        alive[cross] = 0.0
        if fail_confidence is not None:
            down = z < -interval_z(boundary_confidence(fail_confidence, plan, n))
            failed += float(alive[down].sum())
            alive[down] = 0.0
        before = n
    return min(1.0, passed), min(1.0, failed)


def undecided_tasks(verdicts: Iterable[GateVerdict], slice_of: dict[str, str]) -> set[str]:
    """Tasks with a gate still inconclusive, on the task itself or on its slice."""
    open_scopes = {v.scope for v in verdicts if v.check == "quality" and v.verdict == "inconclusive"}
    open_slices = {s.removeprefix("slice:") for s in open_scopes if s.startswith("slice:")}
    return {task for task, slice_ in slice_of.items() if task in open_scopes or slice_ in open_slices}
