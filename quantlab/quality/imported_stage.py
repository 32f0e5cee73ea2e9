"""Quality on imported evidence (`quantlab decide`): the baseline's and the candidate's lm-eval
sample logs, written by lm-eval on the user's own machines (`--log_samples`), read from the
run's copies (release/evidence_stage.py), refused where they cannot be paired, put in quantlab's
own sample form and judged exactly as the quality stage judges what it evaluated
(quality/judging.py): the same pairing, intervals, pooling and gates.

What a served run has and a log does not: next-token KL (the logs hold no distributions) and the
user's own traffic (quantlab generates and scores it). A recipe gating either is refused before
any work, as is `samples: auto` (the logs hold what they hold)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantlab.core.digest import json_sha256
from quantlab.core.errors import CheckError, RecipeError
from quantlab.core.evidence import EVALS, OPTION
from quantlab.core.layout import QUALITY_DIR
from quantlab.core.results import EvidenceResult, QualityResult
from quantlab.core.roles import BASELINE, CANDIDATE
from quantlab.core.stage_context import StageContext
from quantlab.quality.judging import judge, sample_artifacts, write_flips
from quantlab.quality.lmeval_logs import EvalLog, check_pairable, role_logs_once, write_quantlab_form
from quantlab.quality.work import runnable, suites_of
from quantlab.recipe.quality import QualitySpec
from quantlab.recipe.stream import CONTROLLED

NAME = "quality"
IMPORTED_NOTE = ("judged on imported lm-eval sample logs (quantlab decide): both models were evaluated outside "
                 "quantlab; their answers were paired here sample by sample")


def enabled(ctx: StageContext) -> bool:
    return ctx.recipe.quality is not None and bool(getattr(ctx, "evidence", None) and ctx.evidence.evals)


def _tasks(ctx: StageContext) -> tuple[list[tuple[Any, Any]], list[str]]:
    work, _ = runnable(suites_of(ctx), None)  # no served length: every task the recipe names is judged
    return work, [t.task for _, t in work]


def inputs(ctx: StageContext) -> dict[str, Any]:
    return {"quality": ctx.recipe.quality.model_dump(mode="json"), "suites": [s.sha256 for s in suites_of(ctx)]}


def preflight(ctx: StageContext) -> None:
    spec: QualitySpec = ctx.recipe.quality
    path = str(ctx.loaded.path)
    if spec.kl.max_mean_kl is not None or spec.kl.min_same_top_rate is not None:
        raise RecipeError("quality.kl gates need next-token distributions from both served models; lm-eval's sample "
                          "logs hold none. Remove quality.kl.max_mean_kl and min_same_top_rate for `quantlab decide`, "
                          "or run `quantlab run` / `validate`, which serve both", file=path, field="quality.kl")
    if spec.traffic:
        raise RecipeError("quality.traffic replays your own prompts through both served models and scores them in "
                          "quantlab; imported lm-eval logs cannot carry it. Remove quality.traffic for `quantlab "
                          "decide`", file=path, field="quality.traffic")
    if spec.samples == "auto":
        raise RecipeError("quality.samples: auto evaluates look by look until decided; imported logs hold the "
                          "samples they hold. Set quality.samples: all for `quantlab decide`", file=path,
                          field="quality.samples")
    try:
        _, tasks = _tasks(ctx)
    except RecipeError as err:
        raise RecipeError(str(err), file=err.file or path, field=err.field) from None
    logs = role_logs(ctx, {role: [Path(p) for p in paths] for role, paths in ctx.evidence.evals.items()}, tasks)
    check_logs(ctx, logs, tasks)


def role_logs(ctx: StageContext, paths: dict[str, list[Path]], tasks: list[str]) -> dict[str, list[EvalLog]]:
    """Each role's lm-eval outputs read for the recipe's tasks (each task in one output a role)."""
    return {role: role_logs_once(ctx, paths[role], tasks, field=OPTION[EVALS].format(role=role))
            for role in (BASELINE, CANDIDATE)}


def log_of(logs: list[EvalLog], task: str) -> EvalLog:
    return next(log for log in logs if task in log.tasks)


def check_logs(ctx: StageContext, logs: dict[str, list[EvalLog]], tasks: list[str]) -> None:
    """The roles' logs pair task by task, the baseline's are the baseline's, and each task's metric,
    filter and direction are in them."""
    for task in tasks:
        check_pairable(log_of(logs[BASELINE], task), log_of(logs[CANDIDATE], task), [task])
    for log in logs[BASELINE]:
        check_baseline_model(ctx, log)
    work, _ = _tasks(ctx)
    for suite, task in work:
        for role in (BASELINE, CANDIDATE):
            check_judged(suite, task, log_of(logs[role], task.task), role)


def check_judged(suite: Any, task: Any, log: EvalLog, role: str) -> None:
    """The recipe's metric, filter and direction for a task are in the log: refused before any work
    (exit 2) rather than failing once the decision has started."""
    got = log.tasks[task.task]
    filters = sorted({str(r.get("filter")) for r in got.rows})
    rows = [r for r in got.rows if task.filter is None or r.get("filter") == task.filter]
    where = dict(file=str(got.samples_file), field=f"{OPTION[EVALS].format(role=role)}: {task.task}")
    if not rows:
        raise RecipeError(f"task '{task.task}': the recipe judges filter '{task.filter}', the {role}'s log has "
                          f"{', '.join(filters)}: set the task's filter to one of them", **where)
    metrics = sorted((rows[0].get("metrics") or {}))
    if task.metric not in metrics:
        raise RecipeError(f"task '{task.task}': the recipe judges metric '{task.metric}', the {role}'s log has "
                          f"{', '.join(metrics) or 'none'}: set the task's metric to one of them", **where)
    if suite.directions.get(task.task) is None and (got.summary.get("higher_is_better") or {}).get(task.metric) is None:
        raise RecipeError(f"task '{task.task}': neither the suite nor the log says whether a higher "
                          f"'{task.metric}' is better: set higher_is_better on the task", **where)


def baseline_names(ctx: StageContext) -> set[str]:
    """What the baseline may be called in its evidence, exactly: the recipe's model source, or the
    name it was served under (serve.served_model_name). Never a last path part alone: another
    organisation's model of the same name is another model."""
    served = ctx.recipe.serve.served_model_name
    return {str(ctx.recipe.model.source)} | ({served} if served else set())


