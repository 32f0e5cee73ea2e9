"""The CLI's commands other than `run`: a dry run, quantize only, the recipe preflight,
the first servable recipe, the latest checkpoint, one server (so the CLI never drives
an engine itself)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantlab.core.errors import EngineError, QuantlabError, RecipeError
from quantlab.core.layout import CHECKPOINT_DIR
from quantlab.core.progress import Progress
from quantlab.core.run import RunDir
from quantlab.core.stage_context import stage_hook
from quantlab.pipeline import streams
from quantlab.pipeline.candidate_run import CandidateRun
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe
from quantlab.recipe.serve import ServeSpec


def dry_run(loaded: LoadedRecipe, runs_root: Path, *, progress: Progress,
            checkpoint: Path | None = None, family: Family | None = None) -> list[dict[str, Any]]:
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
        dry = CandidateRun.create(loaded, tmp, progress, checkpoint=checkpoint, family=family)
        todo = dry.plan()
        dry.preflight()
        dry.plan_position()  # the plans below at the level it would take
        ctx = dry.ctx
        progress(streams.position_line(ctx.stream, loaded.recipe) + " (a dry run takes no position)")
        reused = {s.NAME: h(ctx) for s in ctx.stages if s.NAME in todo and (h := stage_hook(s, "reuses"))}
        details = {s.NAME: h(ctx) for s in ctx.stages if s.NAME in todo and (h := stage_hook(s, "plan"))}
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


def default_output_dir(loaded: LoadedRecipe) -> Path:
    return Path("out") / f"{loaded.recipe.name}-{loaded.content_hash[:10]}"


def preflight_recipe(loaded: LoadedRecipe, *, progress: Progress) -> list[str]:
    """`quantlab recipes check --preflight`: the recipe against the model's layer layout
    and, where the serving environment is installed, the scheme it will export against
    the serving rules. Returns notes on what was not checked."""
    from quantlab.quantize.engine_output import engine_quiet
    from quantlab.quantize.llmcompressor import check_layout
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
                        quant_configs={"candidate": predicted}, trust_remote_code=loaded.recipe.model.trust_remote_code)


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


API_KEY_FILE = "api-key"  # `quantlab serve`: the server's key, in its log folder, mode 0600


@contextlib.contextmanager
def serve_one(model_dir: Path, role: str, spec: ServeSpec, *, dtype: str, log_dir: Path,
              progress: Progress, trust_remote_code: bool = False) -> Iterator[tuple[Any, dict[str, Any]]]:
    """`quantlab serve`: one model on one engine, with the same planning and checks as
    the serve stage. Yields (server, facts as a dict). The server's API key is in
    <log_dir>/api-key (mode 0600, removed when the server stops), never printed."""
    from quantlab.core import redact
    from quantlab.core.fsutil import create_private_file
    from quantlab.serving.vllm_facts import collect_facts
    from quantlab.serving.vllm_probe import probe_for
    from quantlab.serving.vllm_server import open_engine
    from quantlab.serving.plan import EngineTarget, plan_serving, served_name_for

    probe = probe_for(spec)
    target = EngineTarget(role, Path(model_dir), served_name_for(role))
    plan = plan_serving(spec, [target], dtype=dtype, probe=probe, trust_remote_code=trust_remote_code)
    key_file = Path(log_dir) / API_KEY_FILE
    with open_engine(plan, role, log_dir=log_dir, progress=progress) as server:
        facts = collect_facts(server, target, device=plan.device)
        key_file.unlink(missing_ok=True)
        if server.api_key:
            create_private_file(key_file, server.api_key.encode())
        try:
            yield server, {"url": server.base_url, "model": server.served_name, "device": plan.device,
                           "api_key_file": str(key_file) if server.api_key else None, "exposed": plan.exposed,
                           "engine_args": redact.engine_args(plan.engine_args),
                           "compat": plan.compat[role].as_record(),
                           "dtype": plan.dtype.as_record() if plan.dtype is not None else None,
                           "facts": facts.model_dump(mode="json")}
        finally:
            key_file.unlink(missing_ok=True)
