#!/usr/bin/env python3
"""Two vLLM servers started one after the other vs at the same time, on this machine.

Serves the default model (bf16) as the baseline and a checkpoint folder as the
candidate (default: the newest gptq-w4a16 run's checkpoint under runs/), both with
max_model_len 2048 and quantlab's compile cache (warm it first with one start each:
--warm). Alternates the two orders `--repeats` times and prints the wall time until
both answer /health, median per way.

Usage: .venv/bin/python scripts/bench_concurrent_start.py [--candidate DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def start_both(plan, log_dir: Path, *, together: bool) -> float:
    """Seconds until both servers of the plan answer /health (then both are stopped)."""
    from quantlab.serving.vllm_server import prepare_engine, start_together

    quiet = lambda m: None  # noqa: E731
    servers = [prepare_engine(plan, role, log_dir=log_dir, progress=quiet) for role in ("baseline", "candidate")]
    t0 = time.monotonic()
    try:
        if together:  # quantlab's way with serve.side_by_side: both processes started, then waited for
            start_together(servers, quiet)
        else:
            for server in servers:
                start_together([server], quiet)
        return time.monotonic() - t0
    finally:
        for server in servers:
            server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidate", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warm", action="store_true", help="one untimed start of both first (compile cache)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from quantlab.models.source import build_default_model

    model = build_default_model(progress=lambda m: None).path
    candidate = args.candidate or max((REPO / "runs" / "gptq-w4a16").glob("*/checkpoint"),
                                      key=lambda p: p.stat().st_mtime)
    from quantlab.serving.vllm_probe import probe_for
    from quantlab.recipe.serve import ServeSpec
    from quantlab.serving.plan import EngineTarget, plan_serving

    spec = ServeSpec(engine_args={"max_model_len": 2048}, startup_timeout_s=900, side_by_side=True)
    plan = plan_serving(spec, [EngineTarget("baseline", model, "baseline"),
                               EngineTarget("candidate", candidate, "candidate")],
                        dtype="bfloat16", probe=probe_for(spec))
    times: dict[str, list[float]] = {"one after the other": [], "at the same time": []}
    with tempfile.TemporaryDirectory(prefix="quantlab-start-") as tmp:
        if args.warm:
            start_both(plan, Path(tmp) / "warm", together=False)
        for i in range(args.repeats):
            order = [False, True] if i % 2 == 0 else [True, False]
            for together in order:
                took = start_both(plan, Path(tmp) / f"r{i}-{together}", together=together)
                times["at the same time" if together else "one after the other"].append(took)
                print(f"repeat {i + 1}: {'together' if together else 'in turn'} {took:.1f} s", flush=True)
    seq, par = (statistics.median(v) for v in times.values())
    print(f"baseline {model.name} + candidate {candidate}, max_model_len 2048, {args.repeats} repeats")
    for label, values in times.items():
        print(f"  {label:<20} median {statistics.median(values):6.1f} s  ({', '.join(f'{v:.1f}' for v in values)})")
    print(f"  at the same time / one after the other: {par / seq:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
