"""Several candidates against one baseline in one run: `quantlab run a.yaml b.yaml ...`.

Each recipe is a candidate with its own run folder (runs/compare/<id>/candidates/<name>/
<run id>/: the same record, report and signed manifest as a single run). What is shared:
- one baseline server, started once beside every candidate's (all up at once);
- the baseline's quality and stability results (computed for the first candidate and
  taken from the result cache by the others, as their keys are equal);
- the baseline's performance blocks: the load is measured B, C1, C2, ..., B, ..., C2, C1
  (`performance/shared_stage.py`), every candidate paired with the baseline block of its sweep.
Each candidate is then judged by its own recipe's gates and `decide`, and the recipe's
`selection` rule chooses among the released ones (`candidates/select.py`). The
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

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from quantlab.pipeline.candidates.select import Choice, choose
from quantlab.recipe.selection import SelectionSpec
from quantlab.pipeline.candidates.summary import on_common_baseline, summarize
from quantlab.pipeline.candidates.table import as_json, html, markdown
from quantlab.core.digest import inputs_hash
from quantlab.core.progress import Progress
from quantlab.pipeline.context import RunContext
from quantlab.reports.stage_plots import draw as draw_plots
from quantlab.core.engine_time import engine_seconds
from quantlab.core.errors import EngineError, QuantlabError, RecipeError
from quantlab.core.fsutil import safetensors_bytes, write_json_atomic, write_text_atomic
from quantlab.core.layout import SERVE_LOG_DIR
from quantlab.pipeline.loop import (STAGES, VALIDATE_STAGES, _run_stage, _save_with_time, enabled,
                                    stages_to_run)
from quantlab.recipe.file import LoadedRecipe, load_recipe
from quantlab.core.run import RunDir, StageRecord, new_run_folder, now_iso
from quantlab.performance import stage as perf_stage
from quantlab.quality import stage as quality_stage
from quantlab.release import stage as release_stage
from quantlab.serving import stage as serve_stage
from quantlab.serving.cpu_cores import engine_bind
from quantlab.stability import stage as stability_stage
from quantlab.targets import stage as targets_stage

COMPARE_DIR = "compare"  # under the runs root: compare/<id>/
CANDIDATES_DIR = "candidates"
RESULT_FILE = "comparison.json"
# recipe sections that must be equal: one baseline, served and loaded the same way for all
SHARED_SECTIONS = ("serve", "performance")
# what each candidate may set for itself in its serve section (mode 'endpoint': where it is served)
CANDIDATE_SERVE_FIELDS = ("candidate_endpoint", "candidate_served_model_name")


@dataclass
class Candidate:
    name: str
    loaded: LoadedRecipe
    checkpoint: Path | None = None  # an existing checkpoint (validated, not quantized)
    run: RunDir | None = None
    ctx: RunContext | None = None
    todo: dict[str, str] = field(default_factory=dict)
    refused: str | None = None  # by its preflight, before any work
    failed: str | None = None  # a stage failed or its server died; the others go on

    @property
    def active(self) -> bool:
        return self.refused is None and self.failed is None

    @property
    def origin(self) -> str:
        return f"checkpoint {self.checkpoint}" if self.checkpoint is not None else str(self.loaded.path)


def candidates_of(recipes: list[Path | LoadedRecipe], checkpoints: dict[str, Path] | None = None,
                  judge_by: Path | None = None) -> list[Candidate]:
    """Each recipe (a file, or one already loaded) a candidate, then each existing
    checkpoint, judged by `judge_by` (the first recipe by default): its checks, baseline
    and serving, under the checkpoint's name."""
    cands = [Candidate(lr.recipe.name, lr) for lr in (r if isinstance(r, LoadedRecipe) else load_recipe(r)
                                                      for r in recipes)]
    if checkpoints:
        judge_file = judge_by or (recipes[0] if recipes else None)
        if judge_file is None:
            raise RecipeError("existing checkpoints are judged by a recipe's checks: pass one")
        judge = judge_file if isinstance(judge_file, LoadedRecipe) else load_recipe(judge_file)
        for name, folder in checkpoints.items():
            if not Path(folder).is_dir():
                raise RecipeError(f"checkpoint candidate '{name}': {folder} is not a folder; pass a checkpoint "
                                  "folder (config.json and safetensors) as --checkpoint NAME=DIR")
            cands.append(Candidate(name, _renamed(judge, name), checkpoint=Path(folder)))
    return cands


