"""Targets stage: the same checkpoint on every serve target the recipe names beyond the
primary one (another device, engine build or settings, an endpoint). On each: the
server's facts, the greedy prompts alone and in batches (the target's batch mismatch),
and the greedy answers compared with the primary target's (the cross-target mismatch),
judged candidate against baseline where both are served. A target that cannot serve the
scheme, or whose server does not start, is blocked when optional and fails the run when
required. Quality and performance stay measured on the primary target."""

from __future__ import annotations

import time
from typing import Any

from quantlab.core import redact
from quantlab.core.stage_context import StageContext
from quantlab.core.errors import EngineError
from quantlab.recipe.serve import PRIMARY_TARGET
from quantlab.core.results import TargetOutcome, TargetsResult
from quantlab.targets import gates as target_gates
from quantlab.recipe.stability import StabilitySpec
from quantlab.serving import stage as serve_stage
from quantlab.stability.probe_run import probe_prompts, run_probe, tokenizer_dir

NAME = "targets"


def enabled(ctx: StageContext) -> bool:
    return bool(ctx.recipe.serve.targets)


def needs_baseline(ctx: StageContext) -> bool:
    return any("baseline" in t.roles for t in ctx.recipe.serve.targets)


def inputs(ctx: StageContext) -> dict[str, Any]:
    spec = ctx.recipe.stability or StabilitySpec()
    return {"serving": serve_stage.inputs(ctx), "probe": {"prompts": spec.prompts, "max_tokens": spec.max_tokens,
                                                          "levels": _levels(spec)}}


def preflight(ctx: StageContext) -> None:
    """A required target that cannot serve the scheme the recipe will export fails here."""
    ctx.target_plans(predicted="quantize" in ctx.will_run or not (ctx.checkpoint_dir / "config.json").is_file())


def _levels(spec: StabilitySpec) -> list[int]:
    return spec.batch.concurrency if spec.batch else [4]


def _mismatch(texts: list[str | None], reference: list[str | None]) -> tuple[float | None, int, list[int]]:
    pairs = [(i, a, b) for i, (a, b) in enumerate(zip(texts, reference, strict=True))
             if a is not None and b is not None]
    differing = [i for i, a, b in pairs if a != b]
    return (len(differing) / len(pairs) if pairs else None), len(pairs), differing


def _check_target(ctx: StageContext, name: str, tp, sweep, primary: dict[str, dict[str, Any]]) -> TargetOutcome:
    """One extra target: each of its roles served there in turn, swept, and compared with
    the primary target's greedy answers."""
    from quantlab.serving.vllm_facts import collect_facts

    t = tp.target
    if tp.plan is None:
        ctx.progress(f"target {name}: not servable ({tp.unservable}); recorded as blocked")
        return TargetOutcome(name=name, required=t.required, roles=t.roles, status="unservable",
                             reason=tp.unservable, mode=tp.spec.mode)
    plan = tp.plan
    outcome = TargetOutcome(name=name, required=t.required, roles=t.roles, status="checked", mode=plan.spec.mode,
                            device=plan.device, engine_args=redact.engine_args(plan.engine_args), probe=plan.probe)
    started = time.monotonic()
    for role in t.roles:
        label = plan.label(role)
        try:
            server = ctx.engine(role, name)
        except EngineError as err:
            if t.required:
                raise EngineError(f"serve target '{name}' (required): {err}") from None
            ctx.progress(f"target {name}: the {role} server did not start; recorded as blocked")
            outcome.status, outcome.reason = "not_started", str(err).splitlines()[0][:500]
            break
        facts = collect_facts(server, plan.target(role), device=plan.device)
        outcome.engines[role] = facts
        outcome.compat[role] = serve_stage.compat_record(plan.compat[role])
        if role == "candidate":
            outcome.kernel_path = serve_stage.candidate_kernel_path(plan, facts.log)
        result = sweep(label, server)
        ctx.stop_engine(role, name)  # one extra target's server at a time
        outcome.batch_mismatch_rate[role] = result["mismatch_rate"]
        rate, compared, differing = _mismatch(result["greedy_texts"], primary[role]["greedy_texts"])
        outcome.cross_mismatch_rate[role], outcome.compared[role] = rate, compared
        outcome.errors[role] = result["errors"]
        for i in differing[:3]:
            outcome.examples.append({"role": role, "prompt": i,
                                     "primary": primary[role]["greedy_texts"][i],
                                     "target": result["greedy_texts"][i]})
        if server.plan is not None and server.log_path.is_file():
            ctx.add_artifact(str(server.log_path.relative_to(ctx.run.path)), f"{label}-server-log")
    ctx.progress(f"target {name}: {outcome.status} in {time.monotonic() - started:.0f} s; greedy answers "
                 "differing from the primary: " + (", ".join(
                     f"{r} {v:.0%}" for r, v in outcome.cross_mismatch_rate.items() if v is not None) or "-"))
    return outcome


def run(ctx: StageContext) -> TargetsResult:
    from quantlab.models.tokenizer import load_tokenizer
    from quantlab.stability import probe as sp

    spec = ctx.recipe.stability or StabilitySpec()
    levels, timeout = _levels(spec), spec.request_timeout_s
    tok = load_tokenizer(tokenizer_dir(ctx), trust_remote_code=ctx.recipe.model.trust_remote_code)
    prompts, _ = probe_prompts(tok, spec.prompts)
    plans = ctx.target_plans()

    def sweep(label: str, server) -> dict[str, Any]:
        return run_probe(ctx, label, server, f"greedy prompts alone and in batches {levels}", sp.batch_sweep,
                      server.base_url, server.served_name, prompts, max_tokens=spec.max_tokens, levels=levels,
                      timeout_s=timeout)

    needed = {r for tp in plans.values() if tp.plan is not None for r in tp.target.roles}
    running = [r for t, r in ctx.running_engine_keys() if t == PRIMARY_TARGET]
    primary: dict[str, dict[str, Any]] = {}
    for role in sorted(needed, key=lambda r: (r not in running, r)):  # what runs first: no restart
        primary[role] = sweep(role, ctx.engine(role))

    outcomes = {name: _check_target(ctx, name, tp, sweep, primary) for name, tp in plans.items()}
    verdicts = [v for name, tp in plans.items() for v in target_gates.verdicts(outcomes[name], tp.target)]
    return TargetsResult(primary={r: {"batch_mismatch_rate": p["mismatch_rate"], "errors": p["errors"]}
                                  for r, p in primary.items()},
                         prompts=len(prompts), max_tokens=spec.max_tokens, targets=outcomes, gates=verdicts)
