"""One round of a search: its trials compared against one baseline by the search's
executor (pipeline/executor.py: here, or as Ray tasks), each trial's outcome as the
search reads it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from quantlab.core.fsutil import safetensors_bytes
from quantlab.core.progress import Progress
from quantlab.pipeline.candidates.servers import HeldBaseline
from quantlab.pipeline.executor import Executor
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe


def compare_trials(trials: list[LoadedRecipe], folder: Path, progress: Progress, verbose: bool, executor: Executor,
                   family: Family | None = None, held: HeldBaseline | None = None
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One comparison of these trials by the executor (a lone trial is a comparison of one;
    here its folder is under <folder>/rounds); each trial's decision, failed gates, worst
    recovery, weights and throughput, in order, and the round's comparison, time and chosen
    trial. `held`: the baseline server kept up across rounds, where the executor holds one."""
    t0 = time.perf_counter()
    comparison = executor.run(trials, folder / "rounds", progress=progress, verbose=verbose, family=family,
                              held=held, allow_single=True)
    rows = {row["name"]: row for row in comparison.data["candidates"]}
    refused = comparison.data.get("refused") or {}
    base_tps = (comparison.data.get("baseline") or {}).get("output_tokens_per_s")
    outcomes = []
    for trial in trials:
        name = trial.recipe.name
        row = rows.get(name) or {}
        outcomes.append({"name": name, "decision": row.get("decision", "refused" if name in refused else "failed"),
                         "failed_gates": row.get("failed_gates") or ([refused[name]] if name in refused else []),
                         "not_shown_gates": row.get("not_shown_gates") or [],
                         "worst_recovery": row.get("worst_recovery"), "worst_recovery_at": row.get("worst_recovery_at"),
                         "weights_bytes": weights_bytes(comparison.folder, name),
                         "output_tokens_per_s": row.get("output_tokens_per_s"),
                         "throughput_ratio": row["output_tokens_per_s"] / base_tps
                         if row.get("output_tokens_per_s") and base_tps else None,
                         "run": str(comparison.folder / "candidates" / name)})
    return outcomes, {"comparison": str(comparison.folder), "wall_s": round(time.perf_counter() - t0, 1),
                      "chosen": comparison.choice.chosen if comparison.choice else None}


def weights_bytes(folder: Path, name: str) -> int | None:
    """A trial's checkpoint weights (None: it never got one)."""
    return safetensors_bytes(*folder.glob(f"candidates/{name}/*/checkpoint")) or None
