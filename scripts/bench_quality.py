#!/usr/bin/env python3
"""Time the quality stage cold (baseline evaluated) and warm (baseline from the cache).

Runs `quantlab validate RECIPE --checkpoint CKPT` twice against a fresh quality-baseline
cache (models, keys and the compile cache are shared with the user's cache, so nothing is rebuilt), then
prints each run's stage times, the quality stage's per-role evaluation time, whether a
baseline server was started, the gates' verdict counts and the samples each gate needed.

Usage: python scripts/bench_quality.py RECIPE CHECKPOINT [--runs-dir DIR] [--keep-cache]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def user_cache() -> Path:
    env = os.environ.get("QUANTLAB_CACHE_DIR")
    return Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "quantlab"


def one_run(recipe: Path, checkpoint: Path, runs: Path, cache: Path) -> dict:
    before = set(runs.glob("*/*")) if runs.exists() else set()
    r = subprocess.run([sys.executable, "-m", "quantlab", "validate", str(recipe), "--checkpoint", str(checkpoint),
                        "--runs-dir", str(runs)], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "QUANTLAB_CACHE_DIR": str(cache)})
    [run_dir] = sorted(set(runs.glob("*/*")) - before)
    record = json.loads((run_dir / "run.json").read_text())
    return {"exit": r.returncode, "run_dir": run_dir, "record": record}


def describe(label: str, run: dict) -> None:
    rec = run["record"]
    stages = {n: s["duration_s"] for n, s in rec["stages"].items()}
    q = (rec["stages"].get("quality") or {}).get("result") or {}
    serve = (rec["stages"].get("serve") or {}).get("result") or {}
    print(f"\n== {label}: exit {run['exit']}, {run['run_dir']}")
    print("stage seconds: " + ", ".join(f"{n} {s:.1f}" for n, s in stages.items())
          + f"; total {sum(stages.values()):.1f}")
    print(f"servers started: {sorted((serve.get('engines') or {}))}; baseline from cache: {q.get('baseline_cached')}")
    print("quality evaluation seconds per role: " + json.dumps({k: round(v, 1) for k, v in
                                                               (q.get('seconds') or {}).items()}))
    gates = q.get("gates") or []
    print("quality verdicts: " + json.dumps(Counter(g["verdict"] for g in gates)))
    needed = [(g["scope"], g["verdict"], g["samples"], g["samples_to_verdict"]) for g in gates
              if g["gate"] == "non_inferiority"]
    for scope, verdict, n, k in needed:
        print(f"  non-inferiority {scope}: {verdict} with {n} samples; "
              + (f"verdict held from {k}" if verdict != "inconclusive" and k else
                 f"about {k} would tell" if k else "no estimate"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", type=Path)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--runs-dir", type=Path, default=Path("runs-bench-quality"))
    ap.add_argument("--keep-cache", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="quantlab-bench-cache-") as tmp:
        cache = Path(tmp)
        for shared in ("models", "keys", "vllm"):  # built models, signing key, compile cache
            if (user_cache() / shared).exists():
                (cache / shared).symlink_to(user_cache() / shared)
        cold = one_run(args.recipe, args.checkpoint, args.runs_dir, cache)
        warm = one_run(args.recipe, args.checkpoint, args.runs_dir, cache)
        describe("cold (baseline evaluated)", cold)
        describe("warm (baseline cached)", warm)
        c, w = (sum(s["duration_s"] for s in r["record"]["stages"].values()) for r in (cold, warm))
        print(f"\nwarm / cold total: {w / c:.2f}")
        if args.keep_cache:
            print(f"cache kept in {cache} (deleted on exit otherwise)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
