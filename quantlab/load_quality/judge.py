"""The load_quality stage's plan and judgement (a stage helper): how many documents a point is
judged on (sized with this host's measured batch noise floor where the cache has one), and
the evaluations turned into gates, accuracies, correct-answer goodput and the floor, which is
stored for later runs and the quality planner."""

from __future__ import annotations

from typing import Any

from quantlab.core.roles import ROLES
from quantlab.core.results import LoadQualityLevel, LoadQualityPoint, LoadQualityResult, LoadQualityRole
from quantlab.core.stage_context import StageContext
from quantlab.load_quality import gates as lq_gates
from quantlab.load_quality.answers import RunAnswers
from quantlab.load_quality.evaluate import Load
from quantlab.load_quality.goodput import correct_goodput
from quantlab.load_quality.slice import planned_items
from quantlab.load_quality.work import C1, SliceWork
from quantlab.quality import batch_floor
from quantlab.quality.planner import ASSUMED_DISCORDANCE
from quantlab.quality.work import floor_parts, measured_discordance
from quantlab.quality.samples import Docs


def discordance(ctx: StageContext) -> tuple[float, str]:
    """The discordance the plan sizes on: this host's measured batch noise floor for the baseline
    (quality/work.measured_discordance), else the planner's assumption."""
    measured, why = measured_discordance(ctx)
    if measured is None:
        return ASSUMED_DISCORDANCE, f"discordance {ASSUMED_DISCORDANCE:.0%} assumed ({why})"
    return max(measured, 0.005), f"discordance from {why}"


def planned(ctx: StageContext, sliced: SliceWork) -> tuple[int, str]:
    """How many paired documents a point is judged on, out of what `sliced` has, and why."""
    d, source = discordance(ctx)
    n, line = planned_items(ctx.recipe.load_quality, d, available=sum(sliced.available.values()))
    return n, f"{line}; {source}"


def slice_keys(docs: dict[str, Docs]) -> tuple[tuple[str, int], ...]:
    """Every document of the slice as (task, doc id): lm-eval numbers a task's documents from 0."""
    return tuple((task, i) for task, d in docs.items() for i in range(d.start, d.stop or d.start))


def _level(ctx: StageContext, keys: tuple, got: RunAnswers, seconds: float | None) -> LoadQualityLevel:
    perf = ctx.recipe.performance
    counts = lq_gates.level_counts(keys, got.correct)
    timed = {doc: [r.as_request_record(i) for i, r in enumerate(recs)] for doc, recs in got.records.items()}
    good = correct_goodput(got.correct, timed, perf.slo.model_dump(), got.busy_s, perf.price_per_hour,
                           documents=len(keys))
    return LoadQualityLevel(accuracy=counts.accuracy, correct=counts.correct, documents=counts.documents,
                            answered=counts.answered, unscored=counts.unscored, seconds=seconds,
                            goodput=good.as_dict())


def result(ctx: StageContext, points: list[tuple[str, Load]], answers: dict[tuple[str, str], RunAnswers], *,
           docs: dict[str, Docs], seconds: dict[str, float], plan_line: str, n: int,
           evaluated: dict[tuple[str, str], float], raw: dict[str, list[str]]) -> LoadQualityResult:
    spec = ctx.recipe.load_quality
    keys = slice_keys(docs)
    notes: list[str] = []
    judged, shown = [], []
    for workload, load in points:
        at = C1.name if load.concurrency == 1 else load.name
        judged.append(lq_gates.PointAnswers(
            point=load.name, docs=keys, load={role: answers[(role, at)].correct for role in ROLES},
            c1={role: answers[(role, C1.name)].correct for role in ROLES}, concurrency=load.concurrency,
            rate=load.rate))
        roles = {}
        for role in ROLES:
            got = answers[(role, at)]
            flips = None if at == C1.name else lq_gates.flip_rate(answers[(role, C1.name)].correct, got.correct)
            if flips is not None:
                _store_floor(ctx, role, load, flips, notes)
            roles[role] = LoadQualityRole(load=_level(ctx, keys, got, evaluated.get((role, at))),
                                          c1=_level(ctx, keys, answers[(role, C1.name)],
                                                    evaluated.get((role, C1.name))),
                                          flips=flips.as_dict() if flips is not None else None)
        shown.append(LoadQualityPoint(name=load.name, workload=workload, point=load.name.split("/", 1)[1],
                                      concurrency=load.concurrency, rate=load.rate, roles=roles,
                                      raw_files=raw.get(at, [])))
    notes += _join_notes(answers) + _load_notes(points, answers)
    floors = {}
    for role in ROLES:
        parts = floor_parts(ctx, role)
        pooled = batch_floor.floor_for(parts) if parts else None
        if pooled is not None:
            floors[role] = pooled.as_dict()
    d, _ = discordance(ctx)
    return LoadQualityResult(points=shown, tasks=sorted(docs), items={t: d_.size or 0 for t, d_ in docs.items()},
                             plan=[plan_line], discordance=d, floor=floors, seconds=seconds,
                             raw_files=sorted({f for files in raw.values() for f in files}),
                             lm_eval_version=next((a.lm_eval for a in answers.values() if a.lm_eval), None),
                             gates=lq_gates.verdicts(spec, judged), notes=notes)


def _store_floor(ctx: StageContext, role: str, load: Load, flips: Any, notes: list[str]) -> None:
    parts = floor_parts(ctx, role)
    if parts is None or not flips.n:
        return
    try:
        batch_floor.record(parts, batch_floor.point_label(load.concurrency, load.rate), run_id=ctx.run.record.run_id,
                           role=role, k=flips.k, n=flips.n)
    except OSError as err:
        notes.append(f"batch floor: {role} at {load.name} could not be stored ({err})")


def _load_notes(points: list[tuple[str, Load]], answers: dict[tuple[str, str], RunAnswers]) -> list[str]:
    """The load each closed-loop point reached: the median of the requests in flight as each was
    sent (lm-eval runs one task at a time, so each task's last requests go at less)."""
    notes = []
    for _, load in points:
        if load.concurrency and load.concurrency > 1:
            reached = {role: answers[(role, load.name)].in_flight for role in ROLES}
            notes.append(f"{load.name}: a median of " + ", ".join(
                f"{'-' if v is None else f'{v:g}'} ({role})" for role, v in reached.items())
                + f" requests in flight as each was sent, of {load.concurrency}")
    return notes


def _join_notes(answers: dict[tuple[str, str], RunAnswers]) -> list[str]:
    """What did not join cleanly between lm-eval's rows and the shaper's records (each should be 0)."""
    notes = []
    for (role, level), got in sorted(answers.items()):
        if got.failed:
            notes.append(f"{role} at {level}: {got.failed} document(s) had a request that failed, timed out or was "
                         "asked again (lm-eval retried): unscored, so wrong for the candidate and left out for a "
                         f"reference; see its requests.jsonl")
        if got.unmatched_records or got.untimed:
            notes.append(f"{role} at {level}: {got.unmatched_records} request(s) matched no document and "
                         f"{got.untimed} document(s) had no timed request (they count as outside the SLOs)")
        for task, k in sorted(got.not_binary.items()):
            notes.append(f"{role} at {level}: {k} answer(s) of {task} scored neither 0 nor 1 (unscored: wrong for "
                         "the candidate, left out for a reference)")
    return notes