def _renamed(judge: LoadedRecipe, name: str) -> LoadedRecipe:
    """The judging recipe under a checkpoint candidate's name (its run folder and row)."""
    try:
        return judge.variant(name)
    except ValueError:
        raise RecipeError(f"checkpoint candidate name '{name}' is not a valid name (lower-case letters, digits, "
                          "'.', '_', '-'; at most 64): give one as --checkpoint NAME=DIR", field="--checkpoint") \
            from None


@dataclass
class Comparison:
    folder: Path
    candidates: list[Candidate]
    choice: Choice | None
    table_md: str
    exit_code: int  # 0 one chosen, 1 none released, 3 none could be judged
    data: dict[str, Any] = field(default_factory=dict)  # what comparison.json holds


def check_comparable(cands: list[Candidate], minimum: int = 2) -> None:
    """Two or more candidates that can share one baseline; RecipeError naming file and field otherwise."""
    if len(cands) < minimum:
        raise RecipeError("a comparison needs two or more candidates; for one, `quantlab run RECIPE` "
                          "(or `quantlab validate RECIPE --checkpoint DIR`)")
    seen: dict[str, str] = {}
    for c in cands:
        if c.name in seen:
            where = c.origin if c.origin != seen[c.name] else f"{c.origin}, given twice"
            raise RecipeError(f"two candidates are named '{c.name}' ({seen[c.name]} and {where}): each "
                              "candidate's run folder and row in the comparison go by its name; rename one",
                              file=str(c.loaded.path), field="name" if c.checkpoint is None else "--checkpoint")
        seen[c.name] = c.origin
    loaded = [c.loaded for c in cands]
    first = loaded[0]
    for lr in loaded:
        _check_same_host(lr)
    for lr in loaded[1:]:
        model_a = _model_identity(first)
        model_b = _model_identity(lr)
        if model_a != model_b:
            raise RecipeError(f"'{lr.recipe.name}' starts from a different model than '{first.recipe.name}' "
                              f"({model_b} against {model_a}): candidates are compared with one baseline, so they "
                              "must quantize the same model", file=str(lr.path), field="model")
        for section in SHARED_SECTIONS:
            a, b = _dump(first, section), _dump(lr, section)
            if section == "serve" and a and b:  # each candidate may be served elsewhere (its own endpoint)
                a, b = ({k: v for k, v in x.items() if k not in CANDIDATE_SERVE_FIELDS} for x in (a, b))
            if section == "performance" and (a is None or b is None):
                continue  # a candidate without one is judged on the other checks (e.g. served on another host)
            if a != b:
                diff = sorted(k for k in set(a or {}) | set(b or {}) if (a or {}).get(k) != (b or {}).get(k))
                raise RecipeError(f"'{lr.recipe.name}' has a different `{section}` section than "
                                  f"'{first.recipe.name}' (differs in: {', '.join(diff) or 'presence'}): one baseline "
                                  f"server and one paired load need one {section} section; make them equal",
                                  file=str(lr.path), field=section)
        if lr.recipe.selection is not None and first.recipe.selection is not None \
                and lr.recipe.selection != first.recipe.selection:
            raise RecipeError(f"'{lr.recipe.name}' and '{first.recipe.name}' choose by different `selection` "
                              "sections; give it in one recipe (or the same in all)", file=str(lr.path),
                              field="selection")


def _check_same_host(lr: LoadedRecipe) -> None:
    """Performance is compared only between servers on one host: a candidate served at an
    endpoint on another host than the baseline's is judged on quality and stability only."""
    spec = lr.recipe.serve
    if spec.mode != "endpoint" or lr.recipe.performance is None:
        return
    where, base = host_of(spec.candidate_endpoint or spec.endpoint), host_of(spec.endpoint)
    if where != base:
        raise RecipeError(f"'{lr.recipe.name}' is served on {where}, the baseline on {base}: performance is "
                          "compared only between servers on the same host; remove its `performance` section "
                          "(its quality and stability are still compared with the baseline's) or serve it on "
                          f"{base}", file=str(lr.path), field="performance")


