"""Does the in-process sensitivity ranking agree with the served model's real regressions?

Ablations: for a few layer groups of a recipe's ranking (the top ones and the bottom
ones), a trial that quantizes everything but that one group (kept in the model's
dtype), plus the all-quantized trial; all of them are candidates of one comparison (one
baseline, served in groups as memory allows) judged by the recipe's quality section.
A group's served truth is, on a continuous served metric, how much keeping it alone
takes off the served next-token KL of the all-quantized trial (the quality stage's KL
against the baseline on held-out prose: every token counts, where a 40-item pass/fail
task moves by whole items); and, as before, how much it raises the tasks the
all-quantized trial loses (points). Its proxy is its sensitivity KL. Prints and writes
the rank agreement (Spearman with its 95% interval, Kendall) for both truths.

    .venv/bin/python scripts/bench_sensitivity_truth.py RECIPE SENSITIVITY_JSON --top 3 --bottom 3 --out F.json
    .venv/bin/python scripts/bench_sensitivity_truth.py RECIPE SENSITIVITY_JSON --spread 10 --out F.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantlab.pipeline.candidates.run import run_comparison  # noqa: E402
from quantlab.recipe.file import LoadedRecipe, load_recipe  # noqa: E402
from quantlab.search.ranking import rank_agreement  # noqa: E402


def keep_only(loaded: LoadedRecipe, row: dict | None, name: str) -> LoadedRecipe:
    """Every group quantized but `row`'s (None: all of them)."""
    if row is None:
        return loaded.variant(name)
    return loaded.variant(name, {"quantization.ignore": list(loaded.recipe.quantization.ignore) + row["modules"]})


def task_scores(run_json: Path) -> tuple[dict[str, float], dict[str, float], float | None]:
    """(the candidate's task scores, the baseline's, the served mean next-token KL)."""
    quality = json.loads(run_json.read_text())["stages"]["quality"]["result"]
    return ({t["task"]: t["candidate"] for t in quality["tasks"]}, {t["task"]: t["baseline"] for t in quality["tasks"]},
            (quality.get("kl") or {}).get("mean"))


def spread(ranking: list[dict], n: int) -> list[dict]:
    """n groups evenly across the ranking, its first and last among them."""
    if n >= len(ranking):
        return list(ranking)
    return [ranking[round(i * (len(ranking) - 1) / (n - 1))] for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("recipe", type=Path)
    ap.add_argument("sensitivity", type=Path)
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--bottom", type=int, default=3)
    ap.add_argument("--spread", type=int, default=None, help="N groups evenly across the ranking instead of "
                    "--top/--bottom")
    ap.add_argument("--runs-dir", type=Path, default=Path("runs/bench-sensitivity-truth"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    loaded = load_recipe(args.recipe)
    ranking = json.loads(args.sensitivity.read_text())["groups"]
    chosen = spread(ranking, args.spread) if args.spread else \
        ranking[:args.top] + (ranking[-args.bottom:] if args.bottom else [])
    short = {row["group"]: row["group"].rsplit(".", 1)[-1] for row in chosen}
    trials = [keep_only(loaded, None, f"{loaded.recipe.name}-all")] + \
        [keep_only(loaded, row, f"{loaded.recipe.name}-keep-{short[row['group']]}") for row in chosen]
    t0 = time.perf_counter()
    comparison = run_comparison(trials, args.runs_dir, progress=print)
    wall = time.perf_counter() - t0
    runs = comparison.data["runs"]
    scores, kls = {}, {}
    baseline = None
    for name, rel in runs.items():
        if not (comparison.folder / rel / "run.json").is_file():
            continue
        try:
            cand, base, kl = task_scores(comparison.folder / rel / "run.json")
        except (KeyError, TypeError):  # a trial that did not reach its quality stage
            continue
        scores[name], kls[name] = cand, kl
        baseline = baseline or base
    everything = scores[f"{loaded.recipe.name}-all"]
    lost = [t for t in everything if everything[t] < baseline[t]]  # the slices quantization loses
    truth, proxy, kl_truth = {}, {}, {}
    for row in chosen:
        name = f"{loaded.recipe.name}-keep-{short[row['group']]}"
        if name in scores:
            truth[row["group"]] = sum(scores[name][t] - everything[t] for t in lost) / max(1, len(lost))
            proxy[row["group"]] = row["mean_kl"]
            if kls.get(name) is not None and kls.get(f"{loaded.recipe.name}-all") is not None:
                kl_truth[row["group"]] = kls[f"{loaded.recipe.name}-all"] - kls[name]  # the served KL taken off
    agreement = rank_agreement(proxy, truth)
    kl_agreement = rank_agreement(proxy, kl_truth)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if "Model name" in line), "?")
    out = {"recipe": str(args.recipe), "cpu": model_name, "platform": platform.platform(), "wall_s": round(wall, 1),
           "baseline": baseline, "all_quantized": everything, "lost_tasks": lost,
           "served_kl_all": kls.get(f"{loaded.recipe.name}-all"),
           "trials": {g: {"kl": proxy[g], "gain_points": truth[g], "served_kl_taken_off": kl_truth.get(g),
                          "scores": scores.get(f"{loaded.recipe.name}-keep-{short[g]}")} for g in truth},
           "agreement": agreement, "agreement_served_kl": kl_agreement, "comparison": str(comparison.folder)}
    print(json.dumps({k: out[k] for k in ("lost_tasks", "agreement", "agreement_served_kl", "wall_s")}, indent=1))
    for g in truth:
        taken = kl_truth.get(g)
        print(f"{g:<20} KL {proxy[g]:.4f}  served KL taken off {'-' if taken is None else format(taken, '.4f')}  "
              f"gain on lost tasks {truth[g] * 100:+.1f} points")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
