"""`quantlab search RECIPE`: from a blocked recipe, the fewest of its most sensitive
layers to keep unquantized so that every required gate passes.

The ranking comes from `quantlab sensitivity` (computed here, or read from its JSON).
Each round is one comparison of the round's trials, run by the search's executor
(search_rounds.compare_trials; pipeline/executor.py), each trial the recipe with the k
most sensitive groups' modules added to `quantization.ignore`: one baseline for the
round, every trial judged by the recipe's own gates, quantized checkpoints and the
baseline's results reused from the cache. `search/state.SearchState` picks the next k values (bisection, `width` at a
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
from quantlab.pipeline.candidates.servers import HeldBaseline
from quantlab.pipeline.executor import Executor
from quantlab.pipeline.scheme_search import refused_by_preflight, run_schemes, scheme_sources, scheme_trials
from quantlab.reports.search_report import markdown, plot
from quantlab.pipeline.search_rounds import compare_trials
from quantlab.core.progress import Progress
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import write_json_atomic, write_text_atomic
from quantlab.search.sensitivity import run_sensitivity
from quantlab.pipeline.commands import dry_run
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe, read_recipe_data, rebased, set_field
from quantlab.core.run import new_run_folder
from quantlab.search.state import SearchState, ignore_for, knob_pick, parse_knob, trial_name
from quantlab.recipe.sensitivity import SensitivitySpec



def run_search(loaded: LoadedRecipe, runs_root: Path, *, executor: Executor, sensitivity: Path | None = None,
               max_layers: int | None = None,
               width: int = 2, max_trials: int = 8, time_budget_s: float | None = None,
               knobs: tuple[str, ...] = (), schemes: tuple[str, ...] = (), progress: Progress = print,
               verbose: bool = False) -> dict[str, Any]:
    """The search; returns its result (also written as search.json beside search.md and
    the chosen recipe file). `schemes`: other methods and schemes tried first
    (pipeline/scheme_search.py). `executor` (pipeline/executor.py, entered already) runs
    each round's trials: here, one baseline server stays up across the rounds; on Ray,
    each round's trials are Ray tasks, their run folders in the storage folder."""
    t0 = time.perf_counter()
    recipe = loaded.recipe
    if recipe.quantization.method == "raw":
        raise RecipeError("a search edits quantization.ignore, and a raw llm-compressor recipe has none quantlab "
                          "can edit: write the method's section instead", file=str(loaded.path),
                          field="quantization.method")
    knob_choices = [checked_knob(loaded, k) for k in knobs]  # every choice valid before any work
    sources = scheme_sources(schemes)
    estimate = _trial_estimate(loaded, runs_root, progress)
    if time_budget_s is not None and estimate is not None and time_budget_s < estimate:
        raise RecipeError(f"--time-budget-s {time_budget_s:.0f} is less than one trial takes (~{estimate:.0f} s, "
                          f"from the last run of '{recipe.name}'): give at least {estimate:.0f} s",
                          field="--time-budget-s")
    folder = new_run_folder(Path(runs_root) / SEARCH_DIR / recipe.name, loaded.content_hash)
    held = executor.hold_baseline(at_least=1 + width)
    run = _Search(loaded, runs_root, folder, progress, verbose, executor, held,
                  lambda rounds: _past_budget(rounds, estimate, t0, time_budget_s), max_trials, width)
    try:
        result = run.schemes(sources)
        if result is None:
            result = run.layers(knob_choices, sensitivity, max_layers)
    finally:
        if held is not None:
            held.stop()
    result.update(recipe=recipe.name, recipe_path=str(loaded.path), width=width,
                  wall_s=round(time.perf_counter() - t0, 1))
    write_json_atomic(folder / "search.json", result)
    write_text_atomic(folder / "search.md", markdown(result))
    plot(result, folder, progress)
    result["folder"] = str(folder)
    return result