def check_baseline_model(ctx: StageContext, log: EvalLog) -> None:
    """A baseline log of another model judges the candidate against the wrong answers: refused
    when the log names a model the recipe does not (a log naming none is taken as it is, said
    in the record)."""
    named = log.model_name
    if named is None:
        return
    if named not in baseline_names(ctx):
        raise RecipeError(f"{log.results_file}: the baseline's lm-eval run names its model '{named}', but the recipe's "
                          f"baseline is {ctx.recipe.model.source} (served as "
                          f"{ctx.recipe.serve.served_model_name or 'its source'}): these answers are another "
                          "model's. Give the baseline's own lm-eval output, or set model.source (or "
                          "serve.served_model_name) to the model it evaluated", file=str(log.results_file),
                          field="config.model_args")


def stream_parts(ctx: StageContext, logs: list[EvalLog]) -> dict[str, Any]:
    """What makes decisions on imported logs one stream (pipeline/streams.py): the baseline as its
    log says it is (model, lm-eval version, seeds) and each task's items (lm-eval's doc, prompt
    and target hashes), never the files' bytes: a re-run of the baseline on the same items, or a
    file rewritten, stays in the same stream."""
    items = {task: sorted([str(doc), h.get("doc_hash"), h.get("prompt_hash"), h.get("target_hash")]
                          for doc, h in t.hashes.items()) for log in logs for task, t in log.tasks.items()}
    said = sorted({(log.model_name or "", log.lm_eval_version or "", json.dumps(log.seeds, sort_keys=True))
                   for log in logs})
    return {"imported_baseline": {"runs": [list(s) for s in said], "items": dict(sorted(items.items()))},
            "suites": {s.name: s.sha256 for s in suites_of(ctx)}, "seed": ctx.recipe.quality.seed, "format": 2}


def _same_stream(ctx: StageContext, logs: list[EvalLog]) -> None:
    """The copy judged is of the stream the run took its position in (the originals were read then)."""
    stream = getattr(ctx, "stream", None)
    if stream is None or stream.control != CONTROLLED or stream.key is None:
        return
    if json_sha256(stream_parts(ctx, logs))[:32] != stream.key:
        raise CheckError("the baseline's lm-eval output changed after this decision took its stream position "
                         f"({', '.join(str(log.results_file) for log in logs)}): its items are not those it was "
                         "placed by. Decide again")


def run(ctx: StageContext) -> QualityResult:
    spec: QualitySpec = ctx.recipe.quality
    suites = suites_of(ctx)
    work, tasks = _tasks(ctx)
    evidence = ctx.run.record.result("evidence")
    if not isinstance(evidence, EvidenceResult) or set(evidence.evals) != {BASELINE, CANDIDATE}:
        raise CheckError("no imported lm-eval output in this run's evidence: run it from its first stage")
    logs = role_logs(ctx, {role: [ctx.run.path / rel for rel in evidence.evals[role]]
                           for role in (BASELINE, CANDIDATE)}, tasks)
    check_logs(ctx, logs, tasks)  # the copies, as judged
    _same_stream(ctx, logs[BASELINE])
    out = ctx.run.path / QUALITY_DIR
    base_dir, cand_dir = out / BASELINE, out / CANDIDATE
    for role, folder in ((BASELINE, base_dir), (CANDIDATE, cand_dir)):
        for log in logs[role]:
            write_quantlab_form(log, folder, list(log.tasks))
    judged = judge(spec, work, [], base_dir, cand_dir)
    write_flips(out / "flips.jsonl", judged.flips)
    ctx.add_artifact(f"{QUALITY_DIR}/flips.jsonl", "quality-flips")
    raw = sample_artifacts(ctx, base_dir, cand_dir)
    return QualityResult(
        tasks=judged.comparisons, slices=judged.slice_comparisons, kl=None, baseline_cached=False,
        skipped=[], seconds={}, lm_eval_version=judged.lm_eval_version,
        suites=[{"name": s.name, "folder": str(s.folder) if s.folder else None, "sha256": s.sha256} for s in suites],
        raw_files=raw, flips_file=f"{QUALITY_DIR}/flips.jsonl", plots=[], gates=judged.gates,
        notes=[IMPORTED_NOTE] + [_said(role, log) for role in (BASELINE, CANDIDATE) for log in logs[role]],
        traffic=judged.traffic, code_sandbox=None)


def _said(role: str, log: EvalLog) -> str:
    """What the role's log says it was: model, lm-eval version, seeds (unknown where it does not say)."""
    seeds = ", ".join(f"{k} {v}" for k, v in sorted(log.seeds.items())) or "not recorded"
    return (f"{role}: lm-eval {log.lm_eval_version or 'version unknown'}, model {log.model_name or 'unknown'}, "
            f"seeds {seeds}, {OPTION[EVALS].format(role=role)} {log.results_file.name} "
            f"({', '.join(sorted(log.tasks))})")
