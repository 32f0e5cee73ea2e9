"""A run's stages, in order, and which of them an invocation runs (its todo) and why.

A new stage goes in STAGES (and in VALIDATE_STAGES, the same list with the checkpoint
stage in place of quantize; a check that can judge imported evidence has an imported stage
in DECIDE_STAGES): the single run, the dry run, a comparison's members and a
Ray task all read these lists as they are (pipeline/candidate_run.py).

Resume: a stage is redone when it has no `ok` record, when the hash of its inputs
changed (each stage's `inputs`, core/stage_context.py), or when a stage before it was
redone. So an edited serve section re-serves and keeps the checkpoint, an edited
quantization section starts again from quantize, and an edited description changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from quantlab.core import checks as check_table
from quantlab.core.digest import inputs_hash
from quantlab.core.errors import RecipeError
from quantlab.core.stage_context import stage_hook
from quantlab.pipeline.context import RunContext
from quantlab.load_quality import stage as load_quality_stage
from quantlab.performance import imported_stage as imported_perf_stage
from quantlab.performance import stage as perf_stage
from quantlab.quality import imported_stage as imported_quality_stage
from quantlab.quality import stage as quality_stage
from quantlab.quantize import checkpoint_stage
from quantlab.quantize import stage as quantize_stage
from quantlab.release import evidence_stage
from quantlab.release import stage as release_stage
from quantlab.serving import stage as serve_stage
from quantlab.stability import stage as stability_stage
from quantlab.targets import stage as targets_stage

STAGES: list[ModuleType] = [quantize_stage, serve_stage, quality_stage, perf_stage, load_quality_stage,
                            stability_stage, targets_stage, release_stage]
# quantlab validate: an existing checkpoint instead of quantizing
VALIDATE_STAGES: list[ModuleType] = [checkpoint_stage, serve_stage, quality_stage, perf_stage, load_quality_stage,
                                     stability_stage, targets_stage, release_stage]
# quantlab decide: evidence made elsewhere (lm-eval logs, benchmark files) judged by the same checks'
# gates; the checkpoint taken in (and the release signed) only when the user names it
DECIDE_STAGES: list[ModuleType] = [checkpoint_stage, evidence_stage, imported_quality_stage, imported_perf_stage,
                                   release_stage]
DECIDE_UNSIGNED_STAGES: list[ModuleType] = [evidence_stage, imported_quality_stage, imported_perf_stage, release_stage]
CHECKPOINT_STAGES = (quantize_stage.NAME, checkpoint_stage.NAME)  # where the candidate's files are recorded


def stages_for(checkpoint: Path | None, *, imported: bool = False) -> list[ModuleType]:
    """The stages of a run that quantizes, that validates an existing checkpoint, or that decides
    on imported evidence (`imported`: signed only with a checkpoint)."""
    if imported:
        return DECIDE_STAGES if checkpoint is not None else DECIDE_UNSIGNED_STAGES
    return VALIDATE_STAGES if checkpoint is not None else STAGES


def enabled(stage: ModuleType, ctx: RunContext) -> bool:
    """Check stages run only when the recipe has their section."""
    check = stage_hook(stage, "enabled")
    return check is None or check(ctx)


def baseline_needed(ctx: RunContext) -> bool:
    """Whether the serve stage starts the baseline server: yes unless every enabled check
    says it can do without (the quality stage with cached baseline results)."""
    hooks = [h for s in ctx.stages if s.NAME in ctx.enabled_stages and (h := stage_hook(s, "needs_baseline"))]
    return not hooks or any(hook(ctx) for hook in hooks)


def require_evidence(ctx: RunContext) -> None:
    """A run decides on its checks' gates: a recipe without any would serve both models
    and decide nothing (it used to sign a release on no evidence). Refused before any work."""
    if not ctx.enabled_stages & set(check_table.evidence_names()):
        sections = [c.section for c in check_table.CHECKS if c.evidence]
        raise RecipeError(f"the recipe has no check section ({', '.join(sections[:-1])} or {sections[-1]}): "
                          "`quantlab run` would serve both models and show nothing, and nothing is released "
                          "without evidence. Add a check section (see recipes/gptq-w4a16.yaml), or only quantize "
                          f"with `quantlab quantize {ctx.loaded.path.name}`", file=str(ctx.loaded.path),
                          field="quality")


def stages_to_run(ctx: RunContext) -> dict[str, str]:
    """Which stages this invocation runs, each with the reason; sets the context's stages
    the recipe asks for (`enabled_stages`). A recipe without a check section is refused
    (require_evidence)."""
    plan: dict[str, str] = {}
    upstream_redone = False
    ctx.stages = ctx.stages or STAGES
    ctx.enabled_stages = {stage.NAME for stage in ctx.stages if enabled(stage, ctx)}
    require_evidence(ctx)
    for stage in ctx.stages:
        if stage.NAME not in ctx.enabled_stages:
            continue
        done = ctx.run.record.stages.get(stage.NAME)
        if upstream_redone:
            plan[stage.NAME] = "an earlier stage is redone"
        elif done is None:
            plan[stage.NAME] = "not run yet"
        elif done.status != "ok":
            plan[stage.NAME] = f"last attempt {done.status}"
        elif done.inputs_sha256 != inputs_hash(stage.inputs(ctx)):
            plan[stage.NAME] = "its inputs changed"
        else:
            continue
        upstream_redone = True
    return plan