class _Search:
    """One search's phases: schemes (first, when asked), then knobs and layers."""

    def __init__(self, loaded, runs_root, folder, progress, verbose, executor, held, past_budget, max_trials, width):
        self.loaded, self.runs_root, self.folder, self.progress, self.verbose = loaded, runs_root, folder, progress, \
            verbose
        self.executor, self.held, self.past_budget, self.max_trials, self.width = executor, held, past_budget, \
            max_trials, width
        self.rounds: list[dict[str, Any]] = []
        self.scheme_trials: list[dict[str, Any]] = []
        self.refused: list[dict[str, Any]] = []
        self.kernel_bench: dict[str, Any] | None = None
        # every trial the search may try is one family, fixed before the first (recipe/family.py)
        self.family = Family(size=max_trials, kind="search", id=folder.name)

    def schemes(self, sources) -> dict[str, Any] | None:
        """The scheme trials, cheapest first; the result when one was released, else None."""
        if not sources:
            return None
        trials, self.refused, self.kernel_bench = scheme_trials(self.loaded, sources, self.runs_root, self.progress)
        order = tuple(t.name for t in trials)  # registered with every trial (its family's members)
        self.family = Family(size=self.max_trials, kind="search", id=self.folder.name, members=order)
        by = self.kernel_bench.get("ordered_by", "bytes")
        self.progress(f"search: {len(trials)} scheme trial(s) in this order, cheapest first by predicted {by} "
                      f"(selection.rule {self.kernel_bench.get('rule')}): {', '.join(order)}"
                      + (f"; {len(self.refused)} refused by the preflight (no trial used)" if self.refused else ""))
        outcomes, rounds, chosen = run_schemes(trials, self.folder, width=self.width, budget_left=self.max_trials,
                                               progress=self.progress, verbose=self.verbose, executor=self.executor,
                                               family=self.family, held=self.held, past_budget=self.past_budget)
        self.scheme_trials, self.rounds = outcomes, rounds
        if chosen is None:
            return None
        trial = next(t for t in trials if t.name == chosen)
        settings = trial.settings
        return {"stopped": "found by a scheme", "passed": True, "settings": settings, "best": None, "trials": [],
                "knob_trials": [], "notes": [], "rounds": self.rounds, "ranking": None, "granularity": None,
                "max_layers": 0, **self._scheme_fields(), "chosen_scheme": trial.source,
                "recipe_file": str(_write_recipe(self.loaded, [], 0, self.folder, settings, scheme=trial.source))}

    def _scheme_fields(self) -> dict[str, Any]:
        return {"scheme_trials": self.scheme_trials, "scheme_refused": self.refused,
                "trial_order": list(self.family.members), "kernel_bench": self.kernel_bench}

    def used(self) -> int:
        return len(self.scheme_trials)

    def layers(self, knob_choices, sensitivity, max_layers) -> dict[str, Any]:
        """Knobs, then the fewest most sensitive layer groups kept unquantized."""
        loaded, folder, progress, recipe = self.loaded, self.folder, self.progress, self.loaded.recipe
        if self.rounds and self.past_budget(self.rounds):  # the schemes spent it: no ranking to compute
            progress("search: the time budget is spent before the layer phase; no sensitivity ranking computed")
            return {"ranking": None, "granularity": None, "max_layers": 0, "stopped": "time budget",
                    "rounds": self.rounds, "trials": [], "best": None, "knob_trials": [], "settings": {},
                    "passed": False, "notes": [], **self._scheme_fields()}
        ranking_file, ranked, limit = self._ranking_and_limit(sensitivity, max_layers)
        ranking = ranked["groups"]
        state = SearchState(max_layers=limit, width=self.width)
        rounds = self.rounds
        stopped, knob_trials, settings = self._knob_rounds(knob_choices, rounds)
        knob_passed = any(t["decision"] == "release" and t["settings"] == settings for t in knob_trials)
        counted = sum(1 for t in knob_trials if t["decision"] != "refused")
        base = loaded.variant(recipe.name, settings) if settings else loaded
        if not knob_passed and stopped == "found":
            stopped = self._layer_rounds(base, state, ranking, rounds, counted)
        note = state.monotonic_note()
        if note:
            state.notes.append(note)
            progress(f"search: {note}")
        best = None if knob_passed else state.best()
        result = {"ranking": str(ranking_file), "granularity": ranked["spec"]["granularity"], "max_layers": limit,
                  "stopped": "found by a knob" if knob_passed else stopped, "rounds": rounds,
                  "trials": [{"k": k, **state.trials[k]} for k in sorted(state.trials)], "best": best,
                  "knob_trials": knob_trials, "settings": settings, "passed": knob_passed or state.hi is not None,
                  "notes": state.notes, **self._scheme_fields()}
        if best is not None or knob_passed:
            result["recipe_file"] = str(_write_recipe(loaded, ranking, best or 0, folder, settings))
            result["kept"] = [row["group"] for row in ranking[:best or 0]]
        return result

    def _ranking_and_limit(self, sensitivity, max_layers) -> tuple[Path, dict[str, Any], int]:
        """(the ranking's file, read or computed first; the ranking; how many groups a trial may keep)."""
        ranking_file = sensitivity or (run_sensitivity(self.loaded, self.runs_root, SensitivitySpec(),
                                                       progress=self.progress)[0] / "sensitivity.json")
        ranked = _ranking(ranking_file, self.loaded)
        ranking = ranked["groups"]
        limit = min(max_layers if max_layers is not None else max(1, len(ranking) // 4), len(ranking))
        if limit < 1:
            raise RecipeError("--max-layers must be at least 1: the search keeps layers out of quantization",
                              field="--max-layers")
        self.progress(f"search: keep up to {limit} of {len(ranking)} groups unquantized, {self.width} trials a "
                      f"round, at most {self.max_trials} trials (ranking {ranking_file})")
        return ranking_file, ranked, limit

    def _knob_rounds(self, knob_choices, rounds) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
        """One round a knob, until a choice passes or a budget ends: (why it stopped, the knob
        trials, the settings kept: each knob's passing or closest choice)."""
        loaded, recipe, progress = self.loaded, self.loaded.recipe, self.progress
        stopped, knob_trials, settings = "found", [], {}
        for n, (field, choices) in enumerate(knob_choices, 1):
            if self.past_budget(rounds):
                stopped = "time budget"
                break
            trials = [loaded.variant(trial_name(f"{recipe.name}-k{n}c{i}", 0), {**settings, field: v})
                      for i, v in enumerate(choices, 1)]
            trials, refused = preflighted(trials, self.runs_root, progress)  # a refused choice uses no trial
            if self.used() + len(knob_trials) + len(trials) > self.max_trials:
                stopped = "trial budget"
                break
            progress(f"search: knob {field}, choices {choices} in this order")
            outcomes, info = compare_trials(trials, self.folder, progress, self.verbose, self.executor, self.family,
                                            self.held) if trials else ([], {"wall_s": 0.0})
            rounds.append({**info, "knob": field, "choices": choices})
            by_name = {o["name"]: o for o in outcomes + refused}
            tried = [{"knob": field, "value": v, "settings": {**settings, field: v},
                      **by_name[trial_name(f"{recipe.name}-k{n}c{i}", 0)]} for i, v in enumerate(choices, 1)]
            knob_trials += tried
            judged = [(v, t) for v, t in zip(choices, tried) if t["decision"] != "refused"]
            if not judged:
                continue  # every choice refused: the knob stays as the recipe has it
            passed, closest = knob_pick([t for _, t in judged])
            settings[field] = judged[passed if passed is not None else closest][0]
            if passed is not None:
                break
        return stopped, knob_trials, settings

    def _layer_rounds(self, base, state: SearchState, ranking, rounds, counted: int) -> str:
        """Rounds of layer trials (bisection over how many groups to keep) until the state has
        its answer or a budget ends: why they stopped."""
        while True:
            todo = state.next_points()
            if not todo:
                return "found" if state.hi is not None else "none passed"
            spent = self.used() + counted + len(state.trials)
            if spent + len(todo) > self.max_trials:
                todo = todo[:max(0, self.max_trials - spent)]
                if not todo:
                    return "trial budget"
            if self.past_budget(rounds):
                return "time budget"
            rounds.append(_round(base, todo, ranking, self.folder, state, self.progress, self.verbose, self.executor,
                                 self.family, self.held))


def preflighted(trials: list[LoadedRecipe], runs_root: Path, progress: Progress
                ) -> tuple[list[LoadedRecipe], list[dict[str, Any]]]:
    """(the trials every preflight accepts; the refused ones as outcomes, with why)."""
    ok, refused = [], []
    for t in trials:
        why = refused_by_preflight(t, runs_root, progress)
        if why is None:
            ok.append(t)
        else:
            refused.append({"name": t.recipe.name, "decision": "refused", "failed_gates": [why], "not_shown_gates": [],
                            "worst_recovery": None, "weights_bytes": None, "output_tokens_per_s": None})
    return ok, refused


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
           progress: Progress, verbose: bool, executor: Executor, family: Family,
           held: HeldBaseline | None = None) -> dict[str, Any]:
    """One round of layer trials; each trial's outcome recorded in the state."""
    progress(f"search: trials keeping {', '.join(map(str, ks))} of the most sensitive layer groups unquantized")
    outcomes, info = compare_trials([trial_recipe(loaded, ranking, k) for k in ks], folder, progress, verbose,
                                    executor, family, held)
    for k, outcome in zip(ks, outcomes):
        state.record(k, outcome)
    return {**info, "ks": ks}


def _write_recipe(loaded: LoadedRecipe, ranking: list[dict[str, Any]], k: int, folder: Path,
                  settings: dict[str, Any], *, scheme: str | None = None) -> Path:
    """The original recipe file plus the knob settings (or a scheme's sections) and the
    ignore list, its paths rebased to its new folder."""
    data, _ = read_recipe_data(loaded.path)  # what it extends laid in: the written recipe stands alone
    for field, value in settings.items():
        data = set_field(data, field, value)
    if scheme is not None:
        data["name"] = f"{loaded.recipe.name}-{scheme}"
        header = (f"# {loaded.path.name} with the quantization and calibration of {scheme}, found by `quantlab "
                  "search --schemes`;\n# paths are relative to this file.\n")
    else:
        data["name"] = trial_name(loaded.recipe.name, k)
        data.setdefault("quantization", {})["ignore"] = ignore_for(loaded.recipe.quantization.ignore, ranking, k)
        kept = ", ".join(row["group"] for row in ranking[:k]) or "none"
        knobs = "".join(f"# {field}: {value!r} (searched)\n" for field, value in settings.items())
        header = (knobs + f"# {loaded.path.name} with its {k} most sensitive layer group(s) left unquantized "
                  f"({kept}),\n# found by `quantlab search`; paths are relative to this file.\n")
    data = rebased(data, loaded.base_dir, folder)
    out = folder / f"{data['name']}.yaml"
    write_text_atomic(out, header + yaml.safe_dump(data, sort_keys=False))
    return out
