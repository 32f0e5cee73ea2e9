"""What `release.policy`'s `warn` releases when the candidate is exactly at a
non-inferiority margin, exact by enumeration, under decision rules 2 and 3.

    .venv/bin/python scripts/bench_warn_at_margin.py [--margin 0.05] [--n 50 80 200 400 1000]
        [--discordance 0.06 0.1 0.2] [--check 300]

One pass/fail non-inferiority gate over n paired items, the candidate's true score
exactly `margin` below the baseline's, d of the pairs discordant (candidate-only right at
(d - margin) / 2, baseline-only right at (d + margin) / 2), beside a gate that passed;
the gate under `not_shown: warn`. Every (candidate-only, baseline-only) count of the
trinomial is judged as the gate judges it (Tango's score test at 0.95: pass above -margin,
fail below it on the fail side, undecided between) and released when it passes or, undecided,
when the rule lets warn through: rule 2 when the estimate is not beyond the margin (an
estimate at it released), rule 3 when it is strictly within. `--check` cells drawn at random
are decided again by release.decision.decide on real GateVerdicts, which must agree.
"""

from __future__ import annotations

import argparse
import random

import numpy as np

from quantlab.core.verdicts import GateVerdict
from quantlab.quality.stats import _counts_grid, _trinomial_mass, _z, _z_grid, tango_bounds
from quantlab.release.decision import DecisionPolicy, decide

CONFIDENCE = 0.95


def _grids(n: int, margin: float):
    i, j, _, _, ok = _counts_grid(n)
    z = _z_grid(n, round(-margin, 12))
    passed, failed = z > _z(CONFIDENCE), z < -_z(CONFIDENCE)
    estimate = (i - j) / n
    return i, j, ok, passed, ~passed & ~failed, estimate


def released(n: int, margin: float, d: float, rule: int) -> float:
    _, _, _, passed, undecided, est = _grids(n, margin)
    let_through = est >= -margin - 1e-12 if rule == 2 else est > -margin + 1e-9 * max(1.0, margin)
    return _trinomial_mass(n, (d - margin) / 2, (d + margin) / 2, passed | (undecided & let_through))


def check(n: int, margin: float, cells: int, seed: int) -> int:
    """Cells of the grid decided by decide() on the gate's own verdict: the count that agree."""
    i, j, ok, passed, undecided, est = _grids(n, margin)
    rng = random.Random(seed)
    valid = list(zip(*np.nonzero(ok)))
    beside = GateVerdict(check="quality", gate="non_inferiority", scope="other", verdict="pass", value=0.0,
                         limit=-margin, evidence="passed", comparator="non_inferior", margin=margin, estimate=0.0,
                         low=-0.01, high=0.01)
    agree = 0
    for a, b in rng.sample(valid, min(cells, len(valid))):
        lo, hi = tango_bounds(int(a), int(b), n, CONFIDENCE)
        verdict = "pass" if passed[a, b] else "inconclusive" if undecided[a, b] else "fail"
        v = GateVerdict(check="quality", gate="non_inferiority", scope="t", verdict=verdict, value=lo,
                        limit=-margin, evidence="cell", comparator="non_inferior", margin=margin,
                        estimate=(int(a) - int(b)) / n, low=lo, high=hi)
        for rule in (2, 3):
            got = decide([beside, v], DecisionPolicy(not_shown="warn"), rule=rule).record.decision == "release"
            let = est[a, b] >= -margin - 1e-12 if rule == 2 else est[a, b] > -margin + 1e-9 * max(1.0, margin)
            want = bool(passed[a, b] or (undecided[a, b] and let))
            agree += got == want
    return agree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--margin", type=float, default=0.05)
    ap.add_argument("--n", type=int, nargs="+", default=[50, 80, 200, 400, 1000])
    ap.add_argument("--discordance", type=float, nargs="+", default=[0.06, 0.1, 0.2])
    ap.add_argument("--check", type=int, default=300, help="grid cells decided again by decide() per n")
    args = ap.parse_args()
    print(f"P(release) under not_shown: warn, the candidate exactly {args.margin} below the baseline "
          f"(rule 2 -> rule 3)")
    print("| n | " + " | ".join(f"d = {d:g}" for d in args.discordance) + " | decide() agrees |")
    print("|---|" + "---|" * (len(args.discordance) + 1))
    for n in args.n:
        cells = [f"{released(n, args.margin, d, 2):.3f} -> {released(n, args.margin, d, 3):.3f}"
                 for d in args.discordance]
        agree = check(n, args.margin, args.check, seed=n) if args.check else 0
        print(f"| {n} | " + " | ".join(cells) + f" | {agree} of {2 * min(args.check, (n + 1) * (n + 2) // 2)} |")


if __name__ == "__main__":
    main()
