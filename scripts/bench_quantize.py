#!/usr/bin/env python3
"""Benchmark the quantize stage against a bare llm-compressor `oneshot` call.

For each shipped recipe (on the default model unless --model is given) it runs, each in
a fresh process and alternating the order per repeat:
  quantlab  `python -m quantlab quantize RECIPE --output DIR`
  bare      a minimal script: load model + tokenizer, wrap the same pre-tokenized
            calibration samples in a Dataset, oneshot(...) with the same modifiers,
            save compressed. No preflight, hashing, records or atomic output.
It reports wall time and peak RSS (from wait4 on that process) and the quantlab/bare
ratios, as medians over the repeats. Target: quantlab adds <= 5% time, <= 10% memory.

Usage: .venv/bin/python scripts/bench_quantize.py [--repeats N] [--recipes a b ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

BARE = r'''
import json, sys, torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from llmcompressor import oneshot
spec = json.load(open(sys.argv[1]))
if spec["shim"]:
    from quantlab.quantize.shims import awq_pin_memory_without_accelerator
    awq_pin_memory_without_accelerator()
from quantlab.quantize.llmcompressor import instantiate
model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.bfloat16)
tok = AutoTokenizer.from_pretrained(spec["model"])
recipe = spec["raw"] if spec["raw"] is not None else instantiate([tuple(p) for p in spec["plan"]])
kw = {}
if spec["ids"]:
    ids = spec["ids"]
    kw = dict(dataset=Dataset.from_dict({"input_ids": ids, "attention_mask": [[1]*len(i) for i in ids]}),
              num_calibration_samples=len(ids), max_seq_length=spec["max_seq_length"],
              shuffle_calibration_samples=False)
oneshot(model=model, tokenizer=tok, recipe=recipe, output_dir=spec["out"], save_compressed=True, **kw)
'''


def run_measured(cmd: list[str], env: dict) -> tuple[float, int, int]:
    # stderr goes to a file, not a pipe: a full pipe would block the child mid-run
    with tempfile.TemporaryFile() as errfile:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errfile, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        errfile.seek(0)
        err = errfile.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
    return wall, usage.ru_maxrss * 1024, proc.returncode


def bare_spec(recipe_path: Path, out: Path) -> dict:
    """Everything the bare call needs, computed outside the timed region."""
    from transformers import AutoTokenizer

    from quantlab.quantize.calibration import build_calibration_set
    from quantlab.models.source import resolve_model
    from quantlab.quantize.modifier_plan import plan_modifiers, raw_recipe_text
    from quantlab.recipe.file import load_recipe

    loaded = load_recipe(recipe_path)
    r = loaded.recipe
    model = resolve_model(r.model.source, base_dir=loaded.base_dir, progress=lambda m: None)
    ids = []
    if r.calibration is not None and r.quantization.needs_calibration:
        tok = AutoTokenizer.from_pretrained(model.path)
        ids = build_calibration_set(r.calibration, loaded.calibration_paths(), tok).input_ids
    raw = raw_recipe_text(r.quantization) if r.quantization.method == "raw" else None
    return {
        "model": str(model.path), "out": str(out), "ids": ids,
        "max_seq_length": r.calibration.max_seq_length if r.calibration else None,
        "plan": None if raw else plan_modifiers(r.quantization), "raw": raw,
        "shim": r.quantization.method == "awq",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--recipes", nargs="*", help="recipe names (default: all shipped)")
    ap.add_argument("--json", type=Path, help="also write the raw measurements here")
    ap.add_argument("--keep", type=Path, help="keep quantlab's checkpoints here (one folder per recipe)")
    args = ap.parse_args()
    recipes = sorted((REPO / "recipes").glob("*.yaml"))
    if args.recipes:
        recipes = [p for p in recipes if p.stem in args.recipes]
    env = dict(os.environ)
    rows, raw = [], {}
    with tempfile.TemporaryDirectory(prefix="qlbench-") as tmpdir:
        tmp = Path(tmpdir)
        for recipe in recipes:
            spec_file = tmp / f"{recipe.stem}.json"
            spec_file.write_text(json.dumps(bare_spec(recipe, tmp / f"{recipe.stem}-bare")))
            bare_script = tmp / "bare.py"
            bare_script.write_text(BARE)
            m = {"quantlab": [], "bare": []}
            for i in range(args.repeats):
                order = ["quantlab", "bare"] if i % 2 == 0 else ["bare", "quantlab"]
                for which in order:
                    out = tmp / f"{recipe.stem}-{which}"
                    if which == "quantlab" and args.keep:
                        out = args.keep / recipe.stem
                    if which == "quantlab":
                        cmd = [sys.executable, "-m", "quantlab", "quantize", str(recipe), "--output", str(out), "--overwrite"]
                    else:
                        cmd = [sys.executable, str(bare_script), str(spec_file)]
                    wall, rss, _ = run_measured(cmd, env)
                    m[which].append((wall, rss))
                    print(f"{recipe.stem:<24} {which:<8} wall {wall:7.1f} s  peak RSS {rss / 2**30:5.2f} GiB", flush=True)
            qt = statistics.median(w for w, _ in m["quantlab"])
            bt = statistics.median(w for w, _ in m["bare"])
            qm = statistics.median(r for _, r in m["quantlab"])
            bm = statistics.median(r for _, r in m["bare"])
            rows.append((recipe.stem, qt, bt, qt / bt, qm, bm, qm / bm))
            raw[recipe.stem] = m
    print(f"\nworkload: default model unless the recipe says otherwise; calibration as each recipe says; "
          f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}; repeats {args.repeats}")
    print("| recipe | quantlab wall s | bare wall s | time ratio | quantlab peak RSS GiB | bare peak RSS GiB | memory ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, qt, bt, tr, qm, bm, mr in rows:
        print(f"| {name} | {qt:.1f} | {bt:.1f} | {tr:.3f} | {qm / 2**30:.2f} | {bm / 2**30:.2f} | {mr:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(raw, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