def host_of(url: str) -> str:
    """The host a base URL points at; the loopback names are one host."""
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    return "localhost" if host in ("localhost", "127.0.0.1", "::1") else host


def _model_identity(lr: LoadedRecipe) -> dict[str, Any]:
    m = lr.recipe.model.model_dump(mode="json")
    source = m.get("source")
    if isinstance(source, str) and source != "default" and lr.resolve(source).exists():
        m["source"] = str(lr.resolve(source))  # relative to each recipe's own folder
    return m


def _dump(lr: LoadedRecipe, section: str) -> dict[str, Any] | None:
    value = getattr(lr.recipe, section)
    return value.model_dump(mode="json") if value is not None else None


def selection_of(loaded: list[LoadedRecipe]) -> SelectionSpec:
    return next((lr.recipe.selection for lr in loaded if lr.recipe.selection is not None), SelectionSpec())


def _create_folder(runs_root: Path, cands: list[Candidate]) -> Path:
    import hashlib

    digest = hashlib.sha256("".join(c.loaded.content_hash + c.origin for c in cands).encode()).hexdigest()
    return new_run_folder(Path(runs_root) / COMPARE_DIR, digest)


def run_comparison(recipes: list[Path | LoadedRecipe], runs_root: Path, *,
                   checkpoints: dict[str, Path] | None = None, judge_by: Path | None = None,
                   progress: Progress = print, verbose: bool = False, allow_single: bool = False) -> Comparison:
    """`recipes` and the existing `checkpoints` (name -> folder, judged by `judge_by` or the
    first recipe) as candidates against one baseline. `allow_single`: one candidate is a
    comparison too (a search's last rounds)."""
    clock = (time.perf_counter(), engine_seconds())
    cands = candidates_of(recipes, checkpoints, judge_by)
    check_comparable(cands, minimum=1 if allow_single else 2)
    loaded = [c.loaded for c in cands]
    selection = selection_of(loaded)
    folder = _create_folder(runs_root, cands)
    progress(f"comparison of {len(cands)} candidates: {folder}")
    for c in cands:
        _prepare(c, folder, progress, verbose, selection)
    active = [c for c in cands if c.active]
    _check_one_baseline(active)
    baseline = None
    try:
        if active:
            for c in active:
                _each([c], c.ctx.stages[0])  # quantize, or take in the existing checkpoint
            still = [c for c in cands if c.active]
            if still and not still[0].loaded.recipe.serve.side_by_side:
                _in_turn(still)
            elif still:
                baseline = _in_groups(folder, still, selection, progress)
    except BaseException as err:  # the baseline failed, or Ctrl-C: no candidate can be judged
        for c in cands:
            if c.run is not None and c.run.record.status == "running":
                c.run.record.status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
                c.run.save()
        raise
    finally:
        for c in cands:
            if c.ctx is not None:
                c.ctx.close_engines()
        if baseline is not None:
            baseline.stop()
    _choose_then_release(cands, selection)
    for c in cands:
        _finish(c, clock, progress)
    return _conclude(folder, cands, selection, progress)


def _in_groups(folder: Path, active: list[Candidate], selection: SelectionSpec, progress: Progress):
    """The baseline up throughout; the candidates in groups as many as may be up beside
    it, each group's checks and one interleaved load. Returns the baseline server."""
    groups = _groups(active, selection, progress)
    slots = 1 + max(len(g) for g in groups)  # engines up at once: the baseline and a group
    baseline = _start_baseline(folder, active[0], progress, slots)
    try:
        for n, group in enumerate(groups, 1):
            if len(groups) > 1:
                progress(f"candidates group {n} of {len(groups)}: {', '.join(c.name for c in group)} "
                         "(beside the baseline)")
            _start_candidates(baseline, group, progress, slots, first=n == 1)
            group = [c for c in group if c.active]
            _each(group, serve_stage, quality_stage)
            _shared_performance([c for c in group if c.active], progress)
            _each([c for c in group if c.active], stability_stage, targets_stage)
            if n < len(groups):
                for c in group:
                    c.ctx.close_engines()  # its own server; the baseline stays up for the next group
    except BaseException:
        baseline.stop()  # the caller never got it to stop
        raise
    return baseline


