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

Knobs (`--knob quantization.group_size=128,64,32`, ordered choices) come first, one
round each: the first choice in the user's order that passes ends the search with no
layer kept; when none passes, the closest (fewest failed gates) is kept and the next
knob tried on top of it, and the layer search starts from the last of them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from quantlab.core.layout import SEARCH_DIR  # noqa: F401 (also read from here)
from quantlab.pipeline.candidates.run import run_comparison
from quantlab.core.progress import Progress
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import write_json_atomic, write_text_atomic
from quantlab.search.sensitivity import run_sensitivity
from quantlab.pipeline.commands import dry_run
from quantlab.core.fsutil import safetensors_bytes
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe, read_recipe_data, rebased, set_field
from quantlab.core.run import new_run_folder
from quantlab.search.state import SearchState, ignore_for, knob_pick, parse_knob, trial_name
from quantlab.recipe.sensitivity import SensitivitySpec



def run_search(loaded: LoadedRecipe, runs_root: Path, *, sensitivity: Path | None = None,
               max_layers: int | None = None,
               width: int = 2, max_trials: int = 8, time_budget_s: float | None = None,
               knobs: tuple[str, ...] = (), progress: Progress = print, verbose: bool = False,
               ray_storage: Path | None = None, ray_cpus: int = 1) -> dict[str, Any]:
    """The search; returns its result (also written as search.json beside search.md and
    the chosen recipe file). `ray_storage`: connected to a Ray cluster (ray_cluster.connect),
    each round's trials run as Ray tasks, their run folders in that storage folder."""
    t0 = time.perf_counter()
    recipe = loaded.recipe
    if recipe.quantization.method == "raw":
        raise RecipeError("a search edits quantization.ignore, and a raw llm-compressor recipe has none quantlab "
                          "can edit: write the method's section instead", file=str(loaded.path),
                          field="quantization.method")
    knob_choices = [checked_knob(loaded, k) for k in knobs]  # every choice valid before any work
    estimate = _trial_estimate(loaded, runs_root, progress)
    if time_budget_s is not None and estimate is not None and time_budget_s < estimate:
        raise RecipeError(f"--time-budget-s {time_budget_s:.0f} is less than one trial takes (~{estimate:.0f} s, "
                          f"from the last run of '{recipe.name}'): give at least {estimate:.0f} s",
                          field="--time-budget-s")
    ranking_file = sensitivity or (run_sensitivity(loaded, runs_root, SensitivitySpec(), progress=progress)[0]
                                   / "sensitivity.json")
    ranked = _ranking(ranking_file, loaded)
    ranking = ranked["groups"]
    limit = min(max_layers if max_layers is not None else max(1, len(ranking) // 4), len(ranking))
    if limit < 1:
        raise RecipeError("--max-layers must be at least 1: the search keeps layers out of quantization",
                          field="--max-layers")
    folder = new_run_folder(Path(runs_root) / SEARCH_DIR / recipe.name, loaded.content_hash)
    progress(f"search: keep up to {limit} of {len(ranking)} groups unquantized, {width} trials a round, "
             f"at most {max_trials} trials (ranking {ranking_file})")
    state = SearchState(max_layers=limit, width=width)
    # every trial the search may try is one family, fixed before the first (recipe/family.py)
    family = Family(size=max_trials, kind="search", id=folder.name)
    stopped, rounds, knob_trials, settings = "found", [], [], {}
    for n, (field, choices) in enumerate(knob_choices, 1):
        if len(knob_trials) + len(choices) > max_trials:
            stopped = "trial budget"
            break
        if _past_budget(rounds, estimate, t0, time_budget_s):
            stopped = "time budget"
            break
        trials = [loaded.variant(trial_name(f"{recipe.name}-k{n}c{i}", 0), {**settings, field: v})
                  for i, v in enumerate(choices, 1)]
        progress(f"search: knob {field}, choices {choices} in this order")
        outcomes, info = _compare(trials, folder, progress, verbose, (ray_storage, ray_cpus), family)
        rounds.append({**info, "knob": field, "choices": choices})
        knob_trials += [{"knob": field, "value": v, "settings": {**settings, field: v}, **o}
                        for v, o in zip(choices, outcomes)]
        passed, closest = knob_pick(outcomes)
        settings[field] = choices[passed if passed is not None else closest]
        if passed is not None:
            break
    knob_passed = any(t["decision"] == "release" and t["settings"] == settings for t in knob_trials)
    base = loaded.variant(recipe.name, settings) if settings else loaded
    while not knob_passed and stopped == "found":
        todo = state.next_points()
        if not todo:
            stopped = "found" if state.hi is not None else "none passed"
            break
        if len(knob_trials) + len(state.trials) + len(todo) > max_trials:
            todo = todo[:max(0, max_trials - len(knob_trials) - len(state.trials))]
            if not todo:
                stopped = "trial budget"
                break
        if _past_budget(rounds, estimate, t0, time_budget_s):
            stopped = "time budget"
            break
        rounds.append(_round(base, todo, ranking, folder, state, progress, verbose, (ray_storage, ray_cpus),
                             family))
    note = state.monotonic_note()
    if note:
        state.notes.append(note)
        progress(f"search: {note}")
    best = None if knob_passed else state.best()
    passed = knob_passed or state.hi is not None
    if knob_passed:
        stopped = "found by a knob"
    result = {"recipe": recipe.name, "recipe_path": str(loaded.path), "ranking": str(ranking_file),
              "granularity": ranked["spec"]["granularity"],
              "max_layers": limit, "width": width, "stopped": stopped, "rounds": rounds,
              "trials": [{"k": k, **state.trials[k]} for k in sorted(state.trials)], "best": best,
              "knob_trials": knob_trials, "settings": settings,
              "passed": passed, "notes": state.notes, "wall_s": round(time.perf_counter() - t0, 1)}
    if best is not None or knob_passed:
        result["recipe_file"] = str(_write_recipe(loaded, ranking, best or 0, folder, settings))
        result["kept"] = [row["group"] for row in ranking[:best or 0]]
    write_json_atomic(folder / "search.json", result)
    write_text_atomic(folder / "search.md", markdown(result))
    _plot(result, folder, progress)
    result["folder"] = str(folder)
    return result


def _past_budget(rounds: list[dict[str, Any]], estimate: float | None, t0: float, budget: float | None) -> bool:
    """Would the next round end past the budget, judged by the previous round's time?"""
    last = rounds[-1]["wall_s"] if rounds else estimate
    return budget is not None and last is not None and time.perf_counter() - t0 + last > budget


def checked_knob(loaded: LoadedRecipe, text: str) -> tuple[str, list[Any]]:
    """A --knob, parsed, with every choice checked against the recipe's schema."""
    try:
        field, choices = parse_knob(text)
    except ValueError as err:
        raise RecipeError(str(err), field="--knob") from None
    for value in choices:
        try:
            loaded.variant(loaded.recipe.name, {field: value})
        except ValueError as err:  # pydantic's ValidationError among them: say what it found, not its title
            errors = getattr(err, "errors", None)
            why = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors()) if errors else str(err)
            raise RecipeError(f"--knob {field}={value!r} does not make a valid recipe: {why}", field="--knob",
                              file=str(loaded.path)) from None
    return field, choices


def _trial_estimate(loaded: LoadedRecipe, runs_root: Path, progress: Progress) -> float | None:
    """Seconds one trial takes, from the newest earlier run of this recipe (None: unknown);
    the dry run also runs every preflight, so a recipe that cannot run is refused here."""
    plan = dry_run(loaded, runs_root, progress=progress)
    steps = [s["estimate_s"] for s in plan if s["stage"] != "release"]
    return sum(steps) if steps and all(x is not None for x in steps) else None


def _ranking(file: Path, loaded: LoadedRecipe) -> dict[str, Any]:
    """A sensitivity.json of this recipe, checked: its ranked groups name modules."""
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
    return data


def trial_recipe(loaded: LoadedRecipe, ranking: list[dict[str, Any]], k: int) -> LoadedRecipe:
    """Trial k in memory: the recipe's own folder, so its relative paths hold."""
    return loaded.variant(trial_name(loaded.recipe.name, k),
                          {"quantization.ignore": ignore_for(loaded.recipe.quantization.ignore, ranking, k)})


def _round(loaded: LoadedRecipe, ks: list[int], ranking: list[dict[str, Any]], folder: Path, state: SearchState,
           progress: Progress, verbose: bool, on_ray: tuple[Path | None, int], family: Family) -> dict[str, Any]:
    """One round of layer trials; each trial's outcome recorded in the state."""
    progress(f"search: trials keeping {', '.join(map(str, ks))} of the most sensitive layer groups unquantized")
    outcomes, info = _compare([trial_recipe(loaded, ranking, k) for k in ks], folder, progress, verbose,
                              on_ray, family)
    for k, outcome in zip(ks, outcomes):
        state.record(k, outcome)
    return {**info, "ks": ks}


def _compare(trials: list[LoadedRecipe], folder: Path, progress: Progress, verbose: bool,
             on_ray: tuple[Path | None, int] = (None, 1), family: Family | None = None
             ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One comparison of these trials (a lone trial is a comparison of one), here or as Ray
    tasks (`on_ray`: the storage folder, None here, and the CPUs a task asks for); each trial's
    decision, failed gates, worst recovery, weights and throughput, in order."""
    t0 = time.perf_counter()
    storage, cpus = on_ray
    if storage is not None:
        from quantlab.pipeline.ray_candidates import run_comparison_on_ray

        comparison = run_comparison_on_ray(trials, storage, progress=progress, verbose=verbose, cpus=cpus,
                                           family=family)
    else:
        comparison = run_comparison(trials, folder / "rounds", progress=progress, verbose=verbose,
                                    allow_single=True, family=family)
    rows = {row["name"]: row for row in comparison.data["candidates"]}
    refused = comparison.data.get("refused") or {}
    outcomes = []
    for trial in trials:
        name = trial.recipe.name
        row = rows.get(name) or {}
        outcomes.append({"name": name, "decision": row.get("decision", "refused" if name in refused else "failed"),
                         "failed_gates": row.get("failed_gates") or ([refused[name]] if name in refused else []),
                         "not_shown_gates": row.get("not_shown_gates") or [],
                         "worst_recovery": row.get("worst_recovery"), "worst_recovery_at": row.get("worst_recovery_at"),
                         "weights_bytes": _weights_bytes(comparison.folder, name),
                         "output_tokens_per_s": row.get("output_tokens_per_s"),
                         "run": str(comparison.folder / "candidates" / name)})
    return outcomes, {"comparison": str(comparison.folder), "wall_s": round(time.perf_counter() - t0, 1)}


def _weights_bytes(folder: Path, name: str) -> int | None:
    """A trial's checkpoint weights (None: it never got one)."""
    return safetensors_bytes(*folder.glob(f"candidates/{name}/*/checkpoint")) or None


def _write_recipe(loaded: LoadedRecipe, ranking: list[dict[str, Any]], k: int, folder: Path,
                  settings: dict[str, Any]) -> Path:
    """The original recipe file plus the knob settings and the ignore list, its paths
    rebased to its new folder."""
    data, _ = read_recipe_data(loaded.path)  # what it extends laid in: the written recipe stands alone
    for field, value in settings.items():
        data = set_field(data, field, value)
    data["name"] = trial_name(loaded.recipe.name, k)
    data.setdefault("quantization", {})["ignore"] = ignore_for(loaded.recipe.quantization.ignore, ranking, k)
    data = rebased(data, loaded.base_dir, folder)
    kept = ", ".join(row["group"] for row in ranking[:k]) or "none"
    knobs = "".join(f"# {field}: {value!r} (searched)\n" for field, value in settings.items())
    header = (knobs + f"# {loaded.path.name} with its {k} most sensitive layer group(s) left unquantized ({kept}),\n"
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
    if result.get("knob_trials"):
        lines += ["", "Knobs, each choice in the order given (the layer trials above start from the settings kept):",
                  "", "| knob | value | decision | failed gates | worst recovery |", "|---|---|---|---|---|"]
        for t in result["knob_trials"]:
            lines.append(f"| {t['knob']} | {t['value']!r} | {t['decision']} | "
                         f"{', '.join(t['failed_gates'][:4]) or '-'} | "
                         f"{'-' if t['worst_recovery'] is None else format(t['worst_recovery'], '.3g')} |")
    lines.append("")
    if result["passed"] and result["best"] is None:
        lines.append(f"Chosen: {result['settings']} with no layer kept; recipe: {result['recipe_file']}")
    elif result["passed"]:
        lines.append(f"Chosen: keep {result['best']} ({', '.join(result['kept']) or 'none'})"
                     + (f" with {result['settings']}" if result["settings"] else "")
                     + f"; recipe: {result['recipe_file']}")
    elif result["best"] is not None:
        t = next(t for t in result["trials"] if t["k"] == result["best"])
        lines.append(f"No trial passed. Closest: keep {result['best']}, stopped by {', '.join(t['failed_gates'])}")
    lines += [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def _plot(result: dict[str, Any], folder: Path, progress: Progress) -> None:
    from quantlab.reports.plots import search_trials

    try:
        search_trials(result["trials"], folder / "search.png", result["recipe"])
    except (ImportError, OSError, ValueError) as err:
        progress(f"the search plot could not be drawn: {type(err).__name__}: {err}")
