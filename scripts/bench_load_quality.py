#!/usr/bin/env python3
"""What the load_quality check costs and finds on a real recipe: the recipe (default: the
demo's W4A16 one on the embedded default model) extended with a `load_quality` section, run
once with `quantlab run`, then from its run record: each stage's wall time (the performance
stage beside load_quality, whose cost the check is meant to stay within), each role's accuracy
on the slice at concurrency 1 and at the point, the flips between them (the batch noise floor),
correct-answer goodput, and the gates.

Usage: .venv/bin/python scripts/bench_load_quality.py [--recipe recipes/demo-gptq-w4a16.yaml]
           [--points short/c8] [--items auto] [--out /tmp/bench-load-quality]
Prints a table and writes bench_load_quality.json in --out. Say the CPU kind (lscpu) with it.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def cpu_kind() -> str:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    kinds = [k for k in ("amx_tile", "avx512_bf16", "avx512f", "avx2") if k in flags]
    name = next((line.split(":", 1)[1].strip() for line in flags.splitlines() if line.startswith("model name")),
                platform.processor())
    return f"{name} ({', '.join(kinds) or 'no AVX2'})"


def extended(recipe: Path, points: list[str] | None, items: str, out: Path) -> Path:
    section: dict = {"items": int(items) if items.isdigit() else items}
    if points:
        section["points"] = points
    data = {"extends": str(recipe.resolve()), "name": f"{yaml.safe_load(recipe.read_text())['name']}-lq",
            "load_quality": section}
    path = out / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def summarize(record: dict, wall: float) -> dict:
    stages = record["stages"]
    seconds = {name: round(s.get("duration_s") or 0, 1) for name, s in stages.items()}
    lq = stages.get("load_quality", {}).get("result") or {}
    rows = []
    for p in lq.get("points", []):
        for role, r in p["roles"].items():
            good = r["load"].get("goodput") or {}
            rows.append({"point": p["name"], "role": role, "accuracy_c1": r["c1"]["accuracy"] if r["c1"] else None,
                         "accuracy_load": r["load"]["accuracy"], "flips": r["flips"],
                         "correct_per_s": good.get("rate"), "seconds_c1": r["c1"].get("seconds") if r["c1"] else None,
                         "seconds_load": r["load"].get("seconds")})
    return {"cpu": cpu_kind(), "wall_s": round(wall, 1), "stage_seconds": seconds, "items": lq.get("items"),
            "plan": lq.get("plan"), "rows": rows, "floor": lq.get("floor"),
            "gates": [(g["gate"], g["scope"], g["verdict"], g.get("estimate"), g.get("low")) for g in lq.get("gates", [])],
            "decision": (record.get("decision") or {}).get("decision"), "notes": lq.get("notes")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes" / "demo-gptq-w4a16.yaml")
    ap.add_argument("--points", nargs="*", default=None, help="load_quality.points (default: all)")
    ap.add_argument("--items", default="auto")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench-load-quality"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    recipe = extended(args.recipe, args.points, args.items, args.out)
    t0 = time.monotonic()
    with (args.out / "run.log").open("w") as log:
        rc = subprocess.run([sys.executable, "-m", "quantlab", "run", str(recipe), "--runs-dir",
                             str(args.out / "runs")], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            timeout=4 * 3600).returncode
    wall = time.monotonic() - t0
    records = sorted((args.out / "runs").glob("*/*/run.json"), key=lambda p: p.stat().st_mtime)
    if not records:
        print(f"no run record (exit {rc}); see {args.out / 'run.log'}")
        return 2
    out = summarize(json.loads(records[-1].read_text()), wall)
    out["exit"] = rc
    (args.out / "bench_load_quality.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
