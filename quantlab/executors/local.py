"""The local executor: a comparison's members on this machine, beside one baseline server
(pipeline/candidates/run.py), which a search may hold up across its rounds."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from quantlab.core.progress import Progress
from quantlab.pipeline.candidates.members import Comparison
from quantlab.pipeline.candidates.run import run_comparison
from quantlab.pipeline.candidates.servers import HeldBaseline
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe


class LocalExecutor:
    """Runs every member here; nothing to join, nothing to leave."""

    name = "local"

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def hold_baseline(self, at_least: int) -> HeldBaseline | None:
        """One baseline server kept up across the comparisons (started by the first)."""
        return HeldBaseline(at_least=at_least)

    def run(self, members: Sequence[Path | LoadedRecipe], runs_root: Path, *, progress: Progress = print,
            verbose: bool = False, family: Family | None = None, held: HeldBaseline | None = None,
            allow_single: bool = False, checkpoints: dict[str, Path] | None = None,
            judge_by: Path | None = None) -> Comparison:
        """The comparison under `runs_root` (compare/<id>/). Here only: existing
        `checkpoints` (name -> folder) as more candidates, judged by `judge_by` or the first
        recipe (`quantlab run --checkpoint`, `quantlab validate`)."""
        return run_comparison(list(members), runs_root, checkpoints=checkpoints, judge_by=judge_by,
                              progress=progress, verbose=verbose, allow_single=allow_single, family=family,
                              held=held)
