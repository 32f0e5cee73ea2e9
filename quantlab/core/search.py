"""`quantlab search RECIPE`: from a blocked recipe, the fewest of its most sensitive
layers to keep unquantized so that every required gate passes.

The ranking comes from `quantlab sensitivity` (computed here, or read from its JSON).
Each round is one comparison (`core/compare.run_comparison`) of the round's trials, each
trial the recipe with the k most sensitive groups' modules added to
`quantization.ignore`: one baseline for the round, every trial judged by the recipe's own
gates, quantized checkpoints and the baseline's results reused from the cache.
`sensitivity/search.SearchState` picks the next k values (bisection, `width` at a
time) and the winner. The written recipe is the original plus the ignore list; the
winning trial's checkpoint is released (signed) by its comparison like any candidate.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from quantlab.core.compare import run_comparison
from quantlab.core.context import Progress
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import write_json_atomic, write_text_atomic
from quantlab.core.pipeline import dry_run, sensitivity_only
from quantlab.core.recipe import LoadedRecipe, Recipe
from quantlab.core.run import new_run_folder
from quantlab.sensitivity.search import SearchState, ignore_for, rebased, trial_name
from quantlab.sensitivity.spec import SensitivitySpec

SEARCH_DIR = "search"  # under the runs root: search/<recipe>/<id>/


def run_search(loaded: LoadedRecipe, runs_root: Path, *, sensitivity: Path | None = None, max_layers: int | None = None,
               width: int = 2, max_trials: int = 8, time_budget_s: float | None = None,
               progress: Progress = print, verbose: bool = False) -> dict[str, Any]:
    """The search; returns its result (also written as search.json beside search.md and
    the chosen recipe file)."""
    t0 = time.perf_counter()
    recipe = loaded.recipe
    if recipe.quantization.method == "raw":
        raise RecipeError("a search edits quantization.ignore, and a raw llm-compressor recipe has none quantlab "
                          "can edit: write the method's section instead", file=str(loaded.path),
                          field="quantization.method")
    estimate = _trial_estimate(loaded, runs_root, progress)
    if time_budget_s is not None and estimate is not None and time_budget_s < estimate:
        raise RecipeError(f"--time-budget-s {time_budget_s:.0f} is less than one trial takes (~{estimate:.0f} s, "
                          f"from the last run of '{recipe.name}'): give at least {estimate:.0f} s",
                          field="--time-budget-s")
    ranking_file = sensitivity or (sensitivity_only(loaded, runs_root, SensitivitySpec(), progress=progress)
                                   / "sensitivity.json")
    ranking = _ranking(ranking_file, loaded)
    limit = min(max_layers if max_layers is not None else max(1, len(ranking) // 4), len(ranking))
    if limit < 1:
        raise RecipeError("--max-layers must be at least 1: the search keeps layers out of quantization",
                          field="--max-layers")
    folder = new_run_folder(Path(runs_root) / SEARCH_DIR / recipe.name, loaded.content_hash)
    progress(f"search: keep up to {limit} of {len(ranking)} groups unquantized, {width} trials a round, "
             f"at most {max_trials} trials (ranking {ranking_file})")
    state = SearchState(max_layers=limit, width=width)
    stopped, rounds = "found", []
    while True:
        todo = state.next_points()
        if not todo:
            stopped = "found" if state.hi is not None else "none passed"
            break
        if len(state.trials) + len(todo) > max_trials:
            todo = todo[:max_trials - len(state.trials)]
            if not todo:
                stopped = "trial budget"
                break
        last = rounds[-1]["wall_s"] if rounds else estimate
        if time_budget_s is not None and last is not None and time.perf_counter() - t0 + last > time_budget_s:
            stopped = "time budget"
            break
        rounds.append(_round(loaded, todo, ranking, folder, state, progress, verbose))
    note = state.monotonic_note()
    if note:
        state.notes.append(note)
        progress(f"search: {note}")
    best = state.best()
    result = {"recipe": recipe.name, "recipe_path": str(loaded.path), "ranking": str(ranking_file),
              "granularity": json.loads(Path(ranking_file).read_text())["spec"]["granularity"],
              "max_layers": limit, "width": width, "stopped": stopped, "rounds": rounds,
              "trials": [{"k": k, **state.trials[k]} for k in sorted(state.trials)], "best": best,
              "passed": state.hi is not None, "notes": state.notes, "wall_s": round(time.perf_counter() - t0, 1)}
    if best is not None:
        result["recipe_file"] = str(_write_recipe(loaded, ranking, best, folder))
        result["kept"] = [row["group"] for row in ranking[:best]]
    write_json_atomic(folder / "search.json", result)
    write_text_atomic(folder / "search.md", markdown(result))
    _plot(result, folder, progress)
    result["folder"] = str(folder)
    return result


def _trial_estimate(loaded: LoadedRecipe, runs_root: Path, progress: Progress) -> float | None:
    """Seconds one trial takes, from the newest earlier run of this recipe (None: unknown);
    the dry run also runs every preflight, so a recipe that cannot run is refused here."""
    plan = dry_run(loaded, runs_root, progress=progress)
    steps = [s["estimate_s"] for s in plan if s["stage"] != "release"]
    return sum(steps) if steps and all(x is not None for x in steps) else None


def _ranking(file: Path, loaded: LoadedRecipe) -> list[dict[str, Any]]:
    try:
        data = json.loads(Path(file).read_text())
        rows = data["groups"]
    except (OSError, ValueError, KeyError) as err:
        raise RecipeError(f"--sensitivity {file}: not a sensitivity.json ({err}); run `quantlab sensitivity "
                          f"{loaded.path}`", field="--sensitivity") from None
    if not rows or not all(r.get("modules") for r in rows):
        raise RecipeError(f"--sensitivity {file}: the ranking names no layer to keep; nothing to search over",
                          field="--sensitivity")
    if data.get("recipe_sha256") not in (None, loaded.content_hash) and data.get("recipe") != loaded.recipe.name:
        raise RecipeError(f"--sensitivity {file} ranks recipe '{data.get('recipe')}', not '{loaded.recipe.name}'",
                          field="--sensitivity")
    return rows


def trial_recipe(loaded: LoadedRecipe, ranking: list[dict[str, Any]], k: int) -> LoadedRecipe:
    """Trial k in memory: the recipe's own folder, so its relative paths hold."""
    data = loaded.recipe.model_dump(mode="json")
    data["name"] = trial_name(loaded.recipe.name, k)
    data["quantization"]["ignore"] = ignore_for(loaded.recipe.quantization.ignore, ranking, k)
    return LoadedRecipe(recipe=Recipe.model_validate(data), path=loaded.path)


