#!/usr/bin/env python3
"""A perplexity task scored one document at a time (lm-eval's own `loglikelihood_rolling`)
against every document's windows at once (`quantlab.quality.lmeval_rolling`), on one served
model, in one run: the two alternate, each repeat scores the same documents, and the table
gives each way's median seconds, their ratio, and how far the per-document log-likelihoods
and the task's word perplexity differ.

    .venv/bin/python scripts/bench_perplexity_batching.py [--checkpoint DIR] [--repeats 3]
        [--limit 40] [--concurrency 8] [--task ql_prose_ppl]

Serves the embedded default model (bf16) unless --checkpoint names another; the suite is
the shipped default one. Engine output goes to a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from bench_tests import cpu_kind  # noqa: E402


def evaluate(lm, task: str, limit: int, suites: Path) -> tuple[float, float, list[float]]:
    import os

    import lm_eval
    from lm_eval.tasks import TaskManager

    os.chdir(suites)  # the task files name their data relative to the suite folder

    t = time.perf_counter()
    r = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=TaskManager(include_path=str(suites),
                                include_defaults=False), limit=limit, log_samples=True, bootstrap_iters=0,
                                random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    seconds = time.perf_counter() - t
    loglik = [float(s["resps"][0][0]) for s in sorted(r["samples"][task], key=lambda s: s["doc_id"])]
    return seconds, float(r["results"][task]["word_perplexity,none"]), loglik


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, help="serve this folder instead of the default model")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=8, help="num_concurrent, as in a recipe's quality section")
    ap.add_argument("--task", default="ql_prose_ppl")
    args = ap.parse_args()

    from lm_eval.api.registry import get_model

    from quantlab.core.shipped import EVAL_SUITES
    from quantlab.models.source import build_default_model
    from quantlab.quality.lmeval_rolling import batch_rolling_requests
    from quantlab.recipe.serve import ServeSpec
    from quantlab.serving.plan import EngineTarget, plan_serving
    from quantlab.serving.vllm_probe import probe_serving_env, serving_python
    from quantlab.serving.vllm_server import open_engine

    default = build_default_model(progress=lambda m: None).path
    model = args.checkpoint or default
    spec = ServeSpec(engine_args={"max_model_len": 2048}, startup_timeout_s=900)
    probe = probe_serving_env(serving_python(spec))
    plan = plan_serving(spec, [EngineTarget("candidate", model, "bench")], dtype="bfloat16", probe=probe)
    suites = EVAL_SUITES / "default"
    times: dict[str, list[float]] = {"per document (lm-eval's own)": [], "all documents at once": []}
    results: dict[str, tuple[float, list[float]]] = {}
    with tempfile.TemporaryDirectory() as logs, open_engine(plan, "candidate", log_dir=Path(logs),
                                                             progress=lambda m: None) as server:
        os.environ["OPENAI_API_KEY"] = server.api_key  # lm-eval's local-completions sends it as its bearer token

        def make_lm():
            return get_model("local-completions").create_from_arg_obj({
                "base_url": f"{server.base_url}/v1/completions", "model": server.served_name,
                "num_concurrent": args.concurrency, "max_retries": 3, "timeout": 600, "seed": 0,
                "tokenizer": str(model), "tokenizer_backend": "huggingface"})

        ways = {"per document (lm-eval's own)": make_lm(), "all documents at once": batch_rolling_requests(make_lm())}
        evaluate(ways["per document (lm-eval's own)"], args.task, 2, suites)  # warm the server's compiled shapes
        for _ in range(args.repeats):
            for name, lm in ways.items():
                seconds, ppl, loglik = evaluate(lm, args.task, args.limit, suites)
                times[name].append(seconds)
                results[name] = (ppl, loglik)
    (ppl_a, ll_a), (ppl_b, ll_b) = results.values()
    worst = max(abs(a - b) / max(abs(a), 1e-9) for a, b in zip(ll_a, ll_b, strict=True))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    one, together = medians.values()
    print(f"{args.task}, {args.limit} documents, num_concurrent {args.concurrency}, {args.repeats} alternating "
          f"repeats, serving {model.name} on {cpu_kind()}\n")
    print("| scored | median s | every repeat (s) | word perplexity |\n|---|---|---|---|")
    for (name, ts), ppl in zip(times.items(), (ppl_a, ppl_b), strict=True):
        print(f"| {name} | {medians[name]:.1f} | {', '.join(f'{t:.1f}' for t in ts)} | {ppl:.4f} |")
    print(f"\nall at once / per document: {together / one:.2f} of the time; per-document log-likelihoods differ by "
          f"at most {worst:.2e} (relative)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
