#!/usr/bin/env python3
"""Wall time of `make demo` on a fresh clone (cold), then again in the same clone (warm).

Cold means: a new clone of this repository's HEAD, no virtual environments, no pip
cache (PIP_NO_CACHE_DIR=1), an empty quantlab cache folder (default model, vLLM compile
cache, quality baselines) and an empty torch inductor cache. Warm means the same clone
again: environments, default model, compile cache and cached baseline results in place.
Each `make demo` is split into set-up (`make setup`, timed on its own first) and the
run, and the run into its stages from the run record (run.json).

Usage: python3 scripts/bench_demo.py [--dir /tmp/quantlab-demo-bench] [--warm 1] [--reuse [--cold-caches]]
                                     [--second recipes/awq-w4a16.yaml]
(--reuse: keep an existing clone (brought to this repository's HEAD) and its caches, and
time warm runs only; with --cold-caches, first one run with its caches emptied and its
environments kept; --second: then a first validation with no cached baseline results and
a second candidate against them)
Prints a table and writes bench_demo.json in --dir.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[float, int]:
    t0 = time.monotonic()
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    return time.monotonic() - t0, rc


def records_since(clone: Path, after: float) -> list[dict]:
    """Every run record written since `after`, oldest first: `make demo` writes two when it
    calibrates the host first (the calibration is an A/A run of its own), one otherwise."""
    records = sorted((p for p in (clone / "runs").glob("*/*/run.json") if p.stat().st_mtime >= after),
                     key=lambda p: p.stat().st_mtime)
    if not records:
        raise SystemExit(f"no run.json written under {clone / 'runs'}: see the make log")
    return [json.loads(p.read_text()) for p in records]


def newest_record(clone: Path, after: float) -> dict:
    return records_since(clone, after)[-1]


def attempt_engine_s(record: dict) -> float:
    return (record.get("attempt") or {}).get("engine_s") or sum(engine_seconds(record).values())


def engine_seconds(record: dict) -> dict[str, float]:
    """Per stage, the seconds the record says an engine was at work (llm-compressor, a vLLM
    server starting, answering or stopping, lm-eval), as measured by the run itself."""
    return {name: round(rec.get("engine_s") or 0.0, 1) for name, rec in record["stages"].items()}


VALIDATION_STAGES = ("serve", "quality", "performance", "stability", "targets", "release")


def validation_seconds(record: dict) -> float:
    return round(sum(rec["duration_s"] for name, rec in record["stages"].items() if name in VALIDATION_STAGES), 1)


def one_demo(label: str, clone: Path, env: dict[str, str], log: Path) -> dict:
    setup_s, rc = timed(["make", "setup"], clone, env, log)
    if rc != 0:
        raise SystemExit(f"{label}: make setup failed (exit {rc}); see {log}")
    started = time.time()
    demo_s, rc = timed(["make", "demo"], clone, env, log)
    if rc != 0:
        raise SystemExit(f"{label}: make demo failed (exit {rc}); see {log}")
    *earlier, record = records_since(clone, started)
    return row(label, record, setup_s, demo_s, earlier=earlier)


def row(label: str, record: dict, setup_s: float, wall_s: float, *, earlier: list[dict] = ()) -> dict:
    """One timed command: its stages from the (last) run's record, and quantlab's own time,
    which is the command's wall time less the engines' time every run it made recorded (so it
    also holds the command's start, the recipes check of `make demo`, building the default
    model, preflights and reports). `earlier`: runs the command made before the last (the
    host calibration), shown as one column "calibrate"."""
    stages = {name: round(rec["duration_s"], 1) for name, rec in record["stages"].items()}
    engines = engine_seconds(record)
    if earlier:
        stages = {"calibrate": round(sum((r.get("attempt") or {}).get("wall_s") or 0.0 for r in earlier), 1), **stages}
        engines = {"calibrate": round(sum(attempt_engine_s(r) for r in earlier), 1), **engines}
    engine_total = attempt_engine_s(record) + sum(attempt_engine_s(r) for r in earlier)
    own = wall_s - engine_total
    return {"label": label, "recipe": record.get("recipe_name"), "setup_s": round(setup_s, 1), "demo_after_setup_s": round(wall_s, 1),
            "total_s": round(setup_s + wall_s, 1), "stages_s": stages, "engine_s": engines,
            "validation_s": validation_seconds(record),
            "outside_stages_s": round(wall_s - sum(stages.values()), 1),
            "quantlab_own_s": round(own, 1), "quantlab_own_share": round(own / wall_s, 3),
            "run_status": record["status"]}


def second_candidate(clone: Path, env: dict[str, str], log: Path, first_recipe: str, second_recipe: str
                     ) -> list[dict]:
    """A first validation against an empty result cache, then a second candidate against
    the baseline results the first one cached; compile cache, environments and checkpoints
    warm for both, so the difference is the baseline reuse alone."""
    cache = Path(env["QUANTLAB_CACHE_DIR"])
    for kind in ("quality-baselines", "stability-baselines"):
        shutil.rmtree(cache / kind, ignore_errors=True)
    rows = []
    for label, recipe in (("first", first_recipe), ("second", second_recipe)):
        started = time.time()
        wall, rc = timed([".venv/bin/quantlab", "run", recipe], clone, env, log)
        if rc not in (0, 1):  # 1: blocked by a gate, a finished run
            raise SystemExit(f"{label}: quantlab run {recipe} failed (exit {rc}); see {log}")
        rows.append(row(f"{label}: {Path(recipe).stem}", newest_record(clone, started), 0.0, wall))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/quantlab-demo-bench"))
    ap.add_argument("--warm", type=int, default=1, help="warm repeats after the cold run")
    ap.add_argument("--reuse", action="store_true", help="warm runs only, in the clone already in --dir "
                    "(updated to this repository's HEAD)")
    ap.add_argument("--cold-caches", action="store_true", help="with --reuse: first a run with empty caches "
                    "(default model, compile cache, baseline results) and the environments kept")
    ap.add_argument("--second", metavar="RECIPE", help="after the demo runs: validate the demo recipe against "
                    "an empty result cache, then this recipe against the cached baseline (e.g. recipes/awq-w4a16.yaml)")
    args = ap.parse_args()
    clone = args.dir / "clone"
    if args.reuse:
        subprocess.run(["git", "pull", "-q", str(REPO), "HEAD"], cwd=clone, check=True)
    else:
        if args.dir.exists():
            shutil.rmtree(args.dir)
        args.dir.mkdir(parents=True)
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True,
                            text=True, check=True).stdout.strip()
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1", "QUANTLAB_CACHE_DIR": str(args.dir / "cache"),
           "TORCHINDUCTOR_CACHE_DIR": str(args.dir / "inductor")}
    log = args.dir / "make.log"
    if args.reuse and args.cold_caches:
        for folder in ("cache", "inductor"):
            shutil.rmtree(args.dir / folder, ignore_errors=True)
        rows = [one_demo("cold caches, venvs", clone, env, log)]
    else:
        rows = [] if args.reuse else [one_demo("cold (fresh clone)", clone, env, log)]
    for i in range(args.warm):
        rows.append(one_demo(f"warm #{i + 1}", clone, env, log))
    warm = [r["demo_after_setup_s"] + r["setup_s"] for r in rows if r["label"].startswith("warm")]
    if args.second:
        rows += second_candidate(clone, env, log, "recipes/gptq-w4a16.yaml", args.second)
    out = {"commit": commit, "cpus": os.cpu_count(), "emulated_cpu": os.environ.get("QUANTLAB_EMULATE_CPU"), "rows": rows,
           "warm_median_s": statistics.median(warm) if warm else None}
    (args.dir / "bench_demo.json").write_text(json.dumps(out, indent=2))
    names = list(dict.fromkeys(n for r in rows for n in r["stages_s"]))
    emulated = os.environ.get("QUANTLAB_EMULATE_CPU")
    print(f"make demo at {commit}, {os.cpu_count()} CPUs" + (f", emulating an {emulated} host" if emulated else "")
          + f"; recipe {', '.join(dict.fromkeys(str(r['recipe']) for r in rows))}")
    print(f"{'run':20} {'setup':>7} {'run':>7} {'total':>7}  " + " ".join(f"{n:>11}" for n in names)
          + "  outside  quantlab's own (wall less engines)")
    for r in rows:
        print(f"{r['label'][:20]:20} {r['setup_s']:7.0f} {r['demo_after_setup_s']:7.0f} {r['total_s']:7.0f}  "
              + " ".join(f"{r['stages_s'].get(n, 0):11.1f}" for n in names) + f"  {r['outside_stages_s']:7.1f}"
              + f"  {r['quantlab_own_s']:.0f} s = {r['quantlab_own_share']:.1%}")
        print(f"{'  of which engines':20} {'':>7} {'':>7} {'':>7}  "
              + " ".join(f"{r['engine_s'].get(n, 0):11.1f}" for n in names))
    if warm:
        print(f"warm make demo, median of {len(warm)}: {out['warm_median_s']:.0f} s")
    if args.second:
        first, second = rows[-2], rows[-1]
        print(f"validation stages ({', '.join(VALIDATION_STAGES)}): first {first['validation_s']:.0f} s, second "
              f"candidate {second['validation_s']:.0f} s = {second['validation_s'] / first['validation_s']:.2f}; "
              f"whole runs {first['demo_after_setup_s']:.0f} s and {second['demo_after_setup_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
