"""`python with_dummy_stage.py <quantlab arguments>`: quantlab's CLI with one more stage in
STAGES and VALIDATE_STAGES, after quality, as docs/design.md tells a new stage to be
added. The stage writes the candidate's name and the served model it saw into its run
folder (dummy.txt) and records no result. Tests use it to see that every path (a single
run, a comparison's members, a Ray comparison's tasks) runs what STAGES holds, with real
servers.

A Ray task runs in a worker process, which never runs this file: with `--ray`, the
driver hands `add_dummy_stage` to every worker as the job's setup hook
(QUANTLAB_RAY_WORKER_SETUP_HOOK, executors/ray_cluster.worker_setup), so the workers'
stage lists are the driver's."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from quantlab.core.fsutil import write_text_atomic
from quantlab.executors.ray_cluster import SETUP_HOOK_ENV
from quantlab.pipeline import stages

NAME = "dummy"
HOOK = f"{Path(__file__).stem}.add_dummy_stage"  # what Ray's workers call (this folder on their PYTHONPATH)


def dummy_stage() -> ModuleType:
    stage = ModuleType("dummy_stage")
    stage.NAME = NAME
    stage.inputs = lambda ctx: {"dummy": 1}
    stage.preflight = lambda ctx: None

    def run(ctx):
        served = ctx.engine("candidate").served_name
        write_text_atomic(ctx.run.path / "dummy.txt", f"{ctx.recipe.name} {served}\n")
        ctx.add_artifact("dummy.txt", "dummy")
        return None

    stage.run = run
    return stage


def add_dummy_stage() -> None:
    """The stage after quality in both lists; once (a process that has it keeps it)."""
    dummy = dummy_stage()
    for stage_list in (stages.STAGES, stages.VALIDATE_STAGES):
        names = [s.NAME for s in stage_list]
        if NAME not in names:
            stage_list.insert(names.index("quality") + 1, dummy)


def remove_dummy_stage() -> None:
    for stage_list in (stages.STAGES, stages.VALIDATE_STAGES):
        stage_list[:] = [s for s in stage_list if s.NAME != NAME]


@contextmanager
def dummy_stage_added() -> Iterator[None]:
    """In this process (a test's own), as the CLI below runs: the stage in the lists and
    the hook named for Ray's workers; both gone again on leaving."""
    before = os.environ.get(SETUP_HOOK_ENV)
    add_dummy_stage()
    os.environ[SETUP_HOOK_ENV] = HOOK
    try:
        yield
    finally:
        remove_dummy_stage()
        if before is None:
            os.environ.pop(SETUP_HOOK_ENV, None)
        else:
            os.environ[SETUP_HOOK_ENV] = before


if __name__ == "__main__":
    add_dummy_stage()
    os.environ[SETUP_HOOK_ENV] = HOOK  # --ray: the workers add it too
    from quantlab.cli import app

    sys.argv[0] = "quantlab"
    app(prog_name="quantlab")
