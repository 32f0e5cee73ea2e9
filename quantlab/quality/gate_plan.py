"""What the quality gates can tell before any engine starts (the planner over every gated
pass/fail comparison): the dry run's lines, the preflight's one-line summary."""

from __future__ import annotations

import math
from typing import Any

from quantlab.core.stage_context import StageContext
from quantlab.core.errors import CheckError
from quantlab.quality.suites import Suite
from quantlab.quality import gates as quality_gates
from quantlab.quality.compare import POOLED_SCOPE, TRANSFORMS, paired_values
from quantlab.recipe.quality import QualitySpec
from quantlab.quality.samples import look_rule, task_samples
from quantlab.quality.work import baseline_folder, cache_parts, measured_discordance, runnable, suites_of


def plan(ctx: StageContext) -> list[str]:
    """`--dry-run`: what each gated pass/fail task and slice can tell with its items
    (quality/planner.py; perplexity-type tasks depend on their per-sample spread). The
    baseline's scores come from its cached results where there are some, else from a
    stated assumption."""
    from quantlab.quality.planner import ASSUMED_DISCORDANCE, ASSUMED_SCORE, POWER

    plans, cached = gate_plans(ctx)
    source = (f"the baseline's own scores from its cached results where known (else {ASSUMED_SCORE:.0%})"
              if cached else f"an assumed baseline score of {ASSUMED_SCORE:.0%} (no cached baseline results yet)")
    spec: QualitySpec = ctx.recipe.quality
    looks = (f"; evaluated until decided (samples: auto, looks from {spec.sequential.first} samples x "
             f"{spec.sequential.growth:g}): each task's chances over its looks at the boundary's levels, slices and "
             "the pooled gate at a Bonferroni share of the looks" if spec.samples == "auto" else "")
    measured, why = measured_discordance(ctx)
    discord = (f"{measured:.1%} of answers changing between two servers of the same model ({why})" if measured
               is not None else f"{ASSUMED_DISCORDANCE:.0%} of answers changing between two servers of the same "
               f"model, assumed ({why})")
    lines = [f"quality gates, planned: {len(plans)} gated pass/fail comparisons; {source}, and {discord} (drops "
             f"are shares of all items){looks}"]
    lines += [p.line() for p in plans]
    required, chance, weak = _run_chance(plans)
    if required:
        lines.append(f"all {required} required comparisons pass for an unchanged model with probability about "
                     f"{chance:.0%} (if independent)")
    if weak:
        lines.append(f"cannot decide at this size ({len(weak)}: P(release | unchanged) < {POWER:.0%}): "
                     f"{', '.join(weak)}; release.policy.underpowered: error refuses such a run")
    return lines


def _run_chance(plans: list[Any]) -> tuple[int, float, list[str]]:
    """(required comparisons, the chance an unchanged model passes all of them if they were
    independent, those that cannot decide)."""
    required = [p for p in plans if p.required and p.margin is not None]
    return (len(required), math.prod(p.p_release_unchanged for p in required),
            [p.scope for p in required if p.underpowered])


def plan_summary(plans: list[Any], discordance: float | None = None) -> str:
    """One line: how likely an unchanged model passes every required comparison (at the
    discordance the plans were made at: the host's measured one, else the assumed 5%), and
    which cannot decide."""
    from quantlab.quality.planner import ASSUMED_DISCORDANCE

    required, chance, weak = _run_chance(plans)
    if not required:
        return "no required pass/fail comparison"
    measured = "measured" if discordance is not None else "assumed"
    line = (f"{required} required pass/fail comparisons; an unchanged model passes all of them about "
            f"{chance:.0%} of the time at {discordance or ASSUMED_DISCORDANCE:.1%} discordance ({measured})")
    return line + (f"; cannot decide with their items: {', '.join(weak)}" if weak else "")


