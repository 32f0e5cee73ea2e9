"""The quality gate's own error rates, by replaying real per-sample records.

    .venv/bin/python scripts/bench_gate_error_rates.py SAMPLES_DIR [--recipe R] [--trials N]
        [--discordance 0.02 0.05 0.1 0.33] [--regressions 0.05 0.1 0.2 0.3] [--ppl-noise 0.005]

SAMPLES_DIR holds one lm-eval per-sample file per task (`<task>.jsonl` with its
`<task>.summary.json`): a run's `quality/baseline/` or an entry of the baseline cache.
The recipe (default: the shipped GPTQ W4A16 one) gives the suite, the gates and
release.policy; the gates run exactly as in `quantlab run` (quality.gates.verdicts and
release.decision.decide), on candidates simulated from the baseline's own records:

- **false blocks** (nothing changed): baseline and candidate are exchangeable. A
  pass/fail sample is unstable with probability 2 x d and then drawn 50/50 for each role
  independently (so d of the pairs disagree, in both directions alike); a perplexity
  sample's log-likelihood gets independent relative noise (--ppl-noise) on each side.
  Reported: how often the decision is blocked (a gate failed) and how often not_shown.
- **detection** (a planted regression): on top of the null noise (the smallest
  --discordance), k of the baseline's right answers in one slice turn wrong in the
  candidate. Reported per slice and k: how often the run is blocked, and how often that
  slice's own gate fails.

Only quality gates are simulated (performance and stability need servers).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from quantlab.core.recipe import load_recipe  # noqa: E402
from quantlab.quality import gates as quality_gates  # noqa: E402
from quantlab.quality.compare import TRANSFORMS, compare_task, paired_values, pooled  # noqa: E402
from quantlab.quality.lmeval import read_samples  # noqa: E402
from quantlab.quality.suites import load_suites  # noqa: E402
from quantlab.release.decision import DecisionPolicy, decide  # noqa: E402


def load(samples: Path, recipe_path: Path):
    loaded = load_recipe(recipe_path)
    spec = loaded.recipe.quality
    tasks = []
    for suite in load_suites(spec, loaded.base_dir):
        for t in suite.tasks:
            if not (samples / f"{t.task}.jsonl").is_file():
                continue
            rows, summary = read_samples(samples, t.task)
            hib = (summary.get("higher_is_better") or {}).get(t.metric, True)
            tasks.append((t, rows, hib))
    rules = loaded.recipe.release.policy
    policy = DecisionPolicy(not_shown=rules.not_shown, checks=dict(rules.checks), gates=dict(rules.gates))
    return spec, tasks, policy


def simulate(rows, metric, rng: random.Random, *, discordance: float, ppl_noise: float, break_right: float = 0.0):
    """(baseline rows, candidate rows): two exchangeable noisy copies of the records, then
    `break_right` of the baseline's right answers made wrong in the candidate."""
    base, cand = copy.deepcopy(rows), copy.deepcopy(rows)
    for b, c in zip(base, cand):
        v = b["metrics"].get(metric)
        if isinstance(v, list):  # (log-likelihood, words): relative noise on each side
            b["metrics"][metric] = [v[0] * (1 + rng.gauss(0, ppl_noise)), v[1]]
            c["metrics"][metric] = [v[0] * (1 + rng.gauss(0, ppl_noise)), v[1]]
        elif v in (0, 1, 0.0, 1.0, True, False):
            if rng.random() < 2 * discordance:
                b["metrics"][metric], c["metrics"][metric] = float(rng.random() < 0.5), float(rng.random() < 0.5)
            if b["metrics"][metric] == 1.0 and rng.random() < break_right:
                c["metrics"][metric] = 0.0
    return base, cand


