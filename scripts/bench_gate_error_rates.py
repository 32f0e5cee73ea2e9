"""The quality gate's own error rates, by replaying real per-sample records.

    .venv/bin/python scripts/bench_gate_error_rates.py SAMPLES_DIR [--recipe R] [--trials N]
        [--discordance 0.02 0.05 0.1 0.33] [--regressions 0.05 0.1 0.2 0.3] [--ppl-noise 0.005]
        [--samples all|auto] [--looks boundary|union] [--at-margin] [--skip-detection]

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

`--samples auto` judges as `quality.samples: auto` does (quality/stage.py's
_evaluate_until_decided, in memory): each task's candidate answers grow look by look
(quality.sequential.first x growth), a task stops when its gates and its slice's are
decided, and the final verdicts are those of each task's last look. `--looks union`
judges each task's look at its spending increment alone (the rule before the boundary:
a union bound over the looks), to compare. `--at-margin` prints, exact, the largest
chance that a candidate worse by exactly the margin passes (the score test's false
release), at one look of n items and over the looks `samples: auto` gives n items.

First, per gated pass/fail comparison (tasks, pooled slices, the pooled gate over every
item), exact by enumeration (quality/planner.py, the gates' own score test): at each
--discordance, P(release | unchanged), P(not released | a loss of 2x its margin) and
P(blocked | 3x its margin), the loss planted as points of the score, with each
comparison's real item count and baseline score from the records.
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

from quantlab.recipe.file import load_recipe  # noqa: E402
from quantlab.quality import gates as quality_gates  # noqa: E402
from quantlab.quality.compare import TRANSFORMS, compare_task, paired_values, pooled, pooled_all  # noqa: E402
from quantlab.quality.lmeval import read_samples  # noqa: E402
from quantlab.quality.suites import load_suites  # noqa: E402
from quantlab.quality.pairing import pool_everything, pool_slices  # noqa: E402
from quantlab.quality.planner import plan_gate  # noqa: E402
from quantlab.quality.sequential import (  # noqa: E402
    boundary_confidence, schedule, sequential_ni_probability, spending, undecided_tasks)
from quantlab.quality.stats import ni_fail_probability, ni_pass_probability  # noqa: E402
from quantlab.release.decision import decide, policy_for  # noqa: E402


def load(samples: Path, recipe_path: Path):
    loaded = load_recipe(recipe_path)
    spec = loaded.recipe.quality
    tasks = []
    for suite in load_suites(spec, loaded.base_dir):
        for t in suite.tasks:
            if not (samples / f"{t.task}.jsonl").is_file():
                continue
            rows, _ = read_samples(samples, t.task)
            tasks.append((t, rows, suite.directions[t.task]))
    return spec, tasks, policy_for(loaded.recipe)


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
    everything = pooled_all(comparisons, values, confidence=spec.pooled.confidence, iters=spec.bootstrap_iters,
                            seed=0) if spec.pooled else None
    verdicts = quality_gates.verdicts(spec, paired, slices, None, everything)
    return verdicts, decide(verdicts, policy).record.decision


def union_confidence(confidence: float, plan: list[int], n: int) -> float:
    """The rule before the boundary: a look judged at its spending increment alone."""
    alpha = (1 - confidence) / 2
    k = next((i for i, size in enumerate(plan) if size >= n), len(plan) - 1)
    before = spending(alpha, plan[k - 1] / plan[-1]) if k else 0.0
    return 1 - 2 * max(5e-13, spending(alpha, plan[k] / plan[-1]) - before)


def judge_auto(spec, tasks, policy, rng, *, discordance: float, ppl_noise: float, break_right: float = 0.0,
               broken_slice: str | None = None, looks_rule: str = "boundary"):
    """One run of `samples: auto`: the looks as the stage takes them, on one simulated
    candidate per task (its answers revealed a prefix at a time)."""
    level = boundary_confidence if looks_rule == "boundary" else union_confidence
    sims = {}
    for t, rows, hib in tasks:
        sims[t.task] = (t, hib, *simulate(rows, t.metric, rng, discordance=discordance, ppl_noise=ppl_noise,
                                          break_right=break_right if t.slice == broken_slice else 0.0))
    plans = {task: schedule(len(b), spec.sequential.first, spec.sequential.growth) for task, (_, _, b, _) in
             sims.items()}
    looks = {task: len(p) for task, p in plans.items()}
    slice_of = {t.task: t.slice for t, _, _ in tasks}
    answered, pending, seed = dict.fromkeys(plans, 0), set(plans), rng.randrange(1 << 30)

    def compared():
        paired = []
        for task, (t, hib, b_rows, c_rows) in sims.items():
            n = answered[task]
            conf = level(quality_gates.task_gates(spec, t.task, t.slice).confidence, plans[task], n)
            cmp, _ = compare_task(t.task, t.slice, t.metric, t.filter, hib, b_rows[:n], c_rows[:n], confidence=conf,
                                  iters=spec.bootstrap_iters, seed=seed)
            _, bv, cv = paired_values(t.task, t.metric, t.filter, b_rows[:n], c_rows[:n])
            paired.append((cmp, bv, cv))
        return paired

    fail_plans = plans if looks_rule == "boundary" else None
    for look in range(max(looks.values())):
        todo = [task for task in sorted(pending) if look < len(plans[task])]
        if not todo:
            break
        for task in todo:
            answered[task] = plans[task][look]
        paired = compared()
        still = undecided_tasks(quality_gates.verdicts(spec, paired, pool_slices(spec, paired, looks=looks), None,
                                                       plans=fail_plans), slice_of)
        pending = {task for task in pending if task in still and answered[task] < len(sims[task][2])}
    paired = compared()
    verdicts = quality_gates.verdicts(spec, paired, pool_slices(spec, paired, looks=looks), None,
                                      pool_everything(spec, paired, looks=looks), plans=fail_plans)
    return verdicts, decide(verdicts, policy).record.decision, sum(answered.values())


def at_margin(ns, p01s, margins, first: int, growth: float) -> None:
    """The score test's false release, exact: a candidate worse by exactly the margin."""
    print("\nat the margin, exact: the largest P(pass) over p01 in " + ", ".join(f"{p:g}" for p in p01s)
          + " and margins " + ", ".join(f"{m:g}" for m in margins) + " (nominal 0.025)")
    print("| items | one look | (p01, margin) | looks (samples: auto) | over the looks | (p01, margin) |")
    print("|---|---|---|---|---|---|")
    for n in ns:
        plan = schedule(n, first, growth)
        fixed = max((ni_pass_probability(n, m, p, p + m, 0.95), p, m) for p in p01s for m in margins)
        looked = max((sequential_ni_probability(plan, m, p, p + m, 0.95)[0], p, m) for p in p01s for m in margins)
        print(f"| {n} | {fixed[0]:.4f} | ({fixed[1]:g}, {fixed[2]:g}) | {' / '.join(map(str, plan))} | "
              f"{looked[0]:.4f} | ({looked[1]:g}, {looked[2]:g}) |")
        sys.stdout.flush()


