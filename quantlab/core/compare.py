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

A candidate refused by its preflight (a scheme this host cannot serve) is left out
before any work unless `selection.unservable` is `stop`; a candidate whose server dies
or whose stage fails is failed alone: the others are still judged, and the record says so.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from quantlab.candidates.select import Choice, choose
from quantlab.candidates.spec import SelectionSpec
from quantlab.candidates.summary import summarize
from quantlab.candidates.table import as_json, html, markdown
from quantlab.core.context import Progress, RunContext, inputs_hash
from quantlab.core.engine_time import engine_seconds
from quantlab.core.errors import EngineError, QuantlabError, RecipeError
from quantlab.core.fsutil import write_json_atomic, write_text_atomic
from quantlab.core.layout import SERVE_LOG_DIR
from quantlab.core.pipeline import STAGES, _run_stage, _save_with_time, enabled, stages_to_run
from quantlab.core.recipe import LoadedRecipe, load_recipe
from quantlab.core.run import RunDir, StageRecord, new_run_folder, now_iso
from quantlab.performance import stage as perf_stage
from quantlab.quality import stage as quality_stage
from quantlab.quantize import stage as quantize_stage
from quantlab.release import stage as release_stage
from quantlab.serving import stage as serve_stage
from quantlab.stability import stage as stability_stage
from quantlab.targets import stage as targets_stage

COMPARE_DIR = "compare"  # under the runs root: compare/<id>/
CANDIDATES_DIR = "candidates"
RESULT_FILE = "comparison.json"
# recipe sections that must be equal: one baseline, served and loaded the same way for all
SHARED_SECTIONS = ("serve", "performance")


@dataclass
class Candidate:
    name: str
    loaded: LoadedRecipe
    run: RunDir | None = None
    ctx: RunContext | None = None
    todo: dict[str, str] = field(default_factory=dict)
    refused: str | None = None  # by its preflight, before any work
    failed: str | None = None  # a stage failed or its server died; the others go on

    @property
    def active(self) -> bool:
        return self.refused is None and self.failed is None


@dataclass
class Comparison:
    folder: Path
    candidates: list[Candidate]
    choice: Choice | None
    table_md: str
    exit_code: int  # 0 one chosen, 1 none released, 3 none could be judged


def check_comparable(loaded: list[LoadedRecipe]) -> None:
    """Two or more recipes that can share one baseline; RecipeError naming file and field otherwise."""
    if len(loaded) < 2:
        raise RecipeError("a comparison needs two or more recipes; for one, `quantlab run RECIPE`")
    seen: dict[str, Path] = {}
    for lr in loaded:
        name = lr.recipe.name
        if name in seen:
            raise RecipeError(f"two candidates are named '{name}' ({seen[name]} and {lr.path}): each candidate's "
                              "run folder and row in the comparison go by its recipe's name; rename one",
                              file=str(lr.path), field="name")
        seen[name] = lr.path
    first = loaded[0]
    for lr in loaded[1:]:
        model_a = _model_identity(first)
        model_b = _model_identity(lr)
        if model_a != model_b:
            raise RecipeError(f"'{lr.recipe.name}' starts from a different model than '{first.recipe.name}' "
                              f"({model_b} against {model_a}): candidates are compared with one baseline, so they "
                              "must quantize the same model", file=str(lr.path), field="model")
        for section in SHARED_SECTIONS:
            a, b = _dump(first, section), _dump(lr, section)
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
    if not first.recipe.serve.side_by_side:
        raise RecipeError("a comparison keeps the baseline and every candidate up at once, and serve.side_by_side "
                          "is false: set it to true (serving them in turn is not supported yet)",
                          file=str(first.path), field="serve.side_by_side")


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


def _create_folder(runs_root: Path, loaded: list[LoadedRecipe]) -> Path:
    import hashlib

    digest = hashlib.sha256("".join(lr.content_hash for lr in loaded).encode()).hexdigest()
    return new_run_folder(Path(runs_root) / COMPARE_DIR, digest)


