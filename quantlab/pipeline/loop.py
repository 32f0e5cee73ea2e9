"""Runs the stages of a recipe in order and writes the run record after each one; also
the small helpers the CLI's other commands call (so the CLI never drives an engine).

Resume: a stage is redone when it has no `ok` record, when the hash of its inputs
changed (stages/__init__.py: `inputs`), or when a stage before it was redone. So an
edited serve section re-serves and keeps the checkpoint, an edited quantization
section starts again from quantize, and an edited description changes nothing.
Before the first stage runs, every stage that will run gets its preflight.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from quantlab.core.digest import inputs_hash
from quantlab.core.progress import Progress
from quantlab.pipeline.context import RunContext
from quantlab.reports.stage_plots import draw as draw_plots
from quantlab.core.engine_time import engine_seconds
from quantlab.core.errors import EngineError, GateFailure, QuantlabError, RecipeError
from quantlab.core.fsutil import write_text_atomic
from quantlab.core.layout import CHECKPOINT_DIR, ERROR_DIR
from quantlab.recipe.file import LoadedRecipe
from quantlab.recipe.serve import ServeSpec
from quantlab.core.run import AttemptTime, RunDir, StageRecord, now_iso
from quantlab.quantize import checkpoint_stage
from quantlab.performance import stage as perf_stage
from quantlab.quality import stage as quality_stage
from quantlab.quantize import stage as quantize_stage
from quantlab.release import stage as release_stage
from quantlab.serving import stage as serve_stage
from quantlab.stability import stage as stability_stage
from quantlab.targets import stage as targets_stage

STAGES: list[ModuleType] = [quantize_stage, serve_stage, quality_stage, perf_stage, stability_stage, targets_stage,
                            release_stage]
# quantlab validate: an existing checkpoint instead of quantizing
VALIDATE_STAGES: list[ModuleType] = [checkpoint_stage, serve_stage, quality_stage, perf_stage, stability_stage,
                                     targets_stage, release_stage]


def enabled(stage: ModuleType, ctx: RunContext) -> bool:
    """Check stages run only when the recipe has their section."""
    check = getattr(stage, "enabled", None)
    return check is None or check(ctx)


class UnexpectedError(EngineError):
    """A bug or an unforeseen engine failure: a run failure (exit 3) with its traceback on file."""

    def __init__(self, message: str, traceback_file: Path | None):
        self.traceback_file = traceback_file
        super().__init__(message)


def baseline_needed(ctx: RunContext) -> bool:
    """Whether the serve stage starts the baseline server: yes unless every enabled check
    says it can do without (the quality stage with cached baseline results)."""
    checks = [s for s in ctx.stages if s.NAME in ctx.enabled_stages and hasattr(s, "needs_baseline")]
    return not checks or any(s.needs_baseline(ctx) for s in checks)


CHECK_STAGES = ("quality", "performance", "stability", "targets")  # the stages whose gates are the evidence


def require_evidence(ctx: RunContext) -> None:
    """A run decides on its checks' gates: a recipe without any would serve both models
    and decide nothing (it used to sign a release on no evidence). Refused before any work."""
    if not ctx.enabled_stages & set(CHECK_STAGES):
        raise RecipeError("the recipe has no check section (quality, performance, stability or serve.targets): "
                          "`quantlab run` would serve both models and show nothing, and nothing is released "
                          "without evidence. Add a check section (see recipes/gptq-w4a16.yaml), or only quantize "
                          f"with `quantlab quantize {ctx.loaded.path.name}`", file=str(ctx.loaded.path),
                          field="quality")


def stages_to_run(ctx: RunContext) -> dict[str, str]:
    """Which stages this invocation runs, each with the reason. A recipe without a check
    section is refused (require_evidence)."""
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


def open_run(loaded: LoadedRecipe, runs_root: Path, resume: Path | None) -> RunDir:
    if resume is None:
        return RunDir.create(loaded, runs_root)
    run = RunDir.open(resume)
    if run.record.recipe_name != loaded.recipe.name:
        raise RecipeError(f"cannot resume {resume}: it is a run of recipe '{run.record.recipe_name}', this recipe "
                          f"is named '{loaded.recipe.name}'. Start a new run (drop --resume)", file=str(loaded.path))
    run.adopt_recipe(loaded)
    run.record.status = "running"
    return run


def run_pipeline(loaded: LoadedRecipe, runs_root: Path, *, resume: Path | None = None,
                 progress: Progress = print, verbose: bool = False, checkpoint: Path | None = None) -> RunDir:
    """Run (or resume) the pipeline; with `checkpoint`, validate that existing checkpoint
    instead of quantizing. Any error raised after the run folder exists carries it as
    `.run_dir`, so the caller can summarise the run whatever its outcome."""
    clock = (time.perf_counter(), engine_seconds())
    run = open_run(loaded, runs_root, resume)
    try:
        return _run_stages(loaded, run, progress, verbose, checkpoint, clock)
    except BaseException as err:
        err.run_dir = run.path  # type: ignore[attr-defined]
        raise


def _attempt_time(clock: tuple[float, float]) -> AttemptTime:
    return AttemptTime(wall_s=round(time.perf_counter() - clock[0], 3),
                       engine_s=round(engine_seconds() - clock[1], 3))


def _save_with_time(run: RunDir, clock: tuple[float, float], progress: Progress) -> None:
    """Reports first (they are part of the attempt's time), then the record with the time."""
    run.record.attempt = _attempt_time(clock)
    write_run_reports(run, progress)
    run.record.attempt = _attempt_time(clock)
    run.save()


def _run_stages(loaded: LoadedRecipe, run: RunDir, progress: Progress, verbose: bool,
                checkpoint: Path | None, clock: tuple[float, float]) -> RunDir:
    ctx = RunContext(loaded, run, progress, verbose=verbose, import_from=checkpoint,
                     stages=VALIDATE_STAGES if checkpoint is not None else STAGES)
    progress(f"run directory: {run.path}")
    try:
        todo = stages_to_run(ctx)
        ctx.will_run = set(todo)
        for name in [n for n in run.record.stages if n not in ctx.enabled_stages]:
            progress(f"stage {name}: no longer in the recipe, its earlier result is dropped")
            del run.record.stages[name]
        for stage in ctx.stages:
            if stage.NAME in todo:
                stage.preflight(ctx)
        ctx.needs_baseline = lambda: baseline_needed(ctx)
    except BaseException as err:
        run.record.attempt = _attempt_time(clock)
        _finish(run, err)
        wrapped = _as_quantlab_error(err, run, "preflight")
        if wrapped is None:
            raise
        raise wrapped from None
    try:
        for stage in ctx.stages:
            if not enabled(stage, ctx):
                continue
            if stage.NAME not in todo:
                progress(f"stage {stage.NAME}: done earlier with the same inputs, skipped")
                continue
            progress(f"stage {stage.NAME}: {todo[stage.NAME]}")
            _run_stage(ctx, stage)
    except BaseException:
        ctx.close_engines()
        _save_with_time(run, clock, progress)  # a failed run gets its report too
        raise
    ctx.close_engines()  # servers live across the check stages, never past the run
    decided = release_stage.decide_run(ctx)  # an optional target's failures block that target only
    run.record.status = "blocked" if decided.blocked else "ok"
    _save_with_time(run, clock, progress)
    if decided.blocked:
        release = run.record.result("release")
        fallback = f"; fallback: {release.fallback}" if release is not None and release.fallback else ""
        failed = [v for v in decided.blocking if v.verdict == "fail"]
        unshown = [v for v in decided.blocking if v.verdict != "fail"]
        head = (f"release blocked: {len(failed)} gate(s) failed" if failed else "release not shown: "
                f"{len(unshown)} required gate(s) could not decide") + (
            f" and {len(unshown)} could not decide" if failed and unshown else "")
        raise GateFailure(f"{head}{fallback}; each gate's figures and interval: {run.path / 'report.md'}:\n  - "
                          + "\n  - ".join(_blocking_line(v) for v in failed + unshown))
    return run


def _blocking_line(v) -> str:
    """One short line a gate: its finding up to the first '; ' (the intervals and sample
    counts that follow are in run.json and the report)."""
    line = f"{v.stage} {v.gate} at {v.scope}: {v.detail.split('; ')[0]}"
    if v.verdict == "fail":
        return line
    need = f"; about {v.samples_to_verdict} samples would tell" if v.samples_to_verdict else ""
    return f"{line} (NOT SHOWN{need})"


def write_run_reports(run: RunDir, progress: Progress) -> dict[str, Path]:
    """Markdown, HTML and JUnit next to run.json. A report that cannot be written is
    said, never allowed to hide the run's own outcome."""
    from quantlab.reports.report import write_reports

    try:
        return write_reports(run.path, run.record)
    except Exception as err:  # noqa: BLE001 - the run's result matters more than its report
        progress(f"the report could not be written: {type(err).__name__}: {err}")
        return {}


def _run_stage(ctx: RunContext, stage: ModuleType) -> None:
    run = ctx.run
    ctx.artifacts = []
    started, t0, e0 = now_iso(), time.perf_counter(), engine_seconds()
    digest = inputs_hash(stage.inputs(ctx))

    def record(status: str, **kw: Any) -> None:
        run.put_stage(StageRecord(name=stage.NAME, status=status, started_at=started, finished_at=now_iso(),
                                  duration_s=round(time.perf_counter() - t0, 3),
                                  engine_s=round(engine_seconds() - e0, 3), inputs_sha256=digest,
                                  artifacts=ctx.artifacts, **kw))

    try:
        result = stage.run(ctx)
    except BaseException as err:
        # Record the failure (also on Ctrl-C/SIGTERM) before passing it on.
        wrapped = _as_quantlab_error(err, run, stage.NAME)
        record("interrupted" if isinstance(err, KeyboardInterrupt) else "failed",
               error=str(wrapped) if wrapped is not None else "interrupted",
               cause=getattr(wrapped, "cause", None),
               error_log=_relative(run, getattr(wrapped, "traceback_file", None)))
        _finish(run, err)
        if wrapped is None:
            raise
        raise wrapped from None
    draw_plots(stage.NAME, ctx, result)
    record("ok", result=result)


def _finish(run: RunDir, err: BaseException) -> None:
    run.record.status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
    run.save()


def _relative(run: RunDir, path: Path | None) -> str | None:
    return str(path.relative_to(run.path)) if path is not None else None


def _as_quantlab_error(err: BaseException, run: RunDir, where: str) -> QuantlabError | None:
    """QuantlabErrors pass as they are; Ctrl-C gives None; anything else is unexpected:
    its traceback goes to a file in the run folder and it becomes a run failure."""
    if isinstance(err, QuantlabError):
        return err
    if isinstance(err, KeyboardInterrupt):
        return None
    path = run.path / ERROR_DIR / f"{where}-traceback.txt"
    write_text_atomic(path, "".join(traceback.format_exception(err)))
    line = "".join(traceback.format_exception_only(type(err), err)).strip().splitlines()[-1]
    return UnexpectedError(f"unexpected error in {where}: {line} (traceback in {path})", path)


# ---------------------------------------------------------------- helpers for the CLI

def dry_run(loaded: LoadedRecipe, runs_root: Path, *, progress: Progress,
            checkpoint: Path | None = None) -> list[dict[str, Any]]:
    """`quantlab run --dry-run`: validate, run every stage's preflight (model layout,
    serving compatibility of the scheme the recipe will export, suites, data files) in
    a throw-away run folder, and return the plan: each stage, why it would run, what it
    would take from the cache, an estimate in seconds from the newest earlier run of
    this recipe that ran it ok, and what the stage plans (`plan(ctx)`: the quality
    gates' noise floor and the regressions they can see)."""
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="quantlab-dry-run-"))
    try:
        run = RunDir.create(loaded, tmp)
        ctx = RunContext(loaded, run, progress, import_from=checkpoint,
                         stages=VALIDATE_STAGES if checkpoint is not None else STAGES)
        todo = stages_to_run(ctx)
        ctx.will_run = set(todo)
        for stage in ctx.stages:
            if stage.NAME in todo:
                stage.preflight(ctx)
        reused = {s.NAME: s.reuses(ctx) for s in ctx.stages if s.NAME in todo and hasattr(s, "reuses")}
        details = {s.NAME: s.plan(ctx) for s in ctx.stages if s.NAME in todo and hasattr(s, "plan")}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    estimates: dict[str, tuple[float, str]] = {}
    folder = Path(runs_root) / loaded.recipe.name
    for past in sorted(folder.glob("*"), reverse=True) if folder.is_dir() else []:
        try:
            record = RunDir.open(past).record
        except QuantlabError:
            continue
        for name, st in record.stages.items():
            if st.status == "ok" and name not in estimates:
                estimates[name] = (st.duration_s, record.run_id)
    return [{"stage": name, "why": why, "estimate_s": estimates.get(name, (None, None))[0],
             "from_run": estimates.get(name, (None, None))[1], "reuses": reused.get(name),
             "details": details.get(name) or []}
            for name, why in todo.items()]



