"""Where a comparison's members run: the executors, by name.

Each executor is one module here that implements the contract in pipeline/executor.py
(enter and leave what it runs on; hold a baseline across comparisons where it can; run
members -> Comparison), and one line in EXECUTORS: its name and its factory, called with
the command line's options as keywords. The CLI builds one (cli/executor_option.py) and
hands it to the comparison and the search.
"""

from __future__ import annotations

from collections.abc import Callable

from quantlab.core.errors import RecipeError
from quantlab.executors.local import LocalExecutor
from quantlab.executors.ray import RayExecutor
from quantlab.pipeline.executor import Executor

EXECUTORS: dict[str, Callable[..., Executor]] = {
    "local": LocalExecutor,  # this machine (executors/local.py)
    "ray": RayExecutor,  # each member a task on a Ray cluster (executors/ray.py)
}


def build(name: str, **options) -> Executor:
    """The executor registered under `name`, built from `options` (nothing joined or created yet)."""
    factory = EXECUTORS.get(name)
    if factory is None:
        raise RecipeError(f"no executor named {name!r}; there are: {', '.join(sorted(EXECUTORS))}")
    return factory(**options)
