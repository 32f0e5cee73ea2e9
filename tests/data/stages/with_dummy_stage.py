"""`python with_dummy_stage.py <quantlab arguments>`: quantlab's CLI with one more stage in
STAGES and VALIDATE_STAGES, after quality, as docs/design.md tells a new stage to be
added. The stage writes the candidate's name and the served model it saw into its run
folder (dummy.txt) and records no result. Tests use it to see that every path (a single
run, a comparison's members) runs what STAGES holds, with real servers."""

from __future__ import annotations

import sys
from types import ModuleType

from quantlab.core.fsutil import write_text_atomic
from quantlab.pipeline import stages


def dummy_stage() -> ModuleType:
    stage = ModuleType("dummy_stage")
    stage.NAME = "dummy"
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
    dummy = dummy_stage()
    for stage_list in (stages.STAGES, stages.VALIDATE_STAGES):
        stage_list.insert([s.NAME for s in stage_list].index("quality") + 1, dummy)


if __name__ == "__main__":
    add_dummy_stage()
    from quantlab.cli import app

    sys.argv[0] = "quantlab"
    app(prog_name="quantlab")
