"""Several candidates against one baseline in one run: `quantlab run a.yaml b.yaml ...`.

Each recipe is a candidate with its own run folder (runs/compare/<id>/candidates/<name>/
<run id>/: the same record, report and signed manifest as a single run). What is shared:
- one baseline server, started once beside every candidate's (all up at once);
- the baseline's quality and stability results (computed for the first candidate and
  taken from the result cache by the others, as their keys are equal);
- the baseline's performance blocks: the load is measured B, C1, C2, ..., B, ..., C2, C1
  (`pipeline/candidates/shared_performance.py`), every candidate paired with the baseline block of its sweep.
Each candidate is one pipeline/candidate_run.CandidateRun, as a single run is: the
comparison runs slices of its stages (pipeline/stages.STAGES) over the members, in the
order above, and makes each member's shared-load record through it.
Each candidate is then judged by its own recipe's gates and `decide`, and the recipe's
`selection` rule chooses among the released ones (`pipeline/candidates/select.py`). The
comparison's table, JSON and JUnit land in the comparison folder.

A candidate is a recipe (quantized, or its checkpoint taken from the cache) or an
existing checkpoint folder judged by a recipe's checks (`--checkpoint NAME=DIR`).

Candidates that cannot all be up at once are served in groups beside the one baseline
(`selection.at_once`, or fewer where this host's memory says so): each group's load is
its own interleaved sweep, and every performance record names the servers measured
together. With `serve.side_by_side: false` one server runs at a time: each candidate
is run in turn as a single run is (the baseline restarted for each, its results from
the cache), with no shared sweep.

A candidate refused by its preflight (a scheme this host cannot serve) is left out
before any work unless `selection.unservable` is `stop`; a candidate whose server dies
or whose stage fails is failed alone: the others are still judged, and the record says so.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from quantlab.pipeline.candidates.select import choose
from quantlab.recipe.family import Family
from quantlab.recipe.selection import SelectionSpec
from quantlab.core.progress import Progress
from quantlab.core.errors import EngineError, RecipeError
from quantlab.core.fsutil import safetensors_bytes
from quantlab.pipeline.candidate_run import CandidateRun, Clock, start_clock
from quantlab.pipeline.stage_run import StageClock
from quantlab.recipe.file import LoadedRecipe
from quantlab.performance import stage as perf_stage
from quantlab.release import stage as release_stage
from quantlab.pipeline.candidates.members import (CANDIDATES_DIR, Candidate, Comparison, candidates_of,
                                                  check_comparable, create_folder, selection_of)
from quantlab.pipeline.candidates.conclusion import conclude, summary_rows
from quantlab.pipeline.candidates.servers import HeldBaseline, baseline_key, start_baseline, start_candidates


def run_comparison(recipes: list[Path | LoadedRecipe], runs_root: Path, *,
                   checkpoints: dict[str, Path] | None = None, judge_by: Path | None = None,
                   progress: Progress = print, verbose: bool = False, allow_single: bool = False,
                   family: Family | None = None, held: HeldBaseline | None = None) -> Comparison:
    """`recipes` and the existing `checkpoints` (name -> folder, judged by `judge_by` or the
    first recipe) as candidates against one baseline. `allow_single`: one candidate is a
    comparison too (a search's last rounds). `family`: the candidates' alpha is spent over
    it (a search's trials); by default over this comparison's candidates. `held`: a baseline
    server kept up across comparisons (a search's rounds): reused when up, left up at the end."""
    clock = start_clock()
    cands = candidates_of(recipes, checkpoints, judge_by)
    check_comparable(cands, minimum=1 if allow_single else 2)
    loaded = [c.loaded for c in cands]
    selection = selection_of(loaded)
    folder = create_folder(runs_root, cands)
    progress(f"comparison of {len(cands)} candidates: {folder}")
    for c in cands:  # preflights judge by the whole comparison's family (a refused one shrinks it below)
        _prepare(c, folder, progress, verbose, selection, family or comparison_family(cands, folder))
    active = [c for c in cands if c.active]
    judged_together(active, family or comparison_family(active, folder), progress)
    _check_one_baseline(active)
    baseline = None
    try:
        if active:
            for c in active:  # quantize, or take in the existing checkpoint: read-only through the checks
                _each([c], c.ctx.stages[:1])
            still = [c for c in cands if c.active]
            if still and not still[0].loaded.recipe.serve.side_by_side:
                _in_turn(still)
            elif still:
                baseline = _in_groups(folder, still, selection, progress, held)
    except BaseException as err:  # the baseline failed, or Ctrl-C: no candidate can be judged
        for c in cands:
            if c.lifecycle is not None and c.run.record.status == "running":
                c.lifecycle.end(err)
        raise
    finally:
        for c in cands:
            if c.lifecycle is not None:
                c.lifecycle.close()
        if baseline is not None and held is None:
            baseline.stop()
    choose_then_release(cands, selection)
    for c in cands:
        finish_candidate(c, clock)
    return conclude(folder, cands, selection, progress)


def _in_groups(folder: Path, active: list[Candidate], selection: SelectionSpec, progress: Progress,
               held: HeldBaseline | None = None):
    """The baseline up throughout; the candidates in groups as many as may be up beside
    it, each group's checks and one interleaved load. Returns the baseline server."""
    groups = _groups(active, selection, progress)
    slots = 1 + max(len(g) for g in groups)  # engines up at once: the baseline and a group
    key = baseline_key(active[0].ctx.serving_plan())
    if held is not None:
        slots = max(slots, held.at_least)
    reused = held is not None and held.usable(slots, key)
    if reused:
        baseline, slots = held.server, held.slots  # the candidates bound beside it as it was bound
        progress("the baseline server of the previous round is still up: reused (its answers cached)")
    else:
        if held is not None:
            held.stop()  # gone, or bound for fewer engines than this round's
        baseline = start_baseline(folder, active[0], progress, slots)
        if held is not None:
            held.server, held.slots, held.launched = baseline, slots, key
    try:
        for n, group in enumerate(groups, 1):
            if len(groups) > 1:
                progress(f"candidates group {n} of {len(groups)}: {', '.join(c.name for c in group)} "
                         "(beside the baseline)")
            start_candidates(baseline, group, progress, slots, first=n == 1 and not reused)
            for segment in segments(check_stages(group[0].ctx.stages)):
                if segment == [perf_stage]:  # one interleaved load over the group and the baseline
                    _shared_performance([c for c in group if c.active], progress)
                else:  # each candidate in turn runs the segment (serve and quality; stability and targets)
                    _each([c for c in group if c.active], segment)
            if n < len(groups):
                for c in group:
                    c.ctx.close_engines()  # its own server; the baseline stays up for the next group
    except BaseException:
        baseline.stop()  # the caller never got it to stop
        if held is not None:
            held.server = None
        raise
    return baseline


def _in_turn(active: list[Candidate]) -> None:
    """serve.side_by_side false: one server at a time, so each candidate is checked as a
    single run checks it (its servers started and stopped by its own stages; the
    baseline's quality and stability results come from the result cache after the first)."""
    for c in active:
        _each([c], check_stages(c.ctx.stages))
        c.ctx.close_engines()


def check_stages(stages: list[ModuleType]) -> list[ModuleType]:
    """What a comparison runs between making each checkpoint and the decision: the run's
    stages in their order, the first (quantize, or take in a checkpoint) and the release
    aside, so a stage added to STAGES runs here as it does in a single run."""
    return [s for s in stages[1:] if s is not release_stage]


def segments(stages: list[ModuleType]) -> list[list[ModuleType]]:
    """The stages cut at the performance stage: [before], [performance], [after], empty ones left out."""
    out: list[list[ModuleType]] = [[]]
    for stage in stages:
        if stage is perf_stage:
            out += [[stage], []]
        else:
            out[-1].append(stage)
    return [segment for segment in out if segment]


def _groups(active: list[Candidate], selection: SelectionSpec, progress: Progress) -> list[list[Candidate]]:
    """`selection.at_once` candidates a group (default all), fewer where this host's memory
    cannot hold them (CPU: weights + KV space + the engine's own ~3 GiB per server,
    against the memory available now)."""
    from quantlab.pipeline.candidates.schedule import serving_groups

    by_name = {c.name: c for c in active}
    fits, note = _memory_fit(active)
    try:
        groups = serving_groups(list(by_name), selection.at_once, fits)
    except ValueError:
        raise RecipeError(f"this host's memory cannot hold the baseline and one candidate at once ({note}): set "
                          "serve.side_by_side: false to serve one at a time",
                          file=str(active[0].loaded.path), field="serve.side_by_side") from None
    wanted = min(selection.at_once or len(active), len(active))
    if len(groups[0]) < wanted:
        progress(f"serving {len(groups[0])} candidate(s) at a time beside the baseline, not {wanted}: {note}")
    return [[by_name[n] for n in g] for g in groups]


# an idle vLLM CPU server of a 135M model peaks at ~4.3 GB RSS with 1 GiB of KV space and
# ~0.27 GB of weights (measured, Intel Xeon): the rest is the engine's own processes
ENGINE_OVERHEAD_BYTES = 3 * 2**30


def _memory_fit(active: list[Candidate]) -> tuple[int | None, str]:
    """(how many candidates fit beside the baseline in the memory available now, None where
    unknown: a GPU, or servers launched elsewhere; the figures, said)."""
    plan = active[0].ctx.serving_plan()
    if plan.device != "cpu" or plan.spec.mode != "launch":  # a command or endpoint may run elsewhere
        return None, "memory not estimated"
    import psutil

    kv = int(plan.spec.cpu_kv_cache_space_gib * 2**30)
    baseline = safetensors_bytes(active[0].ctx.baseline_model().path) + kv + ENGINE_OVERHEAD_BYTES
    candidate = max(safetensors_bytes(c.ctx.checkpoint_dir) for c in active) + kv + ENGINE_OVERHEAD_BYTES
    available = psutil.virtual_memory().available
    note = (f"{available / 2**30:.1f} GiB available; the baseline's server needs ~{baseline / 2**30:.1f} GiB, a "
            f"candidate's ~{candidate / 2**30:.1f} GiB (weights + KV space + the engine's own ~3 GiB)")
    return max(0, int((available - baseline) // candidate)), note


def comparison_family(cands: list[Candidate], folder: Path) -> Family:
    """A comparison's candidates as one family (recipe/family.py)."""
    return Family(size=max(1, len(cands)), members=tuple(c.name for c in cands), kind="comparison", id=folder.name)


def judged_together(active: list[Candidate], family: Family, progress: Progress) -> None:
    """Every candidate judged as a member of `family`, said once; then each one's gate set
    registered and signed (release/registration.py), before any engine starts."""
    for c in active:
        c.lifecycle.register(family)
    if family.size > 1 and active:
        q = active[0].ctx.recipe.quality
        progress(f"family of {family.size} {'trials' if family.kind == 'search' else 'candidates'} judged on the "
                 f"same items: every interval gate at confidence 1 - (1 - c) / {family.size}"
                 + (f" (quality's {q.gates.confidence:.4f})" if q is not None else ""))


def _prepare(c: Candidate, folder: Path, progress: Progress, verbose: bool, selection: SelectionSpec,
             family: Family) -> None:
    """Its run folder, then every preflight of its stages (before any work starts). The shared
    baseline is up whatever the cache holds."""
    c.lifecycle = CandidateRun.create(c.loaded, folder / CANDIDATES_DIR, progress, verbose=verbose,
                                      checkpoint=c.checkpoint, family=family, shared_baseline=True)
    try:
        c.lifecycle.plan()
        c.lifecycle.preflight()
    except RecipeError as err:
        if selection.unservable == "stop":
            raise
        c.refused = f"refused by its preflight: {err}"
        progress(f"candidate {c.name}: {c.refused}; the others go on (selection.unservable: skip)")
        c.lifecycle.end(err)


def _check_one_baseline(active: list[Candidate]) -> None:
    paths = {c.name: c.ctx.baseline_model().path for c in active}
    if len(set(paths.values())) > 1:
        raise RecipeError("the candidates resolve to different baseline models: "
                          + ", ".join(f"{n}: {p}" for n, p in paths.items()) + "; compare candidates of one model")


def _each(cands: list[Candidate], stages: list[ModuleType]) -> None:
    """Run these stages for each candidate still in; a failure fails that candidate only."""
    for c in cands:
        if c.active:
            c.lifecycle.run_stages(stages, **_as_member(c))


def _as_member(c: Candidate) -> dict:
    """How a comparison's member runs its stages: said by its name, failed alone."""
    return {"member": c.name, "failed": lambda name, err: _fail(c, f"stage {name} failed: {err}")}


def _fail(c: Candidate, why: str) -> None:
    c.failed = why
    c.ctx.progress(f"candidate {c.name}: {why.splitlines()[0]}; the others go on")
    c.ctx.close_engines()  # its own server; the shared baseline is not its to stop


def _shared_performance(active: list[Candidate], progress: Progress) -> None:
    """One interleaved sweep over the candidates still in; a candidate whose server died
    is failed and the sweep measured again without it."""
    from quantlab.pipeline.candidates.shared_performance import run_shared

    todo = [c for c in active if c.lifecycle.due(perf_stage)]
    while todo:
        clock = StageClock.start()
        for c in todo:
            c.lifecycle.begin_stage()
        try:
            results = run_shared({c.name: c.ctx for c in todo})
        except EngineError as err:
            dead = [c for c in todo if not _alive(c.ctx.engine_if_running("candidate"))]
            if not dead:  # the baseline (or the load itself) failed: nobody can be judged
                for c in todo:
                    c.lifecycle.record_stage(perf_stage, clock, "failed", error=str(err))
                    c.failed = f"performance failed: {err}"
                return
            for c in dead:
                c.lifecycle.record_stage(perf_stage, clock, "failed",
                                         error=f"its server died during the shared load: {err}")
                _fail(c, "its server died during the shared performance load")
            todo = [c for c in todo if c.active]
            progress(f"performance: measuring again without {', '.join(c.name for c in dead)}")
            continue
        for c in todo:
            c.lifecycle.record_stage(perf_stage, clock, "ok", result=results[c.name])
        return


def _alive(server) -> bool:
    return server is not None and (server.proc is None or server.proc.poll() is None)


def choose_then_release(cands: list[Candidate], selection: SelectionSpec) -> None:
    """Each candidate's decision, the choice among them, then each one's release stage:
    its signed manifest records whether it was chosen, why, and every candidate's row."""
    judged = [c for c in cands if c.run is not None and c.refused is None]
    if not judged:
        return
    pairs = summary_rows(judged, decide=True)
    choice = choose([s for s, _ in pairs], selection)
    rows = [row for _, row in pairs]
    for c in [c for c in cands if c.active]:
        c.lifecycle.release({"chosen": choice.chosen == c.name, "chosen_candidate": choice.chosen,
                             "rule": selection.rule, "why": choice.why, "lost": choice.lost.get(c.name),
                             "candidates": rows, "refused": {x.name: x.refused for x in cands if x.refused}},
                            **_as_member(c))


def finish_candidate(c: Candidate, clock: Clock) -> None:
    """The candidate's record status and reports, as a single run leaves them."""
    if c.lifecycle is not None:
        c.lifecycle.finish(clock, c.lifecycle.decide() if c.active else None)


