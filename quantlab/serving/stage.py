"""Serve stage: the baseline and the candidate on vLLM with identical engine arguments
(one after the other, or side by side), and what each engine really used. The servers
stay up for the checks that follow (StageContext.engine); the pipeline stops them."""

from __future__ import annotations

from typing import Any

from quantlab.core import redact
from quantlab.core.stage_context import StageContext
from quantlab.core.layout import SERVE_LOG_DIR
from quantlab.models.source import source_fingerprint
from quantlab.core.results import CheckpointResult, CompatRecord, QuantizeResult, ServeResult
from quantlab.serving import gates as serve_gates
from quantlab.serving.compat import CompatReport, engine_build
from quantlab.serving.exposure import exposure
from quantlab.serving.plan import ServingPlan

NAME = "serve"


def inputs(ctx: StageContext) -> dict[str, Any]:
    q = ctx.run.record.result("quantize") or ctx.run.record.result("checkpoint")
    return {
        "serve": ctx.recipe.serve.model_dump(mode="json"),
        "baseline": {"model": ctx.recipe.model.model_dump(mode="json"), "source": source_fingerprint(ctx.loaded)},
        "candidate_weights": q.weights_sha256 if isinstance(q, (QuantizeResult, CheckpointResult)) else None,
    }


def preflight(ctx: StageContext) -> None:
    """Refuse a recipe the target cannot serve before quantizing, not after."""
    ctx.serving_plan(predicted="quantize" in ctx.will_run or not (ctx.checkpoint_dir / "config.json").is_file())


def plan(ctx: StageContext) -> list[str]:
    """What the dry run says of the servers: how they are closed, or that they are exposed."""
    spec = ctx.recipe.serve
    if spec.mode == "endpoint":
        key = f"the key in ${spec.api_key_env}" if spec.api_key_env else "no API key (serve.api_key_env unset)"
        if spec.candidate_api_key_env:
            key += f" (the candidate the key in ${spec.candidate_api_key_env})"
        return [f"external servers: quantlab sends them {key}"]
    lines = ["each server quantlab starts gets a random API key for the run (asked on every path but /health) "
             "and a random served-model name"]
    exposed = exposure(spec)
    if exposed:
        lines.append(f"EXPOSED: {exposed}")
    return lines


def compat_record(report: CompatReport) -> CompatRecord:
    """What the serving plan predicted for a role (the kernels it expects included; the
    kernels that ran are judged by the serve.kernel_path gate, see candidate_kernel_path)."""
    return CompatRecord(**report.as_record())


def candidate_kernel_path(plan: ServingPlan, engine_log: dict[str, Any] | None) -> dict[str, Any] | None:
    """The candidate's kernels on this plan's target against what the plan expected
    (serving/gates.kernel_path); None when no candidate is served there."""
    if "candidate" not in plan.compat:
        return None
    return serve_gates.kernel_path(plan.compat["candidate"].kernel_expectation, engine_log, mode=plan.spec.mode,
                                   allow=plan.spec.allow_kernels, engine_args=plan.engine_args, env=plan.spec.env)


def run(ctx: StageContext) -> ServeResult:
    """Start each server (kept up for the checks after this stage) and record its facts."""
    from quantlab.serving.vllm_facts import collect_facts

    plan = ctx.serving_plan()
    if plan.spec.mode != "endpoint":
        ctx.progress(f"serving environment: {engine_build(plan.probe)}, device {plan.device}, "
                     f"dtype {plan.dtype.dtype}" + (f" ({plan.dtype.reason})" if plan.dtype.changed else ""))
    with_baseline = ctx.needs_baseline()
    roles = [t for t in plan.targets if t.role != "baseline" or with_baseline]
    if len(roles) < len(plan.targets):
        ctx.progress("baseline server not started: the checks have what they need from it cached")
    ctx.start_engines([t.role for t in roles])
    facts = {t.role: collect_facts(ctx.engine(t.role), t, device=plan.device) for t in roles}
    log_dir = ctx.run.path / SERVE_LOG_DIR
    compat = {role: compat_record(report) for role, report in plan.compat.items()}
    kernels = candidate_kernel_path(plan, facts["candidate"].log) if "candidate" in facts else None
    for role in facts:
        if (log_dir / f"{role}-server.log").is_file():
            ctx.add_artifact(f"{SERVE_LOG_DIR}/{role}-server.log", f"{role}-server-log")
    launched = plan.spec.mode != "endpoint"
    if plan.exposed:
        ctx.progress(f"EXPOSED: {plan.exposed}")
    return ServeResult(
        mode=plan.spec.mode,
        device=plan.device,
        engine_args=redact.engine_args(plan.engine_args),  # a secret-looking value as its digest
        # one engine_args dict is passed to every server quantlab starts; it cannot know an endpoint's
        identical_engine_args=True if launched else None,
        side_by_side=plan.spec.side_by_side,
        probe=plan.probe,
        compat=compat,
        engines=facts,
        dtype=plan.dtype.as_record() if plan.dtype is not None else None,
        kernel_path=kernels,
        gates=serve_gates.verdicts(kernels, scope=plan.name),
        exposed=plan.exposed,
    )
