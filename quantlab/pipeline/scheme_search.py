"""`quantlab search RECIPE --schemes ...`: other methods and schemes first, cheapest first.

Each source (a shipped recipe by name, or a recipe file) gives a trial: the user's recipe
with the source's quantization and calibration sections (search/schemes.py). Every trial
is put through the preflight before any work; one it refuses (a scheme this host cannot
serve) is listed and costs no trial. The rest are ordered cheapest first by the predicted
cost the recipe's selection rule ranks (bytes from the scheme; speed from a microbenchmark
of each scheme's kernel on the target, serving/kernel_bench.py), and that order is part of
the family every trial is registered under (its members). They run `width` at a time as comparisons beside one baseline (kept up
across the rounds) until a round releases one; the comparison's selection rule picks
among that round's released trials, and the comparison signs it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from quantlab.core.errors import RecipeError
from quantlab.core.progress import Progress
from quantlab.core.shipped import RECIPES
from quantlab.pipeline.candidates.servers import HeldBaseline
from quantlab.pipeline.commands import dry_run
from quantlab.pipeline.executor import Executor
from quantlab.pipeline.search_rounds import compare_trials
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe, load_recipe
from quantlab.serving.kernel_bench import DECODE_TOKENS, layer_shapes, measure_kernels, scheme_kind
from quantlab.serving.vllm_probe import probe_serving_env, serving_python
from quantlab.search.schemes import SHIPPED_SCHEMES, SchemeTrial, order_by, ordered, predicted_bytes, \
    scheme_settings, tensor_shapes


def scheme_sources(names: tuple[str, ...]) -> list[tuple[str, LoadedRecipe]]:
    """--schemes: shipped recipe names (`auto`: all of SHIPPED_SCHEMES) or recipe files."""
    out = []
    for name in [n for given in names for n in (SHIPPED_SCHEMES if given == "auto" else (given,))]:
        path = Path(name) if name.endswith((".yaml", ".yml")) else RECIPES / f"{name}.yaml"
        if not path.is_file():
            raise RecipeError(f"--schemes {name!r}: neither a shipped recipe ({', '.join(SHIPPED_SCHEMES)}) nor a "
                              "recipe file", field="--schemes")
        out.append((path.stem, load_recipe(path)))
    return out


def scheme_trials(loaded: LoadedRecipe, sources: list[tuple[str, LoadedRecipe]], runs_root: Path,
                  progress: Progress) -> tuple[list[SchemeTrial], list[dict[str, Any]], dict[str, Any]]:
    """(the servable trials, cheapest first; the ones the preflight refused, with why; the
    kernel microbenchmark and what the order was by). A source whose quantization is the
    recipe's own is left out (the recipe is what is being searched from)."""
    shapes = tensor_shapes(_baseline_dir(loaded, progress))
    servable, refused = [], []
    for i, (source, src) in enumerate(sources, 1):
        if src.recipe.quantization == loaded.recipe.quantization:
            continue
        settings = scheme_settings(src, loaded)
        trial = loaded.variant(f"{loaded.recipe.name}-s{i}-{source}", settings)
        why = refused_by_preflight(trial, runs_root, progress)
        if why is not None:
            refused.append({"name": trial.recipe.name, "source": source, "decision": "refused", "why": why})
            continue
        servable.append(SchemeTrial(source, trial, predicted_bytes(trial.recipe.quantization, shapes), settings))
    bench = kernel_speeds(loaded, [t.loaded for t in servable], shapes, progress)
    speeds = {k: v["ratio"][str(DECODE_TOKENS)] for k, v in (bench.get("schemes") or {}).items()
              if str(DECODE_TOKENS) in (v.get("ratio") or {})}
    timed = [replace(t, predicted_time_ratio=_speed(t, speeds)) for t in servable]
    selection = loaded.recipe.selection
    rule, weights = (selection.rule, selection.weights) if selection else ("cost_per_success", {})
    bench["ordered_by"] = order_by(rule, timed)
    bench["rule"] = rule
    return ordered(timed, rule, weights), refused, bench


def _speed(trial: SchemeTrial, speeds: dict[str, float]) -> float | None:
    kind = scheme_kind(trial.loaded.recipe.quantization)
    return speeds.get(kind["id"]) if kind else None


