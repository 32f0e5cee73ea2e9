"""The performance gates' own error rates, by replaying real per-request rows.

    .venv/bin/python scripts/bench_perf_gate_error_rates.py RECORDS_DIR [--repeats 2 3 4]
        [--slowdowns 1.5 1.7 2.0] [--trials 300] [--looks 3] [--host-noise-from K]

RECORDS_DIR holds paired repeats of A/A runs (the same weights on both servers):
`<run>/baseline-r<k>.jsonl` and `<run>/candidate-r<k>.jsonl`, one request a line with
`outcome`, `sent_at`, `ttft`, `e2e`, `output_tokens` (a run's `perf/` rows, or
`--export RUNS_DIR` to write them from `scripts/run_aa.py --checks performance` runs).

Per trial, k repeat pairs are drawn without replacement from every measured pair, in
the orders the stage measures them (repeat 0 baseline first, repeat 1 candidate first,
...: ceil(k/2) pairs recorded as an odd-numbered repeat, floor(k/2) as an even one), and
judged by the gates exactly as the stage does (performance/noise.py intervals,
performance/gates.py verdicts; the value a gate reports is the median of the per-pair
ratios of the linear P99, metrics.compare's) with the recipe's default gates
(throughput ratio >= 0.8, P99 TTFT and TPOT ratios <= 1.5), the pass side at
(1 - 0.95) / looks and the fail side at half the run's 5% over 3 gates x looks.

--host-noise-from K: per trial, K further pairs (disjoint from the trial's) stand for
the host's calibration: each gated figure's HostNoise is the sum of squares of their
log ratios about 0 over K df. Each trial is then judged twice on the same draws, on its
own repeats and pooled with that calibration, and both rows are printed.

--adaptive MAX: as the stage with performance.max_repeats MAX: each trial starts at k
pairs and adds one more pair (continuing the orders) while any gate is not shown, up to
MAX; the pass and fail sides are split over MAX - k + 1 looks (--looks is ignored).
Reported per k:

- **unchanged** (the rows as measured): how often each figure's interval holds 1.0,
  each gate passes, and any gate fails (a false block);
- **slowed** (--slowdowns): the candidate's TTFT and E2E times (so TPOT, and the wall
  time) multiplied by the factor: how often the run is blocked and how often released.

Drawing pairs from several runs mixes run-to-run with repeat-to-repeat spread: the
unchanged figures are if anything pessimistic for one run's repeats.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from quantlab.core.results import PerfPoint  # noqa: E402
from quantlab.performance.gates import FAIL_SHARE, PERF_GATES, verdicts  # noqa: E402
from quantlab.performance.metrics import RequestRecord  # noqa: E402
from quantlab.performance.noise import (HostNoise, RepeatSample, interval, per_repeat_figures,  # noqa: E402
                                        ratio_draws)
from quantlab.recipe.performance import PerfGates  # noqa: E402

GATES = PerfGates(min_throughput_ratio=0.8, max_p99_ttft_ratio=1.5, max_p99_tpot_ratio=1.5, max_error_rate=None)
KEYS = ("output_tokens_per_s", "ttft_ms.p99", "tpot_ms.p99")
KEPT = ("index", "outcome", "sent_at", "ttft", "e2e", "output_tokens")


@functools.lru_cache(maxsize=None)
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


def order_of(pair: tuple[Path, Path]) -> int:
    """+1 where the baseline went first (r1, r3, ...: the stage's repeats 0, 2, ...), -1 where the candidate did."""
    return 1 if int(pair[0].stem.rsplit("-r", 1)[1]) % 2 == 1 else -1


def reported(s: RepeatSample, key: str) -> float:
    """A repeat's figure as metrics.summarize reports it (the P99 numpy's linear percentile)."""
    if key == "output_tokens_per_s":
        return float(s.figure(key, np.arange(len(s.e2e))[None, :])[0])
    values = {"ttft_ms.p99": s.ttft, "tpot_ms.p99": s.tpot}[key] * 1000.0
    return float(np.percentile(values[~np.isnan(values)], 99))


def host_noise(calibration: list[tuple[Path, Path]]) -> dict[str, HostNoise]:
    """Per gated figure, the calibration pairs' log ratios (A/A: truth 1) as sums of squares about 0."""
    b = [read_rows(p) for p, _ in calibration]
    c = [read_rows(q) for _, q in calibration]
    out = {}
    for key in KEYS:
        logs = np.log(per_repeat_figures(b, c, key))
        logs = logs[np.isfinite(logs)]
        out[key] = HostNoise(ss=float((logs ** 2).sum()), df=len(logs),
                             sources=(f"{len(logs)} A/A repeat pairs replayed",))
    return out


def judge(chosen: list[tuple[Path, Path]], *, slow: float, looks: int, seed: int,
          hosts: list[dict[str, HostNoise] | None]) -> list[tuple[dict, list]]:
    """The trial's intervals and verdicts, once per host noise in hosts (None: the run's own repeats)."""
    b = [read_rows(p) for p, _ in chosen]
    c = [read_rows(q, slow) for _, q in chosen]
    k = len(chosen)
    orders = np.array([order_of(pair) for pair in chosen])
    fail_alpha = FAIL_SHARE * 0.05 / (len(KEYS) * looks)  # as the stage splits it: gates x looks
    draws = {key: ratio_draws(b, c, key, draws=2000, seed=seed) for key in KEYS}
    per = {key: per_repeat_figures(b, c, key) for key in KEYS}
    comparison = {key: {"ratio": float(np.median([reported(y, key) / reported(x, key) for x, y in zip(b, c)]))}
                  for key in KEYS}
    out = []
    for host in hosts:
        intervals = {f"ratio:{key}": interval(draws[key], confidence=1 - 0.05 / looks, fail_alpha=fail_alpha,
                                              repeats=k, requests=min(len(s.e2e) for s in b + c), per_repeat=per[key],
                                              host_noise=host[key] if host else None, orders=orders).as_dict()
                     for key in KEYS}
        point = PerfPoint(workload="w", point="p", baseline={}, candidate={"error_rate": 0.0},
                          baseline_repeats=[{}] * k, candidate_repeats=[{}] * k, comparison=comparison, monitor={},
                          intervals=intervals)
        out.append((intervals, verdicts([point], GATES)))
    return out


def draw_trial(pool: list[tuple[Path, Path]], k: int, calibrate: int,
               rng: np.random.Generator) -> tuple[list[tuple[Path, Path]], list[tuple[Path, Path]]]:
    """k pairs in the stage's orders (+1, -1, +1, ...) and `calibrate` others for the host's noise."""
    firsts = {o: [i for i, pair in enumerate(pool) if order_of(pair) == o] for o in (1, -1)}
    want = {1: (k + 1) // 2, -1: k // 2}
    picked = {o: list(rng.choice(firsts[o], size=want[o], replace=False)) for o in (1, -1)}
    chosen = [pool[picked[1 if i % 2 == 0 else -1].pop()] for i in range(k)]
    rest = [i for i in range(len(pool)) if pool[i] not in chosen]
    calibration = [pool[i] for i in rng.choice(rest, size=calibrate, replace=False)] if calibrate else []
    return chosen, calibration


def adaptive(chosen: list[tuple[Path, Path]], start: int, *, slow: float, looks: int, seed: int,
             host: dict[str, HostNoise] | None) -> tuple[dict, list, int]:
    """The stage's adaptive repeats: judged at `start` pairs, one more while a gate is not shown."""
    for k in range(start, len(chosen) + 1):
        (ivs, vs), = judge(chosen[:k], slow=slow, looks=looks, seed=seed, hosts=[host])
        if not any(v.verdict == "inconclusive" for v in vs):
            break
    return ivs, vs, k


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
    ap.add_argument("--host-noise-from", type=int, default=0, metavar="K",
                    help="judge each trial also pooled with a host calibration of K other pairs")
    ap.add_argument("--adaptive", type=int, default=0, metavar="MAX",
                    help="add pairs one at a time while a gate is not shown, up to MAX (performance.max_repeats)")
    args = ap.parse_args()
    if args.export:
        print(f"exported {export(args.export, args.records)} files into {args.records}")
    pool = pairs(args.records)
    need = {o: sum(order_of(p) == o for p in pool) for o in (1, -1)}
    k_max = max(args.repeats + [args.adaptive])
    if need[1] < (k_max + 1) // 2 or need[-1] < k_max // 2 or len(pool) < k_max + args.host_noise_from:
        print(f"{args.records}: {len(pool)} repeat pairs ({need[1]} baseline-first, {need[-1]} candidate-first), "
              f"too few for --repeats {k_max} and --host-noise-from {args.host_noise_from}", file=sys.stderr)
        return 2
    print(f"{len(pool)} measured repeat pairs ({need[1]} baseline-first, {need[-1]} candidate-first); "
          f"{args.trials} trials per row; "
          + (f"adaptive up to {args.adaptive} pairs, pass side at 0.05/looks" if args.adaptive else
             f"pass side at 0.05/{args.looks}")
          + (f"; host noise from {args.host_noise_from} other pairs a trial" if args.host_noise_from else ""))
    gate_key = {g: PERF_GATES[g][0] for g in ("min_throughput_ratio", "max_p99_ttft_ratio", "max_p99_tpot_ratio")}
    print("\n| repeats | slowdown | noise | blocked | released | mean pairs | "
          + " | ".join(f"{k} passes" for k in KEYS)
          + " | " + " | ".join(f"{k} fails" for k in KEYS)
          + " | " + " | ".join(f"{k} holds the truth" for k in KEYS) + " |")
    print("|---|---|---|---|---|---|" + "---|" * (3 * len(KEYS)))
    rng = np.random.default_rng(0)
    modes = ["own"] + (["pooled"] if args.host_noise_from else [])
    for k in args.repeats:
        for slow in [1.0, *args.slowdowns]:
            counts = {m: {"blocked": 0, "released": 0, "pairs": 0, "passes": dict.fromkeys(KEYS, 0),
                          "fails": dict.fromkeys(KEYS, 0), "holds": dict.fromkeys(KEYS, 0)} for m in modes}
            truth = {"output_tokens_per_s": 1 / slow, "ttft_ms.p99": slow, "tpot_ms.p99": slow}
            for i in range(args.trials):
                chosen, calibration = draw_trial(pool, max(k, args.adaptive), args.host_noise_from, rng)
                hosts = [None] + ([host_noise(calibration)] if args.host_noise_from else [])
                if args.adaptive:
                    looks = max(args.adaptive - k + 1, 1)
                    judged = [adaptive(chosen, k, slow=slow, looks=looks, seed=i, host=h) for h in hosts]
                else:
                    judged = [(ivs, vs, k) for ivs, vs in judge(chosen, slow=slow, looks=args.looks, seed=i,
                                                                 hosts=hosts)]
                for mode, (ivs, vs, used) in zip(modes, judged):
                    n = counts[mode]
                    n["pairs"] += used
                    n["blocked"] += any(v.verdict == "fail" for v in vs)
                    n["released"] += all(v.verdict == "pass" for v in vs)
                    for v in vs:
                        n["passes"][gate_key[v.gate]] += v.verdict == "pass"
                        n["fails"][gate_key[v.gate]] += v.verdict == "fail"
                    for key in KEYS:
                        iv = ivs[f"ratio:{key}"]
                        n["holds"][key] += iv["pass_low"] <= truth[key] <= iv["pass_high"]
            t = args.trials
            for mode in modes:
                n = counts[mode]
                label = "run's own" if mode == "own" else f"pooled, host {args.host_noise_from} df"
                print(f"| {k} | {slow:g}x | {label} | {n['blocked'] / t:.3f} | {n['released'] / t:.3f} | "
                      f"{n['pairs'] / t:.2f} | "
                      + " | ".join(f"{n['passes'][key] / t:.2f}" for key in KEYS) + " | "
                      + " | ".join(f"{n['fails'][key] / t:.3f}" for key in KEYS) + " | "
                      + " | ".join(f"{n['holds'][key] / t:.2f}" for key in KEYS) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
