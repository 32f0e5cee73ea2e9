"""`quantlab calibrate`: this host's performance noise for a recipe's workloads, measured once
and kept in the cache (performance/noise_store.py), so that later runs of 2-3 repeats judge
their ratios with tens of degrees of freedom.

An A/A run: `quantlab validate RECIPE --checkpoint <the baseline's folder>` with the recipe's
performance section alone (quality, stability and extra serve targets off), `--repeats`
paired repeats and no adaptive ones. Both servers serve the baseline's weights with the
engine args a run of the recipe will use (the dtype is pinned to the one its candidate's
scheme gets, so the store's key is the run's), measured as the stage measures; the stage
sees that its candidate is the baseline's weights and stores each point's per-repeat log
ratios as A/A contributions. Afterwards the store is read back under the keys a run of the
recipe will look up: a calibration stored where no run would find it is an error, not a
silent no-op.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantlab.core.errors import CheckError, GateFailure, RecipeError
from quantlab.core.progress import Progress
from quantlab.core.run import RunDir
from quantlab.performance import noise_store
from quantlab.performance.result import load_points
from quantlab.pipeline.candidate_run import CandidateRun
from quantlab.pipeline.loop import run_pipeline
from quantlab.recipe.file import LoadedRecipe

DEFAULT_REPEATS = 10
MAX_REPEATS = 50  # performance.max_repeats' own ceiling


@dataclass
class Calibration:
    """What `quantlab calibrate` did: the A/A run's folder (None when skipped), and per point
    and metric the df and sd of log ratio this run added and the store now holds."""

    run_dir: Path | None
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    skipped: bool = False


def point_parts(loaded: LoadedRecipe, progress: Progress) -> tuple[dict[tuple[str, str], dict[str, Any]], Any]:
    """The store's key parts of each workload point as a run of this recipe will compute them
    (its predicted serving plan: the scheme its quantization exports), and that plan."""
    tmp = Path(tempfile.mkdtemp(prefix="quantlab-calibrate-"))
    try:
        ctx = CandidateRun.create(loaded, tmp, progress).ctx  # a run folder never run: its plans, predicted
        plan = ctx.serving_plan(predicted=True)
        parts = {(w.name, point): noise_store.point_parts(ctx, w, point, plan=plan)
                 for w in loaded.recipe.performance.workloads for point, _, _ in load_points(w)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return parts, plan


def held(parts: dict[tuple[str, str], dict[str, Any]], *, run_id: str | None = None) -> list[dict[str, Any]]:
    """Per point and metric: the store's df and sd (log ratio) now, and what run `run_id` added."""
    rows = []
    for (workload, point), p in parts.items():
        mine = {}
        if run_id is not None:
            for body in noise_store.contributions(p):
                if body["run"] == run_id and body["kind"] == noise_store.AA:
                    mine = body["figures"]
        for metric in noise_store.METRICS:
            total = noise_store.host_noise(p, metric)
            ss, df = noise_store.ss_df(noise_store.AA, mine[metric]) if metric in mine else (0.0, 0)
            rows.append({"workload": workload, "point": point, "metric": metric, "added_df": df,
                         "added_sd": math.sqrt(ss / df) if df else None,
                         "df": total.df if total else 0, "sd": math.sqrt(total.variance) if total else None})
    return rows


def _checked(loaded: LoadedRecipe, repeats: int) -> None:
    spec = loaded.recipe.performance
    if spec is None:
        raise RecipeError("the recipe has no performance section: calibrate measures the spread of its workload "
                          "points. Add a performance section (see recipes/gptq-w4a16.yaml)",
                          file=str(loaded.path), field="performance")
    if loaded.recipe.serve.mode == "endpoint":
        raise RecipeError("serve.mode is endpoint: calibrate serves the baseline's weights on two servers that "
                          "quantlab launches, and an external endpoint serves whatever it serves. Calibrate with "
                          "a launch or command recipe of the same engine and host", file=str(loaded.path),
                          field="serve.mode")
    if not 2 <= repeats <= MAX_REPEATS:
        raise RecipeError(f"--repeats {repeats}: calibrate needs 2 to {MAX_REPEATS} paired repeats (each is a "
                          "degree of freedom per point; 10 is the default)", field="--repeats")


def calibrate(loaded: LoadedRecipe, runs_root: Path, *, repeats: int = DEFAULT_REPEATS, min_df: int | None = None,
              progress: Progress = print, verbose: bool = False) -> Calibration:
    """The A/A calibration of this host for the recipe's performance workloads (module
    docstring). `min_df`: nothing is run when the store already holds at least that many
    df for every point and metric."""
    from quantlab.models.source import resolve_recipe_model

    _checked(loaded, repeats)
    if min_df is not None and min_df < 1:
        raise RecipeError(f"--min-df {min_df}: give a positive number of degrees of freedom", field="--min-df")
    parts, plan = point_parts(loaded, progress)
    before = held(parts)
    if min_df is not None and all(r["df"] >= min_df for r in before):
        return Calibration(None, before, [f"the store already holds at least {min_df} df for every point and "
                                          "metric: nothing measured"], skipped=True)
    baseline = resolve_recipe_model(loaded, progress=progress).path
    settings: dict[str, Any] = {"quality": None, "stability": None, "serve.targets": [],
                                "performance.repeats": repeats, "performance.max_repeats": None}
    dtype = (plan.engine_args or {}).get("dtype")
    if dtype and loaded.recipe.serve.engine_args.get("dtype", "auto") == "auto":
        settings["serve.engine_args.dtype"] = dtype  # the candidate's scheme decides it in a real run
    aa = loaded.variant(f"{loaded.recipe.name[:54]}-calibrate", settings)
    n_points = len(parts)
    progress(f"calibrate: an A/A run of {loaded.recipe.name}: the baseline's weights ({baseline}) on both servers, "
             f"{repeats} paired repeats of {n_points} point(s)" + (f", served in {dtype}" if dtype else ""))
    notes: list[str] = []
    try:
        run_dir = run_pipeline(aa, runs_root, progress=progress, verbose=verbose, checkpoint=baseline).path
    except GateFailure as err:  # the A/A's own decision: a false block, worth saying, not a failed calibration
        run_dir = err.run_dir
        notes.append(f"the A/A run itself ended blocked (an unchanged model): {str(err).splitlines()[0]}")
    except Exception as err:  # noqa: BLE001 - a later stage (the release) failing leaves the repeats stored
        run_dir = getattr(err, "run_dir", None)
        record = RunDir.open(run_dir).record if run_dir else None
        perf = record.stages.get("performance") if record else None
        if perf is None or perf.status != "ok":
            raise
        notes.append(f"the A/A run failed after its performance stage ({type(err).__name__}: "
                     f"{str(err).splitlines()[0]}); its repeats were stored")
    run_id = RunDir.open(run_dir).record.run_id
    rows = held(parts, run_id=run_id)
    if not any(r["added_df"] for r in rows):
        raise CheckError(f"the A/A run {run_dir} stored no repeats under the keys a run of {loaded.path} will look "
                         "up (its serving plan, baseline or workload points differ from the recipe's): see the "
                         "performance notes in its report.md")
    return Calibration(run_dir, rows, notes)