def _in_turn(active: list[Candidate]) -> None:
    """serve.side_by_side false: one server at a time, so each candidate is checked as a
    single run checks it (its servers started and stopped by its own stages; the
    baseline's quality and stability results come from the result cache after the first)."""
    for c in active:
        _each([c], serve_stage, quality_stage, perf_stage, stability_stage, targets_stage)
        c.ctx.close_engines()


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


def _prepare(c: Candidate, folder: Path, progress: Progress, verbose: bool, selection: SelectionSpec) -> None:
    """Its run folder, then every preflight of its stages (before any work starts)."""
    c.run = RunDir.create(c.loaded, folder / CANDIDATES_DIR)
    stages = VALIDATE_STAGES if c.checkpoint is not None else STAGES
    c.ctx = RunContext(c.loaded, c.run, progress, verbose=verbose, stages=stages, import_from=c.checkpoint)
    try:
        c.todo = stages_to_run(c.ctx)
        c.ctx.will_run = set(c.todo)
        for stage in c.ctx.stages:
            if stage.NAME in c.todo:
                stage.preflight(c.ctx)
    except RecipeError as err:
        if selection.unservable == "stop":
            raise
        c.refused = f"refused by its preflight: {err}"
        progress(f"candidate {c.name}: {c.refused}; the others go on (selection.unservable: skip)")
        c.run.record.status = "failed"
        c.run.save()
        return
    c.ctx.needs_baseline = lambda: True  # the shared baseline is up whatever the cache holds


def _check_one_baseline(active: list[Candidate]) -> None:
    paths = {c.name: c.ctx.baseline_model().path for c in active}
    if len(set(paths.values())) > 1:
        raise RecipeError("the candidates resolve to different baseline models: "
                          + ", ".join(f"{n}: {p}" for n, p in paths.items()) + "; compare candidates of one model")


def _each(cands: list[Candidate], *stages: ModuleType) -> None:
    """Run these stages for each candidate still in; a failure fails that candidate only."""
    for c in cands:
        for stage in stages:
            if not c.active or not enabled(stage, c.ctx) or stage.NAME not in c.todo:
                continue
            c.ctx.progress(f"candidate {c.name}: stage {stage.NAME}")
            try:
                _run_stage(c.ctx, stage)
            except QuantlabError as err:
                _fail(c, f"stage {stage.NAME} failed: {err}")


def _fail(c: Candidate, why: str) -> None:
    c.failed = why
    c.ctx.progress(f"candidate {c.name}: {why.splitlines()[0]}; the others go on")
    c.ctx.close_engines()  # its own server; the shared baseline is not its to stop


def _start_baseline(folder: Path, first: Candidate, progress: Progress, slots: int):
    """The shared baseline server (its log in the comparison's folder), started but not
    waited for: the first group's servers start beside it and all load at once. Each of
    the `slots` engines up at once computes on cores of its own (see cpu_cores)."""
    from quantlab.serving.vllm_server import prepare_engine

    plan = first.ctx.serving_plan()
    baseline = prepare_engine(plan, "baseline", log_dir=folder / SERVE_LOG_DIR, progress=progress,
                              cpu_bind=engine_bind(plan.device, 0, slots))
    baseline.start()
    return baseline


def _start_candidates(baseline, group: list[Candidate], progress: Progress, slots: int, *, first: bool) -> None:
    """The group's servers, started at once beside the baseline (on the first group, while
    it is still loading too); a baseline that fails to start stops the comparison, a
    candidate's fails that candidate alone."""
    from quantlab.serving.vllm_server import prepare_engine, wait_healthy

    plans = {c.name: c.ctx.serving_plan() for c in group}
    mine = {c.name: prepare_engine(plans[c.name], "candidate", log_dir=c.run.path / SERVE_LOG_DIR, progress=progress,
                                   cpu_bind=engine_bind(plans[c.name].device, 1 + i, slots))
            for i, c in enumerate(group)}
    started = []
    try:
        for server in mine.values():
            server.start()
            started.append(server)
        if first:
            wait_healthy(baseline, progress)
    except BaseException:
        for server in started:
            server.stop()
        raise
    for c in group:
        try:
            wait_healthy(mine[c.name], progress)
        except EngineError as err:
            c.failed = f"its server did not start: {err.cause or str(err).splitlines()[0]}"
            progress(f"candidate {c.name}: {c.failed}; the others go on")
            continue
        except BaseException:
            for server in mine.values():
                server.stop()
            raise
        c.ctx.adopt_engine("baseline", baseline, owned=False)
        c.ctx.adopt_engine("candidate", mine[c.name], owned=True)


