"""The executor contract: what runs a comparison's members, on this machine or elsewhere.

The CLI builds one executor from its options and hands it to a comparison or a search
(search.py, search_rounds.py, scheme_search.py), which call only what is declared here.
The implementations live in quantlab/executors/ (executors/local.py: this machine;
executors/ray.py: each member a task on a Ray cluster), one module each, built by name
from the registry in executors/__init__.py. The contract is on the pipeline's floor so
that the search can name it; executors/ stands a floor above and implements it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from quantlab.core.progress import Progress
from quantlab.pipeline.candidates.members import Comparison
from quantlab.pipeline.candidates.servers import HeldBaseline
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe


class Executor(Protocol):
    """Runs a comparison's members and returns the comparison, decided, chosen and signed.

    Entered (`with executor:`) around its runs: it joins what it runs on (a cluster) and
    leaves it on exit; whatever it can refuse without creating anything it refuses first.
    """

    name: str  # its name in the registry (executors/__init__.py): "local", "ray"

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc: object) -> None: ...

    def hold_baseline(self, at_least: int) -> HeldBaseline | None:
        """A baseline server kept up across this executor's comparisons (a search's rounds),
        bound for `at_least` engines; None where it cannot hold one (its owner stops it)."""
        ...

    def run(self, members: Sequence[Path | LoadedRecipe], runs_root: Path, *, progress: Progress = print,
            verbose: bool = False, family: Family | None = None, held: HeldBaseline | None = None,
            allow_single: bool = False) -> Comparison:
        """The members (recipe files, or recipes in memory such as a search's trials) as
        candidates against one baseline; their comparison under `runs_root` (or where the
        executor keeps its runs). `family`: the candidates' alpha is spent over it.
        `held`: from hold_baseline. `allow_single`: one member is a comparison too."""
        ...
