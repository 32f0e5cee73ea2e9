"""The performance gates' own error rates, by replaying real per-request rows.

    .venv/bin/python scripts/bench_perf_gate_error_rates.py RECORDS_DIR [--repeats 2 3 4]
        [--slowdowns 1.5 1.7 2.0] [--trials 300] [--looks 3]

RECORDS_DIR holds paired repeats of A/A runs (the same weights on both servers):
`<run>/baseline-r<k>.jsonl` and `<run>/candidate-r<k>.jsonl`, one request a line with
`outcome`, `sent_at`, `ttft`, `e2e`, `output_tokens` (a run's `perf/` rows, or
`--export RUNS_DIR` to write them from `scripts/run_aa.py --checks performance` runs).

Per trial, k repeat pairs are drawn without replacement from every measured pair and
judged by the gates exactly as the stage does (performance/noise.py intervals,
performance/gates.py verdicts) with the recipe's default gates (throughput ratio >=
0.8, P99 TTFT and TPOT ratios <= 1.5), the pass side at (1 - 0.95) / looks and the
fail side at half the run's 5% over 3 gates x looks. Reported per k:

- **unchanged** (the rows as measured): how often each figure's interval holds 1.0,
  each gate passes, and any gate fails (a false block);
- **slowed** (--slowdowns): the candidate's TTFT and E2E times (so TPOT, and the wall
  time) multiplied by the factor: how often the run is blocked and how often released.

Drawing pairs from several runs mixes run-to-run with repeat-to-repeat spread: the
unchanged figures are if anything pessimistic for one run's repeats.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from quantlab.core.results import PerfPoint  # noqa: E402
from quantlab.performance.gates import FAIL_SHARE, PERF_GATES, verdicts  # noqa: E402
from quantlab.performance.metrics import RequestRecord  # noqa: E402
from quantlab.performance.noise import RepeatSample, interval, per_repeat_figures, ratio_draws  # noqa: E402
from quantlab.recipe.performance import PerfGates  # noqa: E402

GATES = PerfGates(min_throughput_ratio=0.8, max_p99_ttft_ratio=1.5, max_p99_tpot_ratio=1.5, max_error_rate=None)
KEYS = ("output_tokens_per_s", "ttft_ms.p99", "tpot_ms.p99")
KEPT = ("index", "outcome", "sent_at", "ttft", "e2e", "output_tokens")


def read_rows(path: Path, slow: float = 1.0) -> RepeatSample:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    recs = [RequestRecord(index=r["index"], outcome=r["outcome"], sent_at=r["sent_at"],
                          ttft=None if r["ttft"] is None else r["ttft"] * slow,
                          e2e=None if r["e2e"] is None else r["e2e"] * slow, output_tokens=r["output_tokens"])
            for r in rows]
    # the point's wall time, from the rows (the stage's own wall_s agreed to 1 ms on the committed runs)
    ends = [r["sent_at"] + r["e2e"] for r in rows if r["e2e"] is not None]
    return RepeatSample.of(recs, max(ends) * slow if ends else 0.0)


def pairs(records: Path) -> list[tuple[Path, Path]]:
    out = []
    for base in sorted(records.glob("*/baseline-r*.jsonl")):
        cand = base.with_name(base.name.replace("baseline-", "candidate-"))
        if cand.is_file():
            out.append((base, cand))
    return out


def judge(chosen: list[tuple[Path, Path]], *, slow: float, looks: int, seed: int) -> tuple[dict, list]:
    b = [read_rows(p) for p, _ in chosen]
    c = [read_rows(q, slow) for _, q in chosen]
    k = len(chosen)
    fail_alpha = FAIL_SHARE * 0.05 / (len(KEYS) * looks)  # as the stage splits it: gates x looks
    intervals, comparison = {}, {}
    for key in KEYS:
        draws = ratio_draws(b, c, key, draws=2000, seed=seed)
        per = per_repeat_figures(b, c, key)
        intervals[f"ratio:{key}"] = interval(draws, confidence=1 - 0.05 / looks, fail_alpha=fail_alpha, repeats=k,
                                             requests=min(len(s.e2e) for s in b + c), per_repeat=per).as_dict()
        comparison[key] = {"ratio": float(np.median(per))}
    point = PerfPoint(workload="w", point="p", baseline={}, candidate={"error_rate": 0.0},
                      baseline_repeats=[{}] * k, candidate_repeats=[{}] * k, comparison=comparison, monitor={},
                      intervals=intervals)
    return intervals, verdicts([point], GATES)


def export(runs_dir: Path, out: Path) -> int:
    """Compact rows (the fields the figures use) from A/A run folders into out/<run>/."""
    n = 0
    for perf in sorted(runs_dir.glob("**/perf")):
        for f in sorted(perf.glob("*-r*.jsonl")):
            role, rest = f.name.split("-", 1)
            rep = rest.rsplit("-r", 1)[1]
            dest = out / perf.parent.name / f"{role}-r{rep}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
            dest.write_text("".join(json.dumps({k: _rounded(r.get(k)) for k in KEPT}) + "\n" for r in rows))
            n += 1
    return n


def _rounded(v):
    return round(v, 6) if isinstance(v, float) else v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", type=Path)
    ap.add_argument("--export", type=Path, metavar="RUNS_DIR", help="write RECORDS from these A/A runs, then replay")
    ap.add_argument("--repeats", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--slowdowns", type=float, nargs="+", default=[1.5, 1.7, 2.0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--looks", type=int, default=3, help="looks the pass and fail sides are split over")
    args = ap.parse_args()
    if args.export:
        print(f"exported {export(args.export, args.records)} files into {args.records}")
    pool = pairs(args.records)
    if len(pool) < max(args.repeats):
        print(f"{args.records}: {len(pool)} repeat pairs, fewer than --repeats {max(args.repeats)}", file=sys.stderr)
        return 2
    print(f"{len(pool)} measured repeat pairs; {args.trials} trials per row; pass side at 0.05/{args.looks}")
    gate_key = {g: PERF_GATES[g][0] for g in ("min_throughput_ratio", "max_p99_ttft_ratio", "max_p99_tpot_ratio")}
    print("\n| repeats | slowdown | blocked | released | " + " | ".join(f"{k} passes" for k in KEYS)
          + " | " + " | ".join(f"{k} holds the truth" for k in KEYS) + " |")
    print("|---|---|---|---|" + "---|" * (2 * len(KEYS)))
    rng = np.random.default_rng(0)
    for k in args.repeats:
        for slow in [1.0, *args.slowdowns]:
            blocked = released = 0
            passes = dict.fromkeys(KEYS, 0)
            holds = dict.fromkeys(KEYS, 0)
            truth = {"output_tokens_per_s": 1 / slow, "ttft_ms.p99": slow, "tpot_ms.p99": slow}
            for i in range(args.trials):
                chosen = [pool[j] for j in rng.choice(len(pool), size=k, replace=False)]
                ivs, vs = judge(chosen, slow=slow, looks=args.looks, seed=i)
                blocked += any(v.verdict == "fail" for v in vs)
                released += all(v.verdict == "pass" for v in vs)
                for v in vs:
                    passes[gate_key[v.gate]] += v.verdict == "pass"
                for key in KEYS:
                    iv = ivs[f"ratio:{key}"]
                    holds[key] += iv["pass_low"] <= truth[key] <= iv["pass_high"]
            n = args.trials
            print(f"| {k} | {slow:g}x | {blocked / n:.3f} | {released / n:.3f} | "
                  + " | ".join(f"{passes[key] / n:.2f}" for key in KEYS) + " | "
                  + " | ".join(f"{holds[key] / n:.2f}" for key in KEYS) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