def _shared_performance(active: list[Candidate], progress: Progress) -> None:
    """One interleaved sweep over the candidates still in; a candidate whose server died
    is failed and the sweep measured again without it."""
    from quantlab.pipeline.candidates.shared_performance import run_shared

    todo = [c for c in active if enabled(perf_stage, c.ctx) and perf_stage.NAME in c.todo]
    while todo:
        started, t0, e0 = now_iso(), time.perf_counter(), engine_seconds()
        for c in todo:
            c.ctx.artifacts = []
        try:
            results = run_shared({c.name: c.ctx for c in todo})
        except EngineError as err:
            dead = [c for c in todo if not _alive(c.ctx.engine_if_running("candidate"))]
            if not dead:  # the baseline (or the load itself) failed: nobody can be judged
                for c in todo:
                    _record_failed(c, perf_stage.NAME, started, t0, e0, str(err))
                    c.failed = f"performance failed: {err}"
                return
            for c in dead:
                _record_failed(c, perf_stage.NAME, started, t0, e0, f"its server died during the shared load: {err}")
                _fail(c, "its server died during the shared performance load")
            todo = [c for c in todo if c.active]
            progress(f"performance: measuring again without {', '.join(c.name for c in dead)}")
            continue
        for c in todo:
            draw_plots(perf_stage.NAME, c.ctx, results[c.name])
            c.run.put_stage(StageRecord(name=perf_stage.NAME, status="ok", started_at=started, finished_at=now_iso(),
                                        duration_s=round(time.perf_counter() - t0, 3),
                                        engine_s=round(engine_seconds() - e0, 3),
                                        inputs_sha256=inputs_hash(perf_stage.inputs(c.ctx)),
                                        artifacts=c.ctx.artifacts, result=results[c.name]))
        return


def _alive(server) -> bool:
    return server is not None and (server.proc is None or server.proc.poll() is None)


def _record_failed(c: Candidate, name: str, started: str, t0: float, e0: float, error: str) -> None:
    c.run.put_stage(StageRecord(name=name, status="failed", started_at=started, finished_at=now_iso(),
                                duration_s=round(time.perf_counter() - t0, 3), engine_s=round(engine_seconds() - e0, 3),
                                inputs_sha256=inputs_hash(perf_stage.inputs(c.ctx)), artifacts=c.ctx.artifacts,
                                error=error))


def _choose_then_release(cands: list[Candidate], selection: SelectionSpec) -> None:
    """Each candidate's decision, the choice among them, then each one's release stage:
    its signed manifest records whether it was chosen, why, and every candidate's row."""
    judged = [c for c in cands if c.run is not None and c.refused is None]
    if not judged:
        return
    pairs = _summaries(judged, decide=True)
    choice = choose([s for s, _ in pairs], selection)
    rows = [row for _, row in pairs]
    for c in [c for c in cands if c.active]:
        c.ctx.comparison = {"chosen": choice.chosen == c.name, "chosen_candidate": choice.chosen,
                            "rule": selection.rule, "why": choice.why, "lost": choice.lost.get(c.name),
                            "candidates": rows, "refused": {x.name: x.refused for x in cands if x.refused}}
        _each([c], release_stage)


def _summaries(judged: list[Candidate], *, decide: bool) -> list[tuple[Any, dict[str, Any]]]:
    """Each judged candidate's (summary, row), speed figures on its first candidate's
    baseline's scale where groups were measured apart. `decide`: before the release
    stages ran (each decision made now)."""
    pairs, baselines = [], []
    for c in judged:
        decided = release_stage.decide_run(c.ctx).record if decide and c.active else None
        summary, row = summarize(c.name, c.run.record, decided=decided)
        if c.failed:  # say why it was not judged, not only that it was not
            summary = replace(summary, failed_gates=[f"failed: {c.failed}"])
            row.update(failed=c.failed, failed_gates=summary.failed_gates)
        row["source"] = c.origin
        row["served_at"] = _served_at(c)
        perf = c.run.record.result("performance")
        row["measured_together"] = getattr(perf, "measured_together", None)
        pairs.append((summary, row))
        baselines.append(summarize("baseline", c.run.record, role="baseline")[1] if perf is not None else None)
    return on_common_baseline(pairs, baselines)