def gate_plans(ctx: StageContext) -> tuple[list[Any], bool]:
    """The planner's view of every gated pass/fail comparison (tasks, then pooled slices),
    and whether the baseline's scores came from its cache."""
    from quantlab.quality.planner import ASSUMED_DISCORDANCE, ASSUMED_SCORE, plan_gate
    from quantlab.core.verdicts import not_shown_rule

    spec: QualitySpec = ctx.recipe.quality
    rules = ctx.recipe.release.policy  # the recipe's words; the decision reads them the same way
    work, _ = runnable(suites_of(ctx), ctx.recipe_max_model_len())
    scores = _cached_baseline_scores(ctx, work)
    sized, ungated = [], set()  # a task whose own gates are disabled still counts in its slice and the pool
    for suite, task in work:
        sample = task_samples(spec, suite, task)
        override = spec.task_gates.get(task.task)
        if not sample.counted or task.metric in TRANSFORMS or not task.gated:
            continue
        sized.append((task, sample.items))
        if override and override.disabled:
            ungated.add(task.task)
    slices: dict[str, int] = {}
    for task, n in sized:
        slices[task.slice] = slices.get(task.slice, 0) + n
    pooled_slices = {name: n for name, n in slices.items()
                     if sum(1 for t, _ in sized if t.slice == name) >= 2 and not (
                         spec.slice_gates.get(name) and spec.slice_gates[name].disabled)}
    everything = sum(n for _, n in sized) if spec.pooled is not None and len(sized) >= 2 else 0
    family = len(sized) - len(ungated) + len(pooled_slices) + (1 if everything else 0)

    def required(scope: str) -> bool:
        return not_shown_rule(quality_gates.CHECK, "non_inferiority", scope, default=rules.not_shown,
                              checks=rules.checks, gates=rules.gates) == "block"

    looks, looked = _looks(spec)
    measured, _ = measured_discordance(ctx)  # this host's batch floor, where enough is measured
    d = measured if measured is not None else ASSUMED_DISCORDANCE
    plans = [plan_gate(task.task, n, quality_gates.task_gates(spec, task.task, task.slice), family,
                       score=scores.get(task.task, ASSUMED_SCORE), required=required(task.task), looks=looks,
                       discordance=d)
             for task, n in sized if task.task not in ungated]
    for name, n in sorted(pooled_slices.items()):
        members = [(t, m) for t, m in sized if t.slice == name]
        score = sum(scores.get(t.task, ASSUMED_SCORE) * m for t, m in members) / max(1, sum(m for _, m in members))
        plans.append(plan_gate(f"slice:{name}", n, looked(quality_gates.slice_gates(spec, name), members), family,
                               score=score, required=required(f"slice:{name}"), discordance=d))
    if everything:
        score = sum(scores.get(t.task, ASSUMED_SCORE) * m for t, m in sized) / everything
        plans.append(plan_gate(POOLED_SCOPE, everything, looked(quality_gates.pooled_gates(spec), sized), family,
                               score=score, required=required(POOLED_SCOPE), discordance=d))
    return plans, bool(scores)


def _looks(spec: QualitySpec):
    """`samples: auto`: (the looks at n items, quality/samples.look_rule; the pooled gates'
    confidence split over the most looks of a member task, as quality/pairing.py judges
    them); else (None, the gates unchanged). Slices and the pooled gate are planned at all
    their items: their members stay open while they are undecided."""
    from quantlab.quality.sequential import look_confidence

    rule = look_rule(spec)
    if rule is None:
        return None, lambda gates, members: gates

    def looked(gates: Any, members: list[tuple[Any, int]]) -> Any:
        most = max([len(rule(m)) for _, m in members] or [1])
        return gates.model_copy(update={"confidence": look_confidence(gates.confidence, most)})

    return rule, looked


def _cached_baseline_scores(ctx: StageContext, work: list[tuple[Suite, Any]]) -> dict[str, float]:
    """Each task's baseline score from the baseline's cached per-sample results (the
    served length this recipe asks for), or {} when nothing is cached."""
    spec: QualitySpec = ctx.recipe.quality
    if not spec.baseline_cache:
        return {}
    from quantlab.quality.lmeval import read_samples

    def parts() -> dict[str, Any]:
        # before the quantize stage (a dry run) the plan is the one predicted from the recipe
        ready = (ctx.checkpoint_dir / "config.json").is_file()
        return cache_parts(ctx, suites_of(ctx), [t.task for _, t in work], ctx.serving_plan(predicted=not ready))

    folder = baseline_folder(parts)  # or an entry holding these tasks among more
    if folder is None:
        return {}
    scores = {}
    for _, task in work:
        try:
            rows, _ = read_samples(folder, task.task)
            _, values, _ = paired_values(task.task, task.metric, task.filter, rows, rows)
        except (OSError, ValueError, KeyError, CheckError):
            continue
        finite = [float(v) for v in values if isinstance(v, (int, float))]
        if finite:
            scores[task.task] = sum(finite) / len(finite)
    return scores
