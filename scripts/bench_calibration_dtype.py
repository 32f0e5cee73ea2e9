#!/usr/bin/env python3
"""Calibrate in bf16 or in float32: time, memory, and whether the checkpoint is as good.

For one recipe (default: the shipped GPTQ W4A16 on the default model) it quantizes once
per `quantization.calibration_dtype` (bfloat16, float32), each in a fresh
`quantlab quantize` process, alternating the order per repeat, and reports:
  - wall time, the oneshot time quantlab records, and peak RSS (wait4), medians;
  - how far the two checkpoints agree: share of equal integer codes, scale differences;
  - with --validate: `quantlab validate` of each checkpoint with the recipe's quality
    section only (one baseline, cached after the first), each task's score and the gate
    verdicts, side by side.
On a CPU without native bf16 (an AVX2-only EPYC) float32 is the one 'auto' picks; on a
richer host, --emulate-avx2 (QUANTLAB_EMULATE_CPU=avx2: torch and oneDNN held to AVX2,
vLLM on its _C_AVX2 library) shows the same effect, exaggerated: emulated bf16 there is
slower than on a real AVX2 host. The host and the emulation are printed with the figures.

Usage: .venv/bin/python scripts/bench_calibration_dtype.py [--recipe R] [--repeats N]
       [--samples N] [--dtypes bfloat16 float32] [--emulate-avx2] [--validate] [--limit N] [--json OUT]
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

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))


def host() -> dict:
    flags = ""
    model = platform.processor()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags = line
            break
    kinds = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
    return {"cpu": model, "cores": os.cpu_count(), "isa": kinds,
            "emulated": os.environ.get("QUANTLAB_EMULATE_CPU") or None}


def run_measured(cmd: list[str], env: dict, log: Path) -> tuple[float, int]:
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"command failed ({code}): {' '.join(map(str, cmd))}\n{log.read_text()[-3000:]}")
    return wall, usage.ru_maxrss * 1024


def recipe_for(base: dict, dtype: str, samples: int | None, folder: Path) -> Path:
    data = json.loads(json.dumps(base))
    data["quantization"]["calibration_dtype"] = dtype
    data["quantization"]["reuse_checkpoint"] = False
    if samples and data.get("calibration"):
        data["calibration"]["num_samples"] = samples
    for key in ("performance", "stability"):
        data.pop(key, None)
    path = folder / f"{data['name']}-{dtype}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def agreement(a_dir: Path, b_dir: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    a, b = load_file(a_dir / "model.safetensors"), load_file(b_dir / "model.safetensors")
    equal = total = 0
    scale_rel = []
    for k, x in a.items():
        y = b[k]
        if k.endswith("weight_packed"):  # 8 int4 codes per int32
            x = torch.stack([(x >> s) & 0xF for s in range(0, 32, 4)])
            y = torch.stack([(y >> s) & 0xF for s in range(0, 32, 4)])
        elif not (x.dtype == torch.int8 and k.endswith(".weight")):
            if k.endswith("weight_scale"):
                rel = (x.float() - y.float()).abs() / x.float().abs().clamp(min=1e-12)
                scale_rel.append(rel.median().item())
            continue
        equal += (x == y).sum().item()
        total += x.numel()
    return {"int_codes_equal": round(equal / total, 4) if total else None,
            "median_scale_rel_diff": round(statistics.median(scale_rel), 5) if scale_rel else None}


def validate(recipe: Path, checkpoint: Path, runs: Path, env: dict, log: Path) -> dict:
    wall, _ = run_measured([sys.executable, "-m", "quantlab", "validate", str(recipe), "--checkpoint",
                            str(checkpoint), "--runs-dir", str(runs)], env, log)
    name = yaml.safe_load(recipe.read_text())["name"]
    run_dir = sorted((runs / name).iterdir())[-1]
    record = json.loads((run_dir / "run.json").read_text())
    quality = record["stages"]["quality"]["result"]
    verdicts = [g["verdict"] for g in quality["gates"]]
    return {"wall_s": round(wall, 1), "decision": record["status"],
            "served_dtype": record["stages"]["serve"]["result"].get("dtype", {}).get("dtype"),
            "verdicts": {v: verdicts.count(v) for v in ("pass", "fail", "inconclusive")},
            "failed": sorted(f"{g['gate']}@{g['scope']}" for g in quality["gates"] if g["verdict"] == "fail"),
            "tasks": {t["task"]: {"baseline": round(t["baseline"], 4), "candidate": round(t["candidate"], 4),
                                  "n": t["n"]} for t in quality["tasks"]},
            "kl_mean": (quality.get("kl") or {}).get("mean")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes" / "gptq-w4a16.yaml")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--samples", type=int, default=None, help="calibration samples (default: the recipe's)")
    ap.add_argument("--emulate-avx2", action="store_true", help="QUANTLAB_EMULATE_CPU=avx2 for every child")
    ap.add_argument("--validate", action="store_true", help="also validate each checkpoint's quality")
    ap.add_argument("--limit", type=int, default=None, help="quality.limit for --validate")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    env = dict(os.environ)
    if args.emulate_avx2:
        env["QUANTLAB_EMULATE_CPU"] = "avx2"
    os.environ.update({k: v for k, v in env.items() if k == "QUANTLAB_EMULATE_CPU"})
    base = yaml.safe_load(args.recipe.read_text())
    for ds in (base.get("calibration") or {}).get("datasets", []):
        ds["path"] = str((args.recipe.parent / ds["path"]).resolve())
    if args.limit is not None and base.get("quality") is not None:
        base["quality"]["limit"] = args.limit

    work = Path(tempfile.mkdtemp(prefix="quantlab-bench-dtype-"))
    recipes = {d: recipe_for(base, d, args.samples, work) for d in args.dtypes}
    rows: dict[str, list[dict]] = {d: [] for d in args.dtypes}
    for rep in range(args.repeats):
        order = args.dtypes if rep % 2 == 0 else list(reversed(args.dtypes))
        for d in order:
            out = work / f"ckpt-{d}-{rep}"
            wall, rss = run_measured([sys.executable, "-m", "quantlab", "quantize", str(recipes[d]), "--output",
                                      str(out)], env, work / f"quantize-{d}-{rep}.log")
            q = json.loads((out / "quantize.json").read_text())
            rows[d].append({"wall_s": wall, "oneshot_s": q["timings"]["oneshot_and_save_s"], "peak_rss": rss,
                            "compute_dtype": q["compute_dtype"]["dtype"], "dir": out})
            print(f"[bench] {d} repeat {rep + 1}: {wall:.1f} s wall, oneshot {q['timings']['oneshot_and_save_s']:.1f}"
                  f" s, peak RSS {rss / 1e9:.2f} GB", flush=True)
    result = {"host": host(), "recipe": str(args.recipe), "samples": args.samples or base["calibration"]["num_samples"],
              "repeats": args.repeats, "dtypes": {}}
    for d, rs in rows.items():
        result["dtypes"][d] = {"wall_s": round(statistics.median(r["wall_s"] for r in rs), 1),
                               "oneshot_s": round(statistics.median(r["oneshot_s"] for r in rs), 1),
                               "peak_rss_gb": round(statistics.median(r["peak_rss"] for r in rs) / 1e9, 2)}
    if len(args.dtypes) == 2:
        a, b = (rows[d][0]["dir"] for d in args.dtypes)
        result["agreement"] = agreement(a, b)
        result["oneshot_ratio"] = round(result["dtypes"][args.dtypes[1]]["oneshot_s"]
                                        / result["dtypes"][args.dtypes[0]]["oneshot_s"], 3)
    if args.validate:
        runs = work / "runs"
        for d in args.dtypes:
            result["dtypes"][d]["quality"] = validate(recipes[d], rows[d][0]["dir"], runs, env,
                                                      work / f"validate-{d}.log")
    print(json.dumps(result, indent=1, default=str))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    print(f"[bench] work folder: {work}")


if __name__ == "__main__":
    main()
