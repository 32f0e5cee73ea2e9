#!/usr/bin/env python3
"""Quality evaluation of two servers one after the other vs at the same time.

Serves the default model twice (bf16 unless --dtype, max_model_len 2048, quantlab's
compile cache; QUANTLAB_EMULATE_CPU=avx2 for the AVX2-only kind, with --dtype float32), one
untimed evaluation first (so both orders meet a warm server), then alternates the two
ways `--repeats` times: lm-eval over default-suite tasks against each server in turn,
and against both at once (what `quality.concurrent_roles` does with serve.side_by_side).
Prints the wall time per way, medians and their ratio.

Usage: .venv/bin/python scripts/bench_concurrent_roles.py [--tasks a,b] [--limit 30] [--repeats 2]
                                                        [--dtype float32] [--split-cores]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TASKS = "ql_lastword,ql_arithmetic,ql_passkey_350w,ql_chat"


def evaluate(server, tasks: list[str], chat: list[str], model: Path, out: Path, limit: int, stop=None) -> float:
    from quantlab.quality.lmeval import run_tasks
    from quantlab.quality.samples import Docs
    from quantlab.quality.suites import SHIPPED

    started = time.monotonic()
    run_tasks(tasks=tasks, chat_tasks=chat, base_url=server.base_url, served_name=server.served_name,
              tokenizer=str(model), suite_dir=SHIPPED / "default", out_dir=out, log_path=out.with_suffix(".log"),
              seed=1234, docs={t: Docs(0, limit) for t in tasks + chat}, num_concurrent=8, request_timeout_s=300,
              max_retries=1, deadline_s=3600, offline=True, trust_remote_code=False, progress=lambda line: None, stop=stop)
    return time.monotonic() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=TASKS)
    ap.add_argument("--limit", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--split-cores", action="store_true", help="bind the baseline's engine threads to "
                    "core 0 and the candidate's to core 1 (VLLM_CPU_OMP_THREADS_BIND) instead of vLLM's binding")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from quantlab.core.together import run_together
    from quantlab.models.source import build_default_model
    from quantlab.quality.suites import SHIPPED, load_suite
    from quantlab.serving.plan import EngineTarget, plan_serving
    from quantlab.recipe.serve import ServeSpec
    from quantlab.serving.vllm_probe import probe_for
    from quantlab.serving.vllm_server import prepare_engine, start_together

    model = build_default_model(progress=lambda m: None).path
    names = args.tasks.split(",")
    suite = load_suite(SHIPPED / "default")
    chat = [t.task for t in suite.tasks if t.task in names and t.api == "chat"]
    plain = [n for n in names if n not in chat]
    spec = ServeSpec(engine_args={"max_model_len": 2048}, startup_timeout_s=900, side_by_side=True)
    targets = [EngineTarget(role, model, role) for role in ("baseline", "candidate")]
    plan = plan_serving(spec, targets, dtype=args.dtype, probe=probe_for(spec))
    quiet = lambda m: None  # noqa: E731
    times: dict[str, list[float]] = {"one after the other": [], "at the same time": []}
    with tempfile.TemporaryDirectory(prefix="quantlab-roles-") as tmp:
        servers = [prepare_engine(plan, role, log_dir=Path(tmp), progress=quiet) for role in ("baseline", "candidate")]
        if args.split_cores:
            for core, s in enumerate(servers):
                s.plan.env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
        try:
            start_together(servers, quiet)
            for s in servers:  # untimed: the first requests of a fresh server pay its warm-up
                evaluate(s, plain, chat, model, Path(tmp) / f"warm-{s.role}", args.limit)
            for i in range(args.repeats):
                for together in ([False, True] if i % 2 == 0 else [True, False]):
                    out = Path(tmp) / f"r{i}-{together}"
                    t0 = time.monotonic()
                    if together:
                        run_together({s.role: lambda stop, s=s: evaluate(s, plain, chat, model, out / s.role,
                                                                         args.limit, stop) for s in servers})
                    else:
                        for s in servers:
                            evaluate(s, plain, chat, model, out / s.role, args.limit)
                    took = time.monotonic() - t0
                    times["at the same time" if together else "one after the other"].append(took)
                    print(f"repeat {i + 1}: {'at once' if together else 'in turn'} {took:.1f} s", flush=True)
        finally:
            for s in servers:
                s.stop()
    seq, par = (statistics.median(v) for v in times.values())
    where = " on cores 0 and 1" if args.split_cores else ""
    print(f"default model {args.dtype} x 2 servers{where}, tasks {','.join(names)}, {args.limit} samples each, "
          f"{args.repeats} repeats")
    for label, values in times.items():
        print(f"  {label:<20} median {statistics.median(values):6.1f} s  ({', '.join(f'{v:.1f}' for v in values)})")
    print(f"  one after the other / at the same time: {seq / par:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