def exact_table(spec, tasks, policy, discordances) -> None:
    """Per comparison, exact: the planner's figures at the records' sizes and scores."""
    binary = [(t, rows) for t, rows, hib in tasks if t.metric not in TRANSFORMS and hib]
    scores = {t.task: sum(float(r["metrics"][t.metric]) for r in rows) / len(rows) for t, rows in binary}
    sizes = {t.task: len(rows) for t, rows in binary}
    comparisons = [(t.task, sizes[t.task], quality_gates.task_gates(spec, t.task, t.slice), scores[t.task])
                   for t, _ in binary if not (spec.task_gates.get(t.task) and spec.task_gates[t.task].disabled)]
    for name in sorted({t.slice for t, _ in binary}):
        members = [t.task for t, _ in binary if t.slice == name]
        if len(members) >= 2:
            n = sum(sizes[m] for m in members)
            comparisons.append((f"slice:{name}", n, quality_gates.slice_gates(spec, name),
                                sum(scores[m] * sizes[m] for m in members) / n))
    if spec.pooled is not None and len(binary) >= 2:
        n = sum(sizes.values())
        comparisons.append(("pooled", n, quality_gates.pooled_gates(spec),
                            sum(scores[t] * sizes[t] for t in sizes) / n))
    family = len(comparisons)
    auto = spec.samples == "auto"
    sequential = (spec.sequential.first, spec.sequential.growth) if auto else None

    def looked(scope, n, gates):
        """A slice's or the pooled gate's confidence split over its members' most looks (samples: auto)."""
        if not auto or not (scope.startswith("slice:") or scope == "pooled"):
            return gates
        members = [sizes[t.task] for t, _ in binary if scope == "pooled" or f"slice:{t.slice}" == scope]
        most = max(len(schedule(m, *sequential)) for m in members)
        return gates.model_copy(update={"confidence": 1 - (1 - gates.confidence) / most})

    comparisons = [(scope, n, looked(scope, n, gates), score) for scope, n, gates, score in comparisons]

    def required(scope):
        return policy.requires("quality", "non_inferiority", scope)

    print("\nper comparison, exact: P(release | unchanged) / P(not released | 2x margin) / P(blocked | 3x margin)")
    print("| comparison | items | baseline | margin | " + " | ".join(f"d={d:g}" for d in discordances) + " |")
    print("|---|---|---|---|" + "---|" * len(discordances))
    run = {d: 1.0 for d in discordances}
    for scope, n, gates, score in comparisons:
        cells = []
        for d in discordances:
            plan = plan_gate(scope, n, gates, family, score=score, discordance=d, required=required(scope),
                             looks=None if scope.startswith("slice:") or scope == "pooled" or not sequential
                             else (lambda m: schedule(m, *sequential)))
            if plan.margin is None:
                cells.append("-")
                continue
            fail_conf = 1 - (1 - gates.confidence) / family
            if auto and not (scope.startswith("slice:") or scope == "pooled"):
                blocked3 = sequential_ni_probability(schedule(n, *sequential), plan.margin, d / 2,
                                                     d / 2 + 3 * plan.margin, gates.confidence, fail_conf)[1]
            else:
                blocked3 = ni_fail_probability(n, plan.margin, d / 2, d / 2 + 3 * plan.margin, fail_conf)
            cells.append(f"{plan.p_release_unchanged:.2f} / {plan.p_held_2x:.2f} / {blocked3:.2f}")
            if plan.required:
                run[d] *= plan.p_release_unchanged
        margin = plan.margin
        flag = "" if required(scope) else " (warned)"
        print(f"| {scope}{flag} | {n} | {score:.3f} | {margin if margin is None else f'{margin:.3f}'} | "
              + " | ".join(cells) + " |")
    print("run level, required comparisons all passing for an unchanged model (independent): "
          + ", ".join(f"d={d:g}: {p:.2f}" for d, p in run.items()))


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
    ap.add_argument("--samples", dest="samples_mode", choices=["all", "auto"], default=None,
                    help="quality.samples to judge as (default: the recipe's)")
    ap.add_argument("--looks", choices=["boundary", "union"], default="boundary",
                    help="samples: auto: each look at the boundary's level, or at its increment alone (before)")
    ap.add_argument("--at-margin", action="store_true", help="the exact false-release table at the margin, then stop")
    ap.add_argument("--skip-detection", action="store_true", help="only the exact table and the null rows")
    args = ap.parse_args()
    spec, tasks, policy = load(args.samples, args.recipe)
    if args.at_margin:
        at_margin([30, 50, 80, 110, 200, 400, 1000], [0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2], [0.05, 0.0875],
                  spec.sequential.first, spec.sequential.growth)
        return
    update = {"bootstrap_iters": args.bootstrap_iters}
    if args.samples_mode:
        update["samples"] = args.samples_mode
    spec = spec.model_copy(update=update)
    auto = spec.samples == "auto"

    def run_once(**kw):
        if auto:
            return judge_auto(spec, tasks, policy, rng, looks_rule=args.looks, **kw)
        return (*judge(spec, tasks, policy, rng, **kw), None)

    rng = random.Random(args.seed)
    sizes = ", ".join(f"{t.task} {len(rows)}" for t, rows, _ in tasks)
    print(f"records: {args.samples} ({sizes}); recipe {args.recipe.name}; policy {policy.rules()}; "
          f"{args.trials} trials per row; ppl noise {args.ppl_noise:.1%}; bootstrap {args.bootstrap_iters}; "
          f"samples {spec.samples}" + (f" (looks from {spec.sequential.first} x {spec.sequential.growth:g}, "
                                       f"{args.looks})" if auto else ""))
    exact_table(spec, tasks, policy, args.discordance)
    print("\nnull (nothing changed): discordance -> blocked (a gate failed) / not_shown / release")
    for d in args.discordance:
        t0, counts, failing, used = time.time(), {"blocked": 0, "not_shown": 0, "release": 0}, {}, []
        for _ in range(args.trials):
            verdicts, decision, answered = run_once(discordance=d, ppl_noise=args.ppl_noise)
            counts[decision] += 1
            used.append(answered)
            for v in verdicts:
                if v.verdict == "fail":
                    failing[f"{v.gate}@{v.scope}"] = failing.get(f"{v.gate}@{v.scope}", 0) + 1
        rate = {k: v / args.trials for k, v in counts.items()}
        worst = sorted(failing.items(), key=lambda kv: -kv[1])[:3]
        answered = f"; candidate answers {sum(used) / len(used):.0f} on average" if auto else ""
        print(f"  d={d:<5} blocked {rate['blocked']:.3f}  not_shown {rate['not_shown']:.3f}  release "
              f"{rate['release']:.3f}  (most failed: {worst or '-'}{answered}; {time.time() - t0:.0f} s)")
        sys.stdout.flush()
    if args.skip_detection:
        return
    binary_slices = sorted({t.slice for t, rows, _ in tasks if t.metric not in TRANSFORMS})
    print(f"\ndetection (null discordance {min(args.discordance)}): slice, k of its right answers made wrong "
          "-> run blocked / the slice's own gate failed")
    for name in binary_slices:
        for k in args.regressions:
            blocked = slice_failed = 0
            for _ in range(args.trials // 2):
                verdicts, decision, _ = run_once(discordance=min(args.discordance), ppl_noise=args.ppl_noise,
                                                 break_right=k, broken_slice=name)
                blocked += decision == "blocked"
                slice_failed += any(v.verdict == "fail" and (v.scope == f"slice:{name}" or any(
                    v.scope == t.task for t, _, _ in tasks if t.slice == name)) for v in verdicts)
            n = args.trials // 2
            print(f"  {name:<14} k={k:<5} blocked {blocked / n:.3f}  slice gate failed {slice_failed / n:.3f}")
        sys.stdout.flush()
    print(json.dumps({"samples": str(args.samples), "trials": args.trials}))


if __name__ == "__main__":
    main()