def _finish(c: Candidate, clock: tuple[float, float], progress: Progress) -> None:
    """The candidate's record status and reports, as a single run leaves them."""
    if c.run is None:
        return
    if c.active:
        decided = release_stage.decide_run(c.ctx)
        c.run.record.status = "blocked" if decided.blocked else "ok"
    elif c.run.record.status == "running":
        c.run.record.status = "failed"
    _save_with_time(c.run, clock, progress)


def _conclude(folder: Path, cands: list[Candidate], selection: SelectionSpec, progress: Progress) -> Comparison:
    """Summaries, the choice, and the comparison's files (table, JSON, JUnit)."""
    from quantlab.reports.report import render_junit

    judged = [c for c in cands if c.run is not None and c.refused is None]
    pairs = _summaries(judged, decide=False)
    summaries, rows = [s for s, _ in pairs], [row for _, row in pairs]
    baseline_row = None
    for c in judged:
        if c.run.record.result("performance") is not None or c.run.record.result("quality") is not None:
            baseline_row = summarize("baseline", c.run.record, role="baseline")[1]
            break
    choice = choose(summaries, selection) if summaries else None
    refused = {c.name: c.refused for c in cands if c.refused}
    table = markdown(baseline_row, rows, choice) if choice else "no candidate could be judged\n"
    if refused:
        table += "".join(f"- {n}: {why}\n" for n, why in refused.items())
    data = {**(as_json(baseline_row, rows, choice) if choice else {"candidates": rows, "chosen": None}),
            "refused": refused, "selection": selection.model_dump(mode="json"),
            "runs": {c.name: str(c.run.path.relative_to(folder)) for c in cands if c.run is not None}}
    write_json_atomic(folder / RESULT_FILE, data)
    write_text_atomic(folder / "comparison.md", "# Comparison\n\n" + table)
    plot = _pareto(folder, baseline_row, rows, progress)
    if choice:
        write_text_atomic(folder / "comparison.html", html(baseline_row, rows, choice, refused=refused,
                                                           plot_png=plot.read_bytes() if plot else None))
    suites = [render_junit(c.run.record) for c in judged]
    write_text_atomic(folder / "junit.xml", _junit_of(suites, {c.name for c in judged}))
    exit_code = 0 if choice and choice.chosen else (1 if summaries else 3)
    return Comparison(folder, cands, choice, table, exit_code, data)


def _served_at(c: Candidate) -> str:
    """Where its server ran: launched on this host, or the endpoint it was given."""
    spec = c.loaded.recipe.serve
    if spec.mode == "endpoint":
        return spec.candidate_endpoint or spec.endpoint or "endpoint"
    return "this host" if spec.mode == "launch" else "its serve.command"


def _pareto(folder: Path, baseline_row: dict[str, Any] | None, rows: list[dict[str, Any]],
            progress: Progress) -> Path | None:
    """The candidates' plot (the baseline at recovery 1); a plot that cannot be drawn is said, not fatal."""
    from quantlab.reports.plots import pareto

    points = ([{**baseline_row, "worst_recovery": 1.0}] if baseline_row else []) + rows
    try:
        return pareto(points, folder / "pareto.png", f"{len(rows)} candidates, one baseline")
    except (ImportError, OSError, ValueError) as err:
        progress(f"the comparison plot could not be drawn: {type(err).__name__}: {err}")
        return None


def _junit_of(documents: list[str], names: set[str]) -> str:
    """One <testsuites> with each candidate's suites (each already named by its recipe)."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites", name="quantlab comparison")
    for doc in documents:
        tree = ET.fromstring(doc)
        for suite in ([tree] if tree.tag == "testsuite" else list(tree)):
            root.append(suite)
    return ET.tostring(root, encoding="unicode")


def load_result(folder: Path) -> dict[str, Any]:
    return json.loads((Path(folder) / RESULT_FILE).read_text())