def kernel_speeds(loaded: LoadedRecipe, trials: list[LoadedRecipe], shapes: dict[str, list[int]],
                  progress: Progress) -> dict[str, Any]:
    """The kernel microbenchmark of the trials' schemes on the recipe's serve target (measured
    once per serving environment, then from the cache); what was not measured says why. It
    orders the trials only: whatever goes wrong in it, the search goes on, ordered by bytes."""
    kinds = {k["id"]: k for k in (scheme_kind(t.recipe.quantization) for t in trials) if k}
    spec = loaded.recipe.serve
    layers = layer_shapes(shapes)
    if spec.mode != "launch":
        return {"measured": False, "why": f"serve.mode {spec.mode}: the target's engine is not quantlab's to time"}
    if not kinds:
        return {"measured": False, "why": "no trial's scheme has a kernel microbenchmark (W4A16, W8A8 int8)"}
    if not layers:
        return {"measured": False, "why": "no decoder layer ('.layers.N.' weights) found in the model's files"}
    try:
        python = serving_python(spec)
        bench = measure_kernels(python, probe_serving_env(python), layers, list(kinds.values()))
    except Exception as err:  # noqa: BLE001 - a failed measurement costs the order, never the search
        why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
        progress(f"search: the kernel microbenchmark failed ({why}); trials ordered by bytes")
        return {"measured": False, "why": why}
    said = ", ".join(f"{k} {v['ratio'][str(DECODE_TOKENS)]:.2f}x" for k, v in sorted((bench.get("schemes") or {}).items())
                     if str(DECODE_TOKENS) in (v.get("ratio") or {}))
    progress(f"search: each scheme's linear kernel on this host, its time over the 16-bit layer's at a "
             f"{DECODE_TOKENS}-token decode step: {said or 'none measured (' + str(bench.get('why')) + ')'}")
    return bench


def refused_by_preflight(trial: LoadedRecipe, runs_root: Path, progress: Progress) -> str | None:
    """Why every preflight of the trial (a dry run: nothing started) refuses it, said; None: accepted."""
    try:
        dry_run(trial, runs_root, progress=lambda *_: None)
    except RecipeError as err:
        why = refusal_text(err)
        progress(f"search: {trial.recipe.name} refused by its preflight, no trial used: {why}")
        return why
    return None


def refusal_text(err: RecipeError, limit: int = 400) -> str:
    """A preflight's refusal on one line (its cause is often on the second)."""
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _baseline_dir(loaded: LoadedRecipe, progress: Progress) -> Path:
    from quantlab.models.source import resolve_recipe_model

    return resolve_recipe_model(loaded, progress=progress).path


def run_schemes(trials: list[SchemeTrial], folder: Path, *, width: int, budget_left: int, progress: Progress,
                verbose: bool, executor: Executor, family: Family, held: HeldBaseline | None,
                past_budget) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]:
    """The trials in rounds of `width`, cheapest first, until one is released, the trial
    budget is spent or `past_budget(rounds)` says the next round would end past the time
    budget. Returns (each trial's outcome, the rounds, the released trial chosen or None)."""
    outcomes, rounds = [], []
    todo = trials[:max(0, budget_left)]
    for start in range(0, len(todo), max(1, width)):
        if past_budget(rounds):
            break
        chunk = todo[start:start + width]
        progress("search: schemes " + ", ".join(f"{t.source} ({t.describe()}, ~{t.predicted_bytes / 1e6:.1f} MB"
                                                + (f", {t.predicted_time_ratio:.2f}x the 16-bit layer time"
                                                   if t.predicted_time_ratio is not None else "") + ")"
                                                for t in chunk))
        got, info = compare_trials([t.loaded for t in chunk], folder, progress, verbose, executor, family, held)
        rounds.append({**info, "schemes": [t.source for t in chunk]})
        for t, o in zip(chunk, got):
            outcomes.append({**o, "source": t.source, "scheme": t.describe(), "predicted_bytes": t.predicted_bytes,
                             "predicted_time_ratio": t.predicted_time_ratio})
        chosen = info.get("chosen")
        if chosen is not None:
            return outcomes, rounds, chosen
    return outcomes, rounds, None