def judge(spec, tasks, policy, rng, *, discordance: float, ppl_noise: float, break_right: float = 0.0,
          broken_slice: str | None = None):
    paired = []
    for t, rows, hib in tasks:
        b_rows, c_rows = simulate(rows, t.metric, rng, discordance=discordance, ppl_noise=ppl_noise,
                                  break_right=break_right if t.slice == broken_slice else 0.0)
        cmp, _ = compare_task(t.task, t.slice, t.metric, t.filter, hib, b_rows, c_rows,
                              confidence=quality_gates.task_gates(spec, t.task, t.slice).confidence,
                              iters=spec.bootstrap_iters, seed=rng.randrange(1 << 30))
        _, bv, cv = paired_values(t.task, t.metric, t.filter, b_rows, c_rows)
        paired.append((cmp, bv, cv))
    comparisons = [cmp for cmp, _, _ in paired]
    values = {cmp.task: (bv, cv) for cmp, bv, cv in paired}
    slices = [p for name in sorted({c.slice for c in comparisons})
              if (p := pooled(comparisons, values, name, confidence=spec.gates.confidence,
                              iters=spec.bootstrap_iters, seed=0)) is not None]
    verdicts = quality_gates.verdicts(spec, paired, slices, None)
    return verdicts, decide(verdicts, policy).record.decision


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("samples", type=Path)
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes" / "gptq-w4a16.yaml")
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--discordance", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.33])
    ap.add_argument("--regressions", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.3])
    ap.add_argument("--ppl-noise", type=float, default=0.005)
    ap.add_argument("--bootstrap-iters", type=int, default=500, help="per comparison (speed; the recipe's is 2000)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    spec, tasks, policy = load(args.samples, args.recipe)
    spec = spec.model_copy(update={"bootstrap_iters": args.bootstrap_iters})
    rng = random.Random(args.seed)
    sizes = ", ".join(f"{t.task} {len(rows)}" for t, rows, _ in tasks)
    print(f"records: {args.samples} ({sizes}); recipe {args.recipe.name}; policy {policy.rules()}; "
          f"{args.trials} trials per row; ppl noise {args.ppl_noise:.1%}; bootstrap {args.bootstrap_iters}")
    print("\nnull (nothing changed): discordance -> blocked (a gate failed) / not_shown / release")
    for d in args.discordance:
        t0, counts, failing = time.time(), {"blocked": 0, "not_shown": 0, "release": 0}, {}
        for _ in range(args.trials):
            verdicts, decision = judge(spec, tasks, policy, rng, discordance=d, ppl_noise=args.ppl_noise)
            counts[decision] += 1
            for v in verdicts:
                if v.verdict == "fail":
                    failing[f"{v.gate}@{v.scope}"] = failing.get(f"{v.gate}@{v.scope}", 0) + 1
        rate = {k: v / args.trials for k, v in counts.items()}
        worst = sorted(failing.items(), key=lambda kv: -kv[1])[:3]
        print(f"  d={d:<5} blocked {rate['blocked']:.3f}  not_shown {rate['not_shown']:.3f}  release "
              f"{rate['release']:.3f}  (most failed: {worst or '-'}; {time.time() - t0:.0f} s)")
    binary_slices = sorted({t.slice for t, rows, _ in tasks if t.metric not in TRANSFORMS})
    print(f"\ndetection (null discordance {min(args.discordance)}): slice, k of its right answers made wrong "
          "-> run blocked / the slice's own gate failed")
    for name in binary_slices:
        for k in args.regressions:
            blocked = slice_failed = 0
            for _ in range(args.trials // 2):
                verdicts, decision = judge(spec, tasks, policy, rng, discordance=min(args.discordance),
                                           ppl_noise=args.ppl_noise, break_right=k, broken_slice=name)
                blocked += decision == "blocked"
                slice_failed += any(v.verdict == "fail" and (v.scope == f"slice:{name}" or any(
                    v.scope == t.task for t, _, _ in tasks if t.slice == name)) for v in verdicts)
            n = args.trials // 2
            print(f"  {name:<14} k={k:<5} blocked {blocked / n:.3f}  slice gate failed {slice_failed / n:.3f}")
        sys.stdout.flush()
    print(json.dumps({"samples": str(args.samples), "trials": args.trials}))


if __name__ == "__main__":
    main()
