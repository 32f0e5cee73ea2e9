#!/usr/bin/env python3
"""Wall time of `make demo` on a fresh clone (cold), then again in the same clone (warm).

Cold means: a new clone of this repository's HEAD, no virtual environments, no pip
cache (PIP_NO_CACHE_DIR=1), an empty quantlab cache folder (default model, vLLM compile
cache, quality baselines) and an empty torch inductor cache. Warm means the same clone
again: environments, default model, compile cache and cached baseline results in place.
Each `make demo` is split into set-up (`make setup`, timed on its own first) and the
run, and the run into its stages from the run record (run.json).

Usage: python3 scripts/bench_demo.py [--dir /tmp/quantlab-demo-bench] [--warm 1] [--reuse]
(--reuse: keep an existing clone and its caches, and time warm runs only)
Prints a table and writes bench_demo.json in --dir.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def newest_record(clone: Path, after: float) -> dict:
    records = [p for p in (clone / "runs").glob("*/*/run.json") if p.stat().st_mtime >= after]
    if not records:
        raise SystemExit(f"no run.json written under {clone / 'runs'}: see the make log")
    return json.loads(max(records, key=lambda p: p.stat().st_mtime).read_text())


def engine_seconds(record: dict) -> dict[str, float]:
    """Per stage, the seconds the record attributes to an engine at work: llm-compressor
    (model load, oneshot, save), vLLM start-ups, lm-eval evaluations, load points, probes.
    The rest of a stage (KL requests, warm-up requests, comparisons, plots, hashing,
    signing) is counted as quantlab's own, so the overhead below is an upper bound."""
    out: dict[str, float] = {}
    for name, rec in record["stages"].items():
        r = rec.get("result") or {}
        if name == "quantize":
            t = r.get("timings") or {}  # a reused checkpoint's timings are the earlier run's
            out[name] = 0.0 if r.get("reused_from_cache") else t.get("oneshot_and_save_s", 0) + t.get("load_model_s", 0)
        elif name == "serve":
            starts = [e.get("startup_s") or 0 for e in r.get("engines", {}).values()]
            # side by side, the servers start at the same time: their start-ups overlap
            out[name] = (max(starts, default=0) if r.get("side_by_side") else sum(starts))
        elif name == "quality":
            out[name] = sum((r.get("seconds") or {}).values())
        elif name == "performance":
            out[name] = sum(rep.get("wall_s") or 0 for p in r.get("points", [])
                            for rep in p.get("baseline_repeats", []) + p.get("candidate_repeats", []))
        elif name == "stability":
            out[name] = sum(v.get("seconds") or 0 for role, v in (r.get("roles") or {}).items()
                            if not (role == "baseline" and r.get("baseline_cached")))
        else:
            out[name] = 0.0
    return {k: round(v, 1) for k, v in out.items()}


def one_demo(label: str, clone: Path, env: dict[str, str], log: Path) -> dict:
    setup_s, rc = timed(["make", "setup"], clone, env, log)
    if rc != 0:
        raise SystemExit(f"{label}: make setup failed (exit {rc}); see {log}")
    started = time.time()
    demo_s, rc = timed(["make", "demo"], clone, env, log)
    if rc != 0:
        raise SystemExit(f"{label}: make demo failed (exit {rc}); see {log}")
    record = newest_record(clone, started)
    stages = {name: round(rec["duration_s"], 1) for name, rec in record["stages"].items()}
    engines = engine_seconds(record)
    own = demo_s - sum(engines.values())
    return {"label": label, "setup_s": round(setup_s, 1), "demo_after_setup_s": round(demo_s, 1),
            "total_s": round(setup_s + demo_s, 1), "stages_s": stages, "engine_s": engines,
            "outside_stages_s": round(demo_s - sum(stages.values()), 1),
            "quantlab_own_s": round(own, 1), "quantlab_own_share": round(own / demo_s, 3),
            "run_status": record["status"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/quantlab-demo-bench"))
    ap.add_argument("--warm", type=int, default=1, help="warm repeats after the cold run")
    ap.add_argument("--reuse", action="store_true", help="warm runs only, in the clone already in --dir "
                    "(updated to this repository's HEAD)")
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
    rows = [] if args.reuse else [one_demo("cold (fresh clone)", clone, env, log)]
    for i in range(args.warm):
        rows.append(one_demo(f"warm #{i + 1}", clone, env, log))
    out = {"commit": commit, "cpus": os.cpu_count(), "rows": rows}
    (args.dir / "bench_demo.json").write_text(json.dumps(out, indent=2))
    names = list(rows[0]["stages_s"])
    print(f"make demo at {commit}, {os.cpu_count()} CPUs")
    print(f"{'run':20} {'setup':>7} {'run':>7} {'total':>7}  " + " ".join(f"{n:>11}" for n in names)
          + "  outside  quantlab's own (upper bound)")
    for r in rows:
        print(f"{r['label']:20} {r['setup_s']:7.0f} {r['demo_after_setup_s']:7.0f} {r['total_s']:7.0f}  "
              + " ".join(f"{r['stages_s'].get(n, 0):11.1f}" for n in names) + f"  {r['outside_stages_s']:7.1f}"
              + f"  {r['quantlab_own_s']:.0f} s = {r['quantlab_own_share']:.1%}")
        print(f"{'  of which engines':20} {'':>7} {'':>7} {'':>7}  "
              + " ".join(f"{r['engine_s'].get(n, 0):11.1f}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