def run_comparison(files: list[Path], runs_root: Path, *, progress: Progress = print,
                   verbose: bool = False) -> Comparison:
    clock = (time.perf_counter(), engine_seconds())
    loaded = [load_recipe(f) for f in files]
    check_comparable(loaded)
    selection = selection_of(loaded)
    folder = _create_folder(runs_root, loaded)
    progress(f"comparison of {len(loaded)} candidates: {folder}")
    cands = [Candidate(lr.recipe.name, lr) for lr in loaded]
    for c in cands:
        _prepare(c, folder, progress, verbose, selection)
    active = [c for c in cands if c.active]
    _check_one_baseline(active)
    baseline = None
    try:
        if active:
            _each(active, quantize_stage)
            baseline = _start_servers(folder, [c for c in cands if c.active], progress)
            _each([c for c in cands if c.active], serve_stage, quality_stage)
            _shared_performance([c for c in cands if c.active], progress)
            _each([c for c in cands if c.active], stability_stage, targets_stage)
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


def _prepare(c: Candidate, folder: Path, progress: Progress, verbose: bool, selection: SelectionSpec) -> None:
    """Its run folder, then every preflight of its stages (before any work starts)."""
    c.run = RunDir.create(c.loaded, folder / CANDIDATES_DIR)
    c.ctx = RunContext(c.loaded, c.run, progress, verbose=verbose, stages=STAGES)
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


def _start_servers(folder: Path, active: list[Candidate], progress: Progress):
    """The baseline and every candidate, started at once; a candidate that fails to start
    fails alone, a baseline that fails stops the comparison."""
    from quantlab.serving.vllm_server import prepare_engine, wait_healthy

    plan = active[0].ctx.serving_plan()
    baseline = prepare_engine(plan, "baseline", log_dir=folder / SERVE_LOG_DIR, progress=progress)
    mine = {c.name: prepare_engine(c.ctx.serving_plan(), "candidate", log_dir=c.run.path / SERVE_LOG_DIR,
                                   progress=progress) for c in active}
    started = []
    try:
        for server in [baseline, *mine.values()]:
            server.start()
            started.append(server)
        wait_healthy(baseline, progress)
    except BaseException:
        for server in started:
            server.stop()
        raise
    for c in active:
        try:
            wait_healthy(mine[c.name], progress)
        except EngineError as err:
            c.failed = f"its server did not start: {err.cause or str(err).splitlines()[0]}"
            progress(f"candidate {c.name}: {c.failed}; the others go on")
            continue
        except BaseException:
            for server in [baseline, *mine.values()]:
                server.stop()
            raise
        c.ctx.adopt_engine("baseline", baseline, owned=False)
        c.ctx.adopt_engine("candidate", mine[c.name], owned=True)
    return baseline


def _shared_performance(active: list[Candidate], progress: Progress) -> None:
    """One interleaved sweep over the candidates still in; a candidate whose server died
    is failed and the sweep measured again without it."""
    from quantlab.performance.shared_stage import run_shared

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
    pairs = {c.name: summarize(c.name, c.run.record, decided=release_stage.decide_run(c.ctx).record
                               if c.active else None) for c in judged}
    if not pairs:
        return
    choice = choose([s for s, _ in pairs.values()], selection)
    rows = [row for _, row in pairs.values()]
    for c in [c for c in cands if c.active]:
        c.ctx.comparison = {"chosen": choice.chosen == c.name, "chosen_candidate": choice.chosen,
                            "rule": selection.rule, "why": choice.why, "lost": choice.lost.get(c.name),
                            "candidates": rows, "refused": {x.name: x.refused for x in cands if x.refused}}
        _each([c], release_stage)


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
    from quantlab.release.report import render_junit

    judged = [c for c in cands if c.run is not None and c.refused is None]
    rows, summaries = [], []
    for c in judged:
        summary, row = summarize(c.name, c.run.record)
        if c.failed:
            row["failed"] = c.failed
        summaries.append(summary)
        rows.append(row)
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
    return Comparison(folder, cands, choice, table, exit_code)


def _pareto(folder: Path, baseline_row: dict[str, Any] | None, rows: list[dict[str, Any]],
            progress: Progress) -> Path | None:
    """The candidates' plot (the baseline at recovery 1); a plot that cannot be drawn is said, not fatal."""
    from quantlab.release.plots import pareto

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