def quantize_only(loaded: LoadedRecipe, output: Path, *, overwrite: bool, progress: Progress,
                  verbose: bool = False) -> dict[str, Any]:
    """`quantlab quantize`: the quantize engine into a folder of the user's choosing; the
    engine's own output goes to <output>.llmcompressor.log beside it unless verbose."""
    from quantlab.quantize.llmcompressor import quantize_checkpoint
    from quantlab.models.source import resolve_recipe_model

    output = Path(output)
    log_file = None if verbose else output.parent / f"{output.name}.llmcompressor.log"
    return quantize_checkpoint(loaded, resolve_recipe_model(loaded, progress=progress), output,
                               overwrite=overwrite, progress=progress, log_file=log_file)


SENSITIVITY_DIR = "sensitivity"  # under the runs root: sensitivity/<recipe>/<id>/


def sensitivity_only(loaded: LoadedRecipe, runs_root: Path, spec: Any, *, losses_from: Path | None = None,
                     progress: Progress) -> tuple[Path, dict[str, Any]]:
    """`quantlab sensitivity`: each group of the recipe's quantized modules fake-quantized
    alone on the unquantized model, ranked by how far it moves the next-token
    distribution on held-out text; sensitivity.json, .md and .png in a new folder (and
    the engines' output in its logs/). Returns the folder and the result."""
    import hashlib
    import json
    import shutil

    from quantlab.core.fsutil import write_json_atomic
    from quantlab.core.layout import LOG_DIR, QUANTIZE_RESULT_FILE
    from quantlab.core.run import new_run_folder
    from quantlab.models.source import resolve_recipe_model
    from quantlab.models.tokenizer import load_tokenizer
    from quantlab.quantize.calibration import held_out_chunks
    from quantlab.quantize.llmcompressor import check_layout, llmcompressor_log
    from quantlab.reports.plots import sensitivity_bars
    from quantlab.search.answers import run_answers, whole
    from quantlab.search.measure import PROXY, measure
    from quantlab.search.ranking import markdown, ranked, with_quantizer_loss

    recipe = loaded.recipe
    if recipe.calibration is None and not spec.answers_from:
        raise RecipeError("sensitivity is measured on held-out rows of the recipe's calibration datasets, and "
                          "this recipe has no calibration section: add one (its rows are only read; the recipe's "
                          "method need not calibrate), or score a run's answers (--answers-from RUN_DIR)",
                          file=str(loaded.path), field="calibration")
    losses = None
    if losses_from is not None:
        qfile = Path(losses_from) / QUANTIZE_RESULT_FILE
        if not qfile.is_file():
            raise RecipeError(f"--losses-from {losses_from}: no {QUANTIZE_RESULT_FILE} there; pass a checkpoint "
                              "folder quantlab quantized (a run's checkpoint/)", field="--losses-from")
        losses = (json.loads(qfile.read_text()).get("gptq") or {}).get("layer_losses")
        if not losses:
            progress(f"--losses-from {losses_from}: no per-layer quantizer losses recorded there (not GPTQ)")
    model = resolve_recipe_model(loaded, progress=progress)
    digest = hashlib.sha256((loaded.content_hash + spec.model_dump_json()).encode()).hexdigest()
    folder = new_run_folder(Path(runs_root) / SENSITIVITY_DIR / recipe.name, digest)
    log_file = folder / LOG_DIR / "engines.log"
    try:  # llm-compressor logs from its import on (the layout imports it): to the log, as quantize does
        with llmcompressor_log(log_file):
            _, quantized = check_layout(loaded, model)
            tokenizer = load_tokenizer(model.path, trust_remote_code=recipe.model.trust_remote_code)
            if spec.answers_from:
                sequences, source = run_answers(Path(spec.answers_from), tokenizer, tasks=spec.tasks,
                                                count=spec.sequences, tokens=spec.tokens)
            else:
                chunks, source = held_out_chunks(recipe.calibration, loaded.calibration_paths(), tokenizer,
                                                 count=spec.sequences, tokens=spec.tokens, seed=spec.seed)
                sequences = whole(chunks)
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            measured = measure(loaded, model, [m.name for m in quantized], sequences, spec, pad_id=pad or 0,
                               progress=progress, log_file=log_file)
    except RecipeError:
        shutil.rmtree(folder, ignore_errors=True)  # bad input, found before any result: leave nothing behind
        raise
    rows = with_quantizer_loss(ranked(measured.pop("groups")), losses)
    result = {"recipe": recipe.name, "recipe_sha256": loaded.content_hash, "model": str(model.path),
              "proxy": PROXY, "spec": spec.model_dump(mode="json"), "texts": len(sequences), "tokens": spec.tokens,
              "text_source": source, "quantizer_loss_from": str(losses_from) if losses else None,
              **measured, "groups": rows}
    write_json_atomic(folder / "sensitivity.json", result)
    write_text_atomic(folder / "sensitivity.md", markdown(result))
    try:
        sensitivity_bars(rows, folder / "sensitivity.png", f"{recipe.name} ({spec.granularity} groups)")
    except (ImportError, OSError, ValueError) as err:
        progress(f"the sensitivity plot could not be drawn: {type(err).__name__}: {err}")
    return folder, result


