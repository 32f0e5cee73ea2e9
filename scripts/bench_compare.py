"""What a comparison run saves: N recipes as one `quantlab run a.yaml b.yaml ...` against
N separate `quantlab run`s, on the same machine, one after the other.

    .venv/bin/python scripts/bench_compare.py [--recipes R1 R2 R3] [--full] [--out bench.md]

Each arm starts from its own empty baseline-result cache (quality and stability), sharing
the built default model, the serving probe and vLLM's compile cache. The separate runs
quantize; the comparison takes their checkpoints from the cache (the same quantization
would cost both arms the same), so the ratio without quantization is measured directly
and the one with it adds the separate runs' quantize time to the comparison. The
separate runs reuse the baseline's quality results from the second run on, as a user's
would. By default the
recipes are trimmed to fit a CPU session (4 quality tasks of 40 items, one load point at
concurrency 8, stability off); --full runs them as shipped.

Prints per arm the wall time, the sum of stage durations without quantization, and the
ratio comparison / separate, and the comparison's table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DEFAULT = ["recipes/gptq-w4a16.yaml", "recipes/awq-w4a16.yaml", "recipes/smoothquant-gptq-w8a8.yaml"]
SHARED_CACHE = ("models", "probes", "vllm", "keys", "hash-index.json")


def trimmed(recipe: Path, out: Path, full: bool) -> Path:
    data = yaml.safe_load(recipe.read_text())
    for ds in (data.get("calibration") or {}).get("datasets", []):
        ds["path"] = str((recipe.parent / ds["path"]).resolve())
    if not full:
        data["quality"] = {**data.get("quality", {}), "samples": "all", "limit": 40,
                           "tasks": ["ql_arithmetic", "ql_json_extract", "ql_chat", "ql_code"]}
        perf = data.get("performance") or {}
        perf["workloads"] = [{**perf["workloads"][0], "concurrency": [8]}]
        perf["max_repeats"] = perf.get("repeats", 2)
        data["performance"] = perf
        data.pop("stability", None)
        data["release"] = {"policy": {"not_shown": "warn"}}
    path = out / recipe.name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fresh_cache(root: Path, name: str, checkpoints: Path | None = None) -> Path:
    from quantlab.core.layout import cache_dir

    src, dst = cache_dir(), root / name
    dst.mkdir(parents=True)
    if checkpoints is not None:
        os.symlink(checkpoints, dst / "checkpoints")
    for entry in SHARED_CACHE:
        if (src / entry).is_dir():
            os.symlink(src / entry, dst / entry)
        elif (src / entry).is_file():
            shutil.copyfile(src / entry, dst / entry)
    return dst


def quantlab(args: list, cache: Path, log: Path) -> tuple[int, float, str]:
    env = {**os.environ, "QUANTLAB_CACHE_DIR": str(cache)}
    t0 = time.perf_counter()
    with open(log, "a") as f:
        r = subprocess.run([sys.executable, "-m", "quantlab", *map(str, args)], stdout=subprocess.PIPE,
                           stderr=f, text=True, env=env, cwd=REPO, timeout=4 * 3600)
    return r.returncode, time.perf_counter() - t0, r.stdout.strip()


def stage_seconds(run_json: Path) -> tuple[float, float]:
    """(all stages, all but quantize) of one run record."""
    stages = json.loads(run_json.read_text())["stages"]
    total = sum(s["duration_s"] for s in stages.values())
    return total, total - stages.get("quantize", {}).get("duration_s", 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", nargs="+", default=DEFAULT)
    ap.add_argument("--full", action="store_true", help="the recipes as shipped (hours on a CPU)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--keep", type=Path, help="keep the run folders here")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    work = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    keep = args.keep or work
    recipes = [trimmed(REPO / r, work, args.full) for r in args.recipes]
    lines = [f"# bench_compare: {len(recipes)} recipes, {'as shipped' if args.full else 'trimmed'}",
             f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs", ""]

    cache = fresh_cache(work, "cache-separate")
    sep_wall, sep_stages, sep_noq = 0.0, 0.0, 0.0
    for r in recipes:
        rc, wall, out = quantlab(["run", r, "--runs-dir", keep / "separate"], cache, work / "separate.log")
        # the record, whatever the decision (a blocked run's last line is not its path)
        records = sorted((keep / "separate" / yaml.safe_load(r.read_text())["name"]).glob("*/run.json"))
        total, noq = stage_seconds(records[-1]) if records else (float("nan"),) * 2
        lines.append(f"separate {r.stem}: exit {rc}, wall {wall:.0f} s, stages {total:.0f} s "
                     f"({noq:.0f} s without quantize)")
        sep_wall, sep_stages, sep_noq = sep_wall + wall, sep_stages + total, sep_noq + noq

    cache = fresh_cache(work, "cache-compare", checkpoints=cache / "checkpoints")
    rc, cmp_wall, out = quantlab(["run", *recipes, "--runs-dir", keep / "compare"], cache, work / "compare.log")
    result = json.loads(Path(out).read_text()) if out.endswith("comparison.json") else {}
    folder = Path(out).parent if out else None
    cmp_quantize = sum(json.loads((folder / p / "run.json").read_text())["stages"].get("quantize", {})
                       .get("duration_s", 0.0) for p in result.get("runs", {}).values()
                       if (folder / p / "run.json").is_file()) if folder else float("nan")
    sep_quantize = sep_stages - sep_noq
    lines += ["", f"comparison: exit {rc}, wall {cmp_wall:.0f} s (quantize {cmp_quantize:.0f} s: cached), "
              f"chosen: {result.get('chosen')}", "",
              f"without quantization: comparison / separate = {cmp_wall - cmp_quantize:.0f} s / "
              f"{sep_wall - sep_quantize:.0f} s = {(cmp_wall - cmp_quantize) / (sep_wall - sep_quantize):.2f}",
              f"with the same quantization in both: {(cmp_wall - cmp_quantize + sep_quantize) / sep_wall:.2f}",
              "", (folder / "comparison.md").read_text() if folder and (folder / "comparison.md").is_file() else ""]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    print(f"logs: {work}")


if __name__ == "__main__":
    main()
