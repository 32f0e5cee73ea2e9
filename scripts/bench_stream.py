"""Decisions made one run at a time against one cached baseline: what each stream rule
releases, simulated from the default model's real per-sample records.

    .venv/bin/python scripts/bench_stream.py [SAMPLES_DIR] [--recipe R] [--streams 2000] [--length 20]
        [--discordance 0.02 0.05] [--seed 0]

The recipe (default: the shipped GPTQ W4A16 one) gives the suite, the gates and
release.policy, read as scripts/bench_gate_error_rates.py reads them (its `load`). Every
required pass/fail comparison (tasks, slices of two or more tasks, the pooled gate) is
judged by the gates' own score test (quality.stats.tango_z at the margin,
quality.recipe.ni_margin from the baseline's score), so a decision releases at a share w
of the recipe's alpha exactly when w >= w*, its smallest releasing share (the largest
over its required comparisons of the one-sided p-value over that comparison's alpha).
Perplexity is left out, as in the exact tables of docs/decisions.md.

A stream: the baseline is served once (its answers cached) and every decision of the
stream compares a fresh candidate run with those same answers. Each served copy answers
an item as the records did, except that with probability u it answers by a coin toss;
u is set so two copies disagree on a share d of the items (d = (1 - (1 - u)^2) / 2).
A bad candidate is 5 points worse on the safety task (a required slice of its own: its
right answers turned wrong at the rate that loses 5 points on average); a good one is
equal to the baseline. The streams:
- **bad**: the same bad candidate submitted `--length` times: P(any release);
- **unchanged**: `--length` good candidates: P(released) at each position;
- **mixed p**: each decision bad with probability p (0.2, 0.5);
- **adversarial**: `--length` / 2 good candidates, then the bad one re-run the other half.
For each: the realised FDR (false releases / releases, 0 without a release, averaged over
streams), P(any false release), the good candidates' release rate, and their release
rate after the stream's first block (a good candidate at a position after one that was
not released). Each rule (quantlab.recipe.stream) turns the stream's w* into releases.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_gate_error_rates import load  # noqa: E402
from scipy.stats import norm  # noqa: E402

from quantlab.quality import gates as quality_gates  # noqa: E402
from quantlab.quality.compare import TRANSFORMS  # noqa: E402
from quantlab.quality.stats import tango_z  # noqa: E402
from quantlab.recipe.quality import ni_margin  # noqa: E402
from quantlab.recipe.stream import LORD, METHOD, SPENDING, Gamma, next_share  # noqa: E402

RECORDS = REPO / "scripts" / "records" / "default-suite-smollm2-bf16"
BROKEN_TASK = "ql_safety"
LOSS = 0.05


def comparisons(spec, tasks, policy):
    """The items (0/1, concatenated) and every required pass/fail comparison:
    (scope, item index array, its gates' confidence, its gates)."""
    binary = [(t, rows) for t, rows, hib in tasks if t.metric not in TRANSFORMS and hib]
    values, spans, at = [], {}, 0
    for t, rows in binary:
        values += [float(r["metrics"][t.metric]) for r in rows]
        spans[t.task] = np.arange(at, at + len(rows))
        at += len(rows)
    out = []
    for t, _ in binary:
        gates = quality_gates.task_gates(spec, t.task, t.slice)
        disabled = spec.task_gates.get(t.task) and spec.task_gates[t.task].disabled  # reported, not gated
        if not disabled and policy.requires("quality", "non_inferiority", t.task):
            out.append((t.task, spans[t.task], gates))
    for name in sorted({t.slice for t, _ in binary}):
        members = [t.task for t, _ in binary if t.slice == name]
        if len(members) >= 2 and policy.requires("quality", "non_inferiority", f"slice:{name}"):
            out.append((f"slice:{name}", np.concatenate([spans[m] for m in members]),
                        quality_gates.slice_gates(spec, name)))
    if spec.pooled is not None and policy.requires("quality", "non_inferiority", "pooled"):
        out.append(("pooled", np.arange(at), quality_gates.pooled_gates(spec)))
    return np.array(values), spans, out


def served(truth: np.ndarray, u: float, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """Copies of the records' answers, each item a coin toss with probability u."""
    noisy = rng.random(shape + truth.shape) < u
    return np.where(noisy, rng.random(shape + truth.shape) < 0.5, truth.astype(bool))


def smallest_share(base: np.ndarray, cand: np.ndarray, comps) -> np.ndarray:
    """w* per decision: base (streams, items) against cand (streams, decisions, items)."""
    worst = np.zeros(cand.shape[:2])
    for _, idx, gates in comps:
        b, c = base[:, None, idx], cand[:, :, idx]
        n = len(idx)
        cand_only = (c & ~b).sum(-1)
        base_only = (b & ~c).sum(-1)
        score = b[:, 0, :].mean(-1)
        margin = np.array([ni_margin(gates, s) for s in score])[:, None]
        z = tango_z(cand_only, base_only, n, -margin)
        p = norm.sf(z)  # one-sided: the pass side of a two-sided interval at gates.confidence
        worst = np.maximum(worst, 2 * p / (1 - gates.confidence))
    return worst


def simulate(truth, spans, comps, *, bad: np.ndarray, d: float, seed: int) -> np.ndarray:
    """w* (streams, decisions): `bad` (streams, decisions) marks the bad candidates."""
    rng = np.random.default_rng(seed)
    u = 1 - np.sqrt(1 - 2 * d)
    streams, length = bad.shape
    out = []
    for start in range(0, streams, 100):
        k = min(100, streams - start)
        base = served(truth, u, (k,), rng)
        cand = served(truth, u, (k, length), rng)
        idx = spans[BROKEN_TASK]
        right = (1 - u) * truth[idx].mean() + u / 2
        turn = (rng.random((k, length, len(idx))) < LOSS / right) & bad[start:start + k, :, None]
        cand[:, :, idx] &= ~turn
        out.append(smallest_share(base, cand, comps))
    return np.concatenate(out)


RULES = {
    "alone (every run at alpha)": None,
    "alpha-spending, 1/20 each": (SPENDING, Gamma.horizon(20), None),
    "fallback, gamma_1 0.5": (METHOD, Gamma.front(0.5), None),
    "fallback, gamma_1 0.9 (its shipped gamma)": (METHOD, Gamma.front(0.9), None),
    "LORD++, paper gamma, w0 0.5": (LORD, Gamma.lord(), 0.5),
    "LORD++, gamma_1 0.3, w0 0.5": (LORD, Gamma.front(0.3), 0.5),
    "LORD++, gamma_1 0.5, w0 0.5": (LORD, Gamma.front(0.5), 0.5),
    "LORD++, gamma_1 0.5, w0 0.7 (shipped)": (LORD, Gamma.front(0.5), 0.7),
    "LORD++, gamma_1 0.5, w0 0.9": (LORD, Gamma.front(0.5), 0.9),
    "LORD++, gamma_1 0.7, w0 0.5": (LORD, Gamma.front(0.7), 0.5),
    "LORD++, gamma_1 0.9, w0 0.5": (LORD, Gamma.front(0.9), 0.5),
}


def releases(wstar: np.ndarray, rule) -> np.ndarray:
    """Released (streams, decisions) under a rule, each decision at the share its rule gives."""
    if rule is None:
        return wstar <= 1
    method, gamma, w0 = rule
    kw = {"w0": w0} if w0 is not None else {}
    out = np.zeros(wstar.shape, dtype=bool)
    for s in range(wstar.shape[0]):
        history: list[tuple[float, bool]] = []
        for t in range(wstar.shape[1]):
            share = next_share(gamma, history, method=method, **kw)
            released = bool(wstar[s, t] <= share)
            history.append((share, released))
            out[s, t] = released
    return out


def errors(released: np.ndarray, bad: np.ndarray) -> dict[str, float]:
    """Realised FDR, P(any false release), good release rate, and after the first block."""
    false = (released & bad).sum(1)
    fdr = np.where(released.sum(1) > 0, false / np.maximum(released.sum(1), 1), 0.0).mean()
    blocked_before = np.cumsum(~released, axis=1) - ~released > 0  # an earlier decision was not released
    good = ~bad
    after = good & blocked_before
    return {"fdr": fdr, "any_false": (false > 0).mean(), "good": released[good].mean() if good.any() else np.nan,
            "good_after_block": released[after].mean() if after.any() else np.nan}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("samples", type=Path, nargs="?", default=RECORDS)
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes" / "gptq-w4a16.yaml")
    ap.add_argument("--streams", type=int, default=2000)
    ap.add_argument("--length", type=int, default=20)
    ap.add_argument("--discordance", type=float, nargs="+", default=[0.02, 0.05])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    spec, tasks, policy = load(args.samples, args.recipe)
    truth, spans, comps = comparisons(spec, tasks, policy)
    print(f"records: {args.samples}; recipe {args.recipe.name}; required pass/fail comparisons: "
          f"{', '.join(c[0] for c in comps)}; {args.streams} streams of {args.length}")
    t0 = time.time()
    rng = np.random.default_rng(args.seed)
    shape = (args.streams, args.length)
    half = np.zeros(shape, dtype=bool)
    half[:, args.length // 2:] = True
    worlds = {"bad": np.ones(shape, dtype=bool), "unchanged": np.zeros(shape, dtype=bool),
              "mixed 0.2": rng.random(shape) < 0.2, "mixed 0.5": rng.random(shape) < 0.5, "adversarial": half}
    w = {(name, d): simulate(truth, spans, comps, bad=bad, d=d, seed=args.seed + 1 + i)
         for i, (name, bad, d) in enumerate((name, bad, d) for name, bad in worlds.items()
                                             for d in args.discordance)}
    print(f"simulated in {time.time() - t0:.0f} s")
    fixed = (1.0, 0.9, 0.7, 0.5, 0.3, 0.1, 0.05)
    for d in args.discordance:  # what any rule must pay: an unchanged candidate's release at a fixed share
        print(f"unchanged, d={d:g}, one decision at a share w of alpha: "
              + ", ".join(f"w={x:g}: {(w['unchanged', d] <= x).mean():.3f}" for x in fixed))
        print(f"bad, d={d:g}, one decision at a share w: "
              + ", ".join(f"w={x:g}: {(w['bad', d] <= x).mean():.4f}" for x in fixed))
    at = [t for t in (1, 2, 3, 5, 10, 20) if t <= args.length]
    for d in args.discordance:
        print(f"\n### d = {d:g}\n")
        print(f"| rule | bad x{args.length}: P(any release) | unchanged: released at t = {', '.join(map(str, at))} "
              "(mean) | mixed 0.2: FDR, P(any false), good, good after a block | mixed 0.5: same | "
              "adversarial: FDR, P(any false), good |")
        print("|---|---|---|---|---|---|")
        for name, rule in RULES.items():
            cells = [f"{releases(w['bad', d], rule).any(axis=1).mean():.3f}"]
            r = releases(w["unchanged", d], rule)
            e = errors(r, worlds["unchanged"])
            cells.append(" / ".join(f"{x:.2f}" for x in r.mean(axis=0)[[t - 1 for t in at]])
                         + f" ({r.mean():.2f}; after a block {e['good_after_block']:.2f})")
            for world in ("mixed 0.2", "mixed 0.5"):
                e = errors(releases(w[world, d], rule), worlds[world])
                cells.append(f"{e['fdr']:.3f}, {e['any_false']:.3f}, {e['good']:.2f}, {e['good_after_block']:.2f}")
            e = errors(releases(w["adversarial", d], rule), worlds["adversarial"])
            cells.append(f"{e['fdr']:.3f}, {e['any_false']:.3f}, {e['good']:.2f}")
            print(f"| {name} | " + " | ".join(cells) + " |")
            sys.stdout.flush()
    print(f"\nin {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
