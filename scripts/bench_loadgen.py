"""The load generator's own ceiling on this machine: requests and tokens per second it
drives against a stub server that answers instantly, the latency it adds, and its CPU
use. A measured workload point near these figures measures the client, not the engine.

    .venv/bin/python scripts/bench_loadgen.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    sys.path.insert(0, str(REPO))
    from quantlab.performance.loadgen import measure_client_ceiling

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    runs = [measure_client_ceiling(concurrency=args.concurrency, tokens=args.tokens) for _ in range(args.repeats)]
    print(f"workload: {runs[0]['workload']}; medians of {args.repeats}")
    for key in ("requests_per_s", "tokens_per_s", "added_latency_ms", "client_cpu_share"):
        vals = [r[key] for r in runs]
        print(f"{key:>18}: {statistics.median(vals):10.2f}  (min {min(vals):.2f}, max {max(vals):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