def default_output_dir(loaded: LoadedRecipe) -> Path:
    return Path("out") / f"{loaded.recipe.name}-{loaded.content_hash[:10]}"


def preflight_recipe(loaded: LoadedRecipe, *, progress: Progress) -> list[str]:
    """`quantlab recipes check --preflight`: the recipe against the model's layer layout
    and, where the serving environment is installed, the scheme it will export against
    the serving rules. Returns notes on what was not checked."""
    from quantlab.quantize.llmcompressor import check_layout, engine_quiet
    from quantlab.models.source import resolve_recipe_model

    baseline = resolve_recipe_model(loaded, progress=progress)
    with engine_quiet() as engine_said:  # no run folder to log into: its warnings become notes
        check_layout(loaded, baseline)
    notes = [f"llm-compressor: {w}" for w in engine_said]
    try:
        plan = plan_predicted_serving(loaded, baseline.path)
    except EngineError as e:  # e.g. no serving environment on a quantize-only machine
        return notes + [f"serving compatibility not checked: {e}"]
    if plan is None:
        return notes + ["a raw recipe's scheme is known only after quantizing: serving compatibility not checked"]
    return notes + plan.compat["candidate"].warnings + plan.compat["candidate"].notes


def plan_predicted_serving(loaded: LoadedRecipe, baseline_dir: Path):
    """The serving plan of the scheme this recipe will export, judged by the serving
    environment's probe (RecipeError when it cannot be served here); None for a raw
    recipe, whose scheme only the checkpoint tells. EngineError: no serving environment."""
    from quantlab.serving.vllm_probe import probe_for
    from quantlab.serving.compat import predict_quant_config
    from quantlab.serving.plan import plan_serving, serve_targets

    spec = loaded.recipe.serve
    predicted = predict_quant_config(loaded.recipe.quantization)
    if predicted is None:
        return None
    targets = [t for t in serve_targets(spec, baseline_dir=baseline_dir, candidate_dir=Path("."))
               if t.role == "candidate"]
    return plan_serving(spec, targets, dtype=loaded.recipe.model.dtype, probe=probe_for(spec),
                        quant_configs={"candidate": predicted})