def _round(loaded: LoadedRecipe, ks: list[int], ranking: list[dict[str, Any]], folder: Path, state: SearchState,
           progress: Progress, verbose: bool) -> dict[str, Any]:
    """One comparison of the round's trials (a lone trial is a comparison of one: the same
    path, its own baseline); each trial's outcome recorded in the state."""
    t0 = time.perf_counter()
    trials = [trial_recipe(loaded, ranking, k) for k in ks]
    progress(f"search: trials keeping {', '.join(map(str, ks))} of the most sensitive layer groups unquantized")
    comparison = run_comparison(trials, folder / "rounds", progress=progress, verbose=verbose, allow_single=True)
    rows = {row["name"]: row for row in json.loads((comparison.folder / "comparison.json").read_text())["candidates"]}
    refused = json.loads((comparison.folder / "comparison.json").read_text()).get("refused") or {}
    for k, trial in zip(ks, trials):
        name = trial.recipe.name
        row = rows.get(name) or {}
        state.record(k, {"name": name, "decision": row.get("decision", "refused" if name in refused else "failed"),
                         "failed_gates": row.get("failed_gates") or ([refused[name]] if name in refused else []),
                         "not_shown_gates": row.get("not_shown_gates") or [],
                         "worst_recovery": row.get("worst_recovery"), "worst_recovery_at": row.get("worst_recovery_at"),
                         "weights_bytes": _weights_bytes(comparison.folder, name),
                         "output_tokens_per_s": row.get("output_tokens_per_s"),
                         "run": str(comparison.folder / "candidates" / name)})
    return {"ks": ks, "comparison": str(comparison.folder), "wall_s": round(time.perf_counter() - t0, 1)}


def _weights_bytes(folder: Path, name: str) -> int | None:
    files = list((folder / "candidates" / name).glob("*/checkpoint/*.safetensors"))
    return sum(f.stat().st_size for f in files) if files else None


def _write_recipe(loaded: LoadedRecipe, ranking: list[dict[str, Any]], k: int, folder: Path) -> Path:
    """The original recipe file plus the ignore list, its paths rebased to its new folder."""
    data = yaml.safe_load(loaded.path.read_text())
    data["name"] = trial_name(loaded.recipe.name, k)
    data.setdefault("quantization", {})["ignore"] = ignore_for(loaded.recipe.quantization.ignore, ranking, k)
    data = rebased(data, loaded.base_dir, folder)
    kept = ", ".join(row["group"] for row in ranking[:k]) or "none"
    header = (f"# {loaded.path.name} with its {k} most sensitive layer group(s) left unquantized ({kept}),\n"
              f"# found by `quantlab search`; paths are relative to this file.\n")
    out = folder / f"{data['name']}.yaml"
    write_text_atomic(out, header + yaml.safe_dump(data, sort_keys=False))
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Search: {result['recipe']}", "",
             f"Kept layer groups unquantized, most sensitive first ({result['granularity']} ranking "
             f"{result['ranking']}); up to {result['max_layers']}, {result['width']} trials a round. "
             f"Stopped: {result['stopped']}, after {len(result['trials'])} trials in {len(result['rounds'])} rounds, "
             f"{result['wall_s']:.0f} s.", "",
             "| kept | decision | failed gates | worst recovery | weights MB | out tok/s |",
             "|---|---|---|---|---|---|"]
    for t in result["trials"]:
        mark = " (chosen)" if t["k"] == result["best"] and result["passed"] else ""
        failed = ", ".join(t["failed_gates"][:4]) + (f" (+{len(t['failed_gates']) - 4})" if len(t["failed_gates"]) > 4
                                                      else "")
        lines.append(f"| {t['k']}{mark} | {t['decision']} | {failed or '-'} | "
                     f"{'-' if t['worst_recovery'] is None else format(t['worst_recovery'], '.3g')} | "
                     f"{'-' if t['weights_bytes'] is None else format(t['weights_bytes'] / 1e6, '.1f')} | "
                     f"{'-' if t['output_tokens_per_s'] is None else format(t['output_tokens_per_s'], '.3g')} |")
    lines.append("")
    if result["passed"]:
        lines.append(f"Chosen: keep {result['best']} ({', '.join(result['kept']) or 'none'}); recipe: "
                     f"{result['recipe_file']}")
    elif result["best"] is not None:
        t = next(t for t in result["trials"] if t["k"] == result["best"])
        lines.append(f"No trial passed. Closest: keep {result['best']}, stopped by {', '.join(t['failed_gates'])}")
    lines += [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def _plot(result: dict[str, Any], folder: Path, progress: Progress) -> None:
    from quantlab.release.plots import search_trials

    try:
        search_trials(result["trials"], folder / "search.png", result["recipe"])
    except (ImportError, OSError, ValueError) as err:
        progress(f"the search plot could not be drawn: {type(err).__name__}: {err}")
