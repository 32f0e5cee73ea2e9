"""Serve stage: the baseline and the candidate on vLLM with identical engine arguments
(one after the other, or side by side), and what each engine really used."""

from __future__ import annotations

import contextlib
from typing import Any

from quantlab.context import RunContext
from quantlab.layout import SERVE_LOG_DIR
from quantlab.models import source_fingerprint
from quantlab.results import CompatRecord, QuantizeResult, ServeResult
from quantlab.serving_compat import kernel_warnings, predict_quant_config
from quantlab.serving_plan import ServingPlan, plan_serving, serve_targets

NAME = "serve"


def inputs(ctx: RunContext) -> dict[str, Any]:
    q = ctx.run.record.result("quantize")
    return {
        "serve": ctx.recipe.serve.model_dump(mode="json"),
        "baseline": {"model": ctx.recipe.model.model_dump(mode="json"), "source": source_fingerprint(ctx.loaded)},
        "candidate_weights": q.weights_sha256 if isinstance(q, QuantizeResult) else None,
    }


def _plan(ctx: RunContext, *, predicted: bool) -> ServingPlan:
    spec = ctx.recipe.serve
    targets = serve_targets(spec, baseline_dir=ctx.baseline_model().path, candidate_dir=ctx.checkpoint_dir)
    overrides = None
    if predicted:
        # The checkpoint does not exist yet: judge the scheme the recipe will export.
        overrides = {"candidate": predict_quant_config(ctx.recipe.quantization)}
        if overrides["candidate"] is None:  # a raw recipe: only the checkpoint will tell
            targets = [t for t in targets if t.role != "candidate"]
            overrides = {}
    return plan_serving(spec, targets, dtype=ctx.recipe.model.dtype, probe=ctx.serving_probe(),
                        quant_configs=overrides)


def preflight(ctx: RunContext) -> None:
    """Refuse a recipe the target cannot serve before quantizing, not after."""
    _plan(ctx, predicted="quantize" in ctx.will_run or not (ctx.checkpoint_dir / "config.json").is_file())


def run(ctx: RunContext) -> ServeResult:
    from quantlab.engines.vllm_facts import collect_facts
    from quantlab.engines.vllm_server import open_engine

    plan = _plan(ctx, predicted=False)
    log_dir = ctx.run.path / SERVE_LOG_DIR
    if plan.spec.mode != "endpoint":
        ctx.progress(f"serving environment: vLLM {plan.probe['versions'].get('vllm')}, device {plan.device}")
    facts = {}
    with contextlib.ExitStack() as stack:
        servers = {}
        for t in plan.targets:
            if plan.spec.side_by_side:
                servers[t.role] = stack.enter_context(open_engine(plan, t.role, log_dir=log_dir,
                                                                  progress=ctx.progress))
            else:
                with open_engine(plan, t.role, log_dir=log_dir, progress=ctx.progress) as server:
                    facts[t.role] = collect_facts(server, t, device=plan.device)
        for role, server in servers.items():
            facts[role] = collect_facts(server, plan.target(role), device=plan.device)

    compat = {}
    for role, report in plan.compat.items():
        record = CompatRecord(**report.as_record())
        record.warnings += kernel_warnings(report.expected_kernels, facts[role].log)
        compat[role] = record
    for role in facts:
        if (log_dir / f"{role}-server.log").is_file():
            ctx.add_artifact(f"{SERVE_LOG_DIR}/{role}-server.log", f"{role}-server-log")
    launched = plan.spec.mode != "endpoint"
    return ServeResult(
        mode=plan.spec.mode,
        device=plan.device,
        engine_args=plan.engine_args,
        # one engine_args dict is passed to every server quantlab starts; it cannot know an endpoint's
        identical_engine_args=True if launched else None,
        side_by_side=plan.spec.side_by_side,
        probe=plan.probe,
        compat=compat,
        engines=facts,
    )