def first_servable(files: list[Path]) -> tuple[Path | None, dict[Path, str]]:
    """The first recipe whose scheme the serving environment here can serve, and why each
    one before it was passed over (only the serving rules are asked: no model is read)."""
    from quantlab.recipe.file import load_recipe

    refused: dict[Path, str] = {}
    for f in files:
        loaded = load_recipe(f)
        try:
            plan_predicted_serving(loaded, Path("."))
        except RecipeError as err:
            refused[f] = err.message
            continue
        return f, refused
    return None, refused


def latest_checkpoint(runs_root: Path, loaded: LoadedRecipe) -> Path:
    latest = RunDir.latest(runs_root, loaded.recipe.name)
    folder = latest / CHECKPOINT_DIR if latest else None
    if folder is None or not (folder / "config.json").is_file():
        raise RecipeError(f"no quantized checkpoint for '{loaded.recipe.name}' under {runs_root}: run "
                          f"`quantlab run {loaded.path}` first, pass a checkpoint folder, or use --baseline")
    return folder


@contextlib.contextmanager
def serve_one(model_dir: Path, role: str, spec: ServeSpec, *, dtype: str, log_dir: Path,
              progress: Progress) -> Iterator[tuple[Any, dict[str, Any]]]:
    """`quantlab serve`: one model on one engine, with the same planning and checks as
    the serve stage. Yields (server, facts as a dict)."""
    from quantlab.serving.vllm_facts import collect_facts
    from quantlab.serving.vllm_probe import probe_for
    from quantlab.serving.vllm_server import open_engine
    from quantlab.serving.plan import EngineTarget, plan_serving

    probe = probe_for(spec)
    target = EngineTarget(role, Path(model_dir), role)
    plan = plan_serving(spec, [target], dtype=dtype, probe=probe)
    with open_engine(plan, role, log_dir=log_dir, progress=progress) as server:
        facts = collect_facts(server, target, device=plan.device)
        yield server, {"url": server.base_url, "model": server.served_name, "device": plan.device,
                       "engine_args": plan.engine_args, "compat": plan.compat[role].as_record(),
                       "dtype": plan.dtype.as_record() if plan.dtype is not None else None,
                       "facts": facts.model_dump(mode="json")}
