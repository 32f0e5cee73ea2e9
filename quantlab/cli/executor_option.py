"""Where `quantlab run` and `quantlab search` run their candidates: the executor their
options name (`--ray ADDRESS --storage DIR --ray-cpus N`: each on a node of a Ray cluster;
none: this machine), built once and handed to the comparison or the search
(quantlab/executors/)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantlab.cli.base import progress

if TYPE_CHECKING:
    from quantlab.pipeline.candidates.members import Comparison
    from quantlab.pipeline.executor import Executor


def executor_for(ray: str | None, storage: Path | None, runs_dir: Path, cpus: int = 1) -> Executor:
    """The executor the options name; building it joins nothing and creates nothing (that
    is done when it is entered, after the recipes are read)."""
    from quantlab.executors import build

    if ray:
        return build("ray", address=ray, storage=storage, runs_dir=runs_dir, cpus=cpus, progress=progress)
    return build("local")


def compare(executor: Executor, recipes: list[Path], runs_dir: Path, *, verbose: bool = False, family=None,
            **here_only) -> Comparison:
    """The candidates run by the executor, their choice and releases. Every recipe file is
    read first: a bad one is named before a cluster is joined or a storage folder made.
    `here_only`: the local executor's existing checkpoints (checkpoints, judge_by)."""
    from quantlab.recipe.file import load_recipe

    loaded = [load_recipe(r) for r in recipes]
    with executor:
        return executor.run(loaded, runs_dir, progress=progress, verbose=verbose, family=family, **here_only)
