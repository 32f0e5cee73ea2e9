"""Runs the stages of a recipe in order, writing the run record after each one.

A stage is a function (loaded recipe, run dir, progress) -> (summary, artifacts).
Stages already `ok` in a resumed run are skipped; a resumed run must use the same
recipe content (hash), or its record would describe a mix of two recipes.
Later stages (serve, quality, perf, stability, gates, manifest) append to STAGES.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantlab.errors import QuantlabError, RecipeError
from quantlab.recipe import LoadedRecipe
from quantlab.run import Artifact, RunDir, StageResult, now_iso

Progress = Callable[[str], None]
StageFn = Callable[[LoadedRecipe, RunDir, Progress], tuple[dict[str, Any], list[Artifact]]]

CHECKPOINT_DIR = "checkpoint"


def stage_quantize(loaded: LoadedRecipe, run: RunDir, progress: Progress):
    from quantlab.stages.quantize import RESULT_FILE, quantize

    result = quantize(loaded, run.path / CHECKPOINT_DIR, overwrite=True, progress=progress)
    summary = {
        "checkpoint": CHECKPOINT_DIR,
        "method": result["method"],
        "scheme": result["scheme"],
        "layers_quantized": result["layers_quantized"],
        "calibration": result["calibration"],
        "quantization_config": result["checkpoint"]["quantization_config"],
        "size_bytes": result["checkpoint"]["size_bytes"],
        "timings": result["timings"],
        "peak_rss_bytes": result["peak_rss_bytes"],
        "versions": result["versions"],
        "model": result["model"],
        "gptq_max_loss": (result["gptq"] or {}).get("max_loss"),
        "engine_warnings": result["engine_warnings"],
    }
    artifacts = [
        run.artifact(f"{CHECKPOINT_DIR}/{RESULT_FILE}", "quantize-result"),
        run.artifact(f"{CHECKPOINT_DIR}/model.safetensors", "checkpoint-weights"),
    ]
    return summary, artifacts


def stage_serve(loaded: LoadedRecipe, run: RunDir, progress: Progress):
    from quantlab.models import resolve_model
    from quantlab.stages.serve import EngineTarget, serve_and_collect

    recipe = loaded.recipe
    baseline = resolve_model(recipe.model.source, base_dir=loaded.base_dir, revision=recipe.model.revision,
                             progress=progress)
    targets = [
        EngineTarget("baseline", baseline.path, "baseline"),
        EngineTarget("candidate", run.path / CHECKPOINT_DIR, "candidate"),
    ]
    summary = serve_and_collect(recipe.serve, targets, dtype=recipe.model.dtype, log_dir=run.path / "serve",
                                progress=progress)
    artifacts = [run.artifact(f"serve/{t.role}-server.log", f"{t.role}-server-log")
                 for t in targets if (run.path / "serve" / f"{t.role}-server.log").is_file()]
    return summary, artifacts


STAGES: list[tuple[str, StageFn]] = [("quantize", stage_quantize), ("serve", stage_serve)]


def run_pipeline(loaded: LoadedRecipe, runs_root: Path, *, resume: Path | None = None,
                 progress: Progress = print) -> RunDir:
    if resume is not None:
        run = RunDir.open(resume)
        if run.record.recipe_sha256 != loaded.content_hash:
            raise RecipeError(
                f"cannot resume {resume}: it was made from a recipe with hash "
                f"{run.record.recipe_sha256[:12]}, this recipe hashes to {loaded.content_hash[:12]}. "
                "Start a new run (drop --resume) or restore the recipe it was made from",
                file=str(loaded.path),
            )
        run.record.status = "running"
    else:
        run = RunDir.create(loaded, runs_root)
    progress(f"run directory: {run.path}")
    for name, fn in STAGES:
        done = run.record.stages.get(name)
        if done is not None and done.status == "ok":
            progress(f"stage {name}: already done, skipped")
            continue
        started, t0 = now_iso(), time.perf_counter()
        try:
            summary, artifacts = fn(loaded, run, progress)
        except BaseException as err:
            # Record the failure (also on Ctrl-C) before passing it on.
            msg = str(err) if isinstance(err, QuantlabError) else "".join(
                traceback.format_exception_only(type(err), err)).strip()
            run.put_stage(StageResult(name=name, status="failed", started_at=started, finished_at=now_iso(),
                                      duration_s=round(time.perf_counter() - t0, 3), error=msg))
            run.record.status = "failed"
            run.save()
            raise
        run.put_stage(StageResult(name=name, status="ok", started_at=started, finished_at=now_iso(),
                                  duration_s=round(time.perf_counter() - t0, 3), summary=summary,
                                  artifacts=artifacts))
    run.record.status = "ok"
    run.save()
    return run
