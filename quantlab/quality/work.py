"""What a quality stage runs: the recipe's suites (traffic files as generated suites), the
tasks that fit the served length, the baseline cache's key parts, and the candidates judged
against its cached answers. How many samples each task takes: quality/samples.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantlab.core import cpu_emulation, redact, result_cache
from quantlab.core.digest import json_sha256
from quantlab.core.stage_context import StageContext, once
from quantlab.core.errors import RecipeError
from quantlab.quality.samples import cache_limit
from quantlab.quality.suites import Suite, load_suites
from quantlab.recipe.quality import QualitySpec


def suites_of(ctx: StageContext) -> list[Suite]:
    """The recipe's suites and its traffic files' suites, read and hashed once per run."""
    return list(once(ctx, "quality.suites", lambda: _build_suites(ctx)))


def _build_suites(ctx: StageContext) -> list[Suite]:
    suites = load_suites(ctx.recipe.quality, ctx.loaded.base_dir)
    if ctx.recipe.quality.traffic:
        suites += _traffic_suites(ctx)
    return suites


def _traffic_suites(ctx: StageContext) -> list[Suite]:
    """Each traffic file as a generated suite (made once per content, in the cache);
    chat rows are rendered with the baseline's chat template."""
    from quantlab.core.layout import cache_dir
    from quantlab.models.tokenizer import load_tokenizer
    from quantlab.quality.suites import load_suite
    from quantlab.quality.traffic import build_suite, file_name, task_prefix

    # the baseline model's own tokenizer (known before any serving plan; the candidate must match it)
    tok = load_tokenizer(ctx.baseline_model().path, trust_remote_code=ctx.recipe.model.trust_remote_code)
    named: dict[str, str] = {}
    for i, f in enumerate(ctx.recipe.quality.traffic):
        name = file_name(f, ctx.loaded.resolve(f.path))
        if name in named:
            raise RecipeError(f"quality.traffic: {f.path} and {named[name]} would both name their tasks "
                              f"{task_prefix(name)}_*; give one a `name`", field=f"quality.traffic.{i}.name")
        named[name] = f.path
    return [load_suite(build_suite(f, ctx.loaded.resolve(f.path), tok, cache_dir() / "traffic"))
            for f in ctx.recipe.quality.traffic]


def code_tasks(suites: list[Suite]) -> list[str]:
    """The selected tasks that execute model output (their task YAML says `unsafe_code: true`;
    a traffic task of python checks says it too)."""
    return sorted(t.task for s in suites for t in s.tasks if t.task in s.code_tasks)


def code_sandbox(ctx: StageContext) -> str | None:
    """Where this run's model code runs (sandbox.KINDS), decided once, at the preflight;
    None when no selected task executes model code. Refused (RecipeError) without
    quality.allow_code_execution, or where the chosen isolation does not work."""
    return once(ctx, "quality.code_sandbox", lambda: _code_sandbox(ctx))


def _code_sandbox(ctx: StageContext) -> str | None:
    from quantlab.quality.sandbox import resolve, unreadable
    from quantlab.quality.traffic import load_rows

    spec: QualitySpec = ctx.recipe.quality
    tasks = code_tasks(suites_of(ctx))
    if not tasks:
        return None
    if not spec.allow_code_execution:
        raise RecipeError(f"quality tasks {', '.join(tasks)} execute code the model writes (a task YAML with "
                          "unsafe_code: true; a traffic row's python check hands the answer to your scorer), and "
                          "quality.allow_code_execution is false. Set quality.allow_code_execution: true to run it "
                          "in the code sandbox (quality.code_sandbox), or leave these tasks out (quality.tasks)",
                          file=str(ctx.loaded.path), field="quality.allow_code_execution")
    kind = resolve(spec.code_sandbox, file=str(ctx.loaded.path))
    for i, f in enumerate(spec.traffic):  # a python check's scorer runs as nobody when quantlab runs as root
        path = ctx.loaded.resolve(f.path)
        if not any(r.check and r.check["kind"] == "python" for r in load_rows(path)):
            continue
        shown = _private_in_scorer_folder(ctx, path.parent.resolve())
        if shown:
            raise RecipeError(f"the scorers next to {path} would show model code their whole folder "
                              f"{path.parent.resolve()}, which holds {shown}. Put the traffic file and its scorers in "
                              "a folder of their own", file=str(ctx.loaded.path), field=f"quality.traffic.{i}.path")
        if unreadable(path.parent, kind):
            raise RecipeError(f"model code runs as the user nobody here (quantlab runs as root), and the scorers "
                              f"next to {path} cannot be read by other users: {', '.join(unreadable(path.parent, kind))}"
                              f". Make them readable (chmod o+rX {path.parent})", file=str(ctx.loaded.path),
                              field=f"quality.traffic.{i}.path")
    return kind


def _private_in_scorer_folder(ctx: StageContext, folder: Path) -> str:
    """What a scorer's folder (bound read-only into the sandbox, all of it) holds that model
    code must not see: the runs root, quantlab's cache or settings, the home directory
    ('' when none of them)."""
    from quantlab.core.layout import cache_dir, config_dir

    run = getattr(ctx, "run", None)
    private = {"the home directory": Path.home(), "quantlab's cache folder": cache_dir(),
               "quantlab's settings folder": config_dir()}
    if run is not None:
        private["the runs folder"] = Path(run.path).parents[1]  # <runs root>/<recipe>/<run id>
    held = [f"{what} {p.resolve()}" for what, p in private.items()
            if folder == p.resolve() or folder in p.resolve().parents]
    return ", ".join(held)


def cache_parts(ctx: StageContext, suites: list[Suite], tasks: list[str], plan) -> dict[str, Any]:
    from quantlab.quality.lmeval import lm_eval_version

    spec: QualitySpec = ctx.recipe.quality
    return {"baseline": ctx.baseline_identity(), "suites": {s.name: s.sha256 for s in suites}, "tasks": tasks,
            "limit": cache_limit(spec), "seed": spec.seed, "num_concurrent": spec.num_concurrent,
            "engine": (plan.probe.get("versions") or {}).get("vllm"),
            "engine_args": redact.engine_args(plan.engine_args),  # written into the cache entry: no secret
            "device": plan.device, "lm_eval": lm_eval_version(),
            # the shared cache of --ray spans machines: a baseline's answers on one CPU or GPU kind are not another's
            "hardware": cpu_emulation.cache_hardware(plan.probe),
            # where model code ran: a result scored unsandboxed is not one scored in a sandbox
            "code_sandbox": code_sandbox(ctx) if any(t in s.code_tasks for s in suites for t in tasks) else None,
            "kl": spec.kl.model_dump(mode="json", include={"enabled", "texts", "max_texts", "max_tokens", "top_k"}),
            "format": 1}


def baseline_entry(parts: dict[str, Any]) -> tuple[Path | None, str, list[str]]:
    """The baseline's cached answers for these parts: (the entry's folder or None, its key,
    the tasks it holds that these parts do not ask for). An entry for exactly these parts,
    else one that holds these tasks among more (result_cache.lookup_covering)."""
    key = result_cache.cache_key(parts)
    folder = result_cache.lookup(result_cache.QUALITY, key)
    if folder is not None:
        return folder, key, []
    # where model code ran matters only to the code tasks: a run asking for none reuses an
    # entry whose code tasks ran in any sandbox
    covering = result_cache.lookup_covering(result_cache.QUALITY, parts, "tasks", unset_matches_any=("code_sandbox",))
    if covering is None:
        return None, key, []
    folder, key, held = covering
    return folder, key, sorted(set(held) - set(parts["tasks"]))


def baseline_folder(parts: Callable[[], dict[str, Any]]) -> Path | None:
    """baseline_entry's folder, asked before the run has everything: None also when the parts
    cannot be computed yet (a file a part hashes is missing, a recipe field is unusable)."""
    try:
        return baseline_entry(parts())[0]
    except (RecipeError, OSError):
        return None


def runnable(suites: list[Suite], max_len: int | None) -> tuple[list[tuple[Suite, Any]], list[tuple[Any, str]]]:
    """The tasks that can run at the served length, and those that cannot (task, why)."""
    run, skipped = [], []
    for s in suites:
        for t in s.tasks:
            if t.min_model_len and max_len is not None and max_len < t.min_model_len:
                skipped.append((t, f"needs max_model_len >= {t.min_model_len}, served {max_len}"))
            else:
                run.append((s, t))
    return run, skipped


def mark_judged(ctx: StageContext, key: str, notes: list[str]) -> int | None:
    """This candidate counted among those judged against the cached baseline answers (by
    its weights: the same checkpoint judged again counts once); a reuse said in the notes."""
    q = ctx.run.record.result("quantize") or ctx.run.record.result("checkpoint")
    weights = getattr(q, "weights_sha256", None)
    if not weights:
        return None
    n = result_cache.mark_judged(result_cache.QUALITY, key, json_sha256(weights)[:32],
                                 {"recipe": ctx.recipe.name, "run": str(ctx.run.path)})
    if n > 1:
        family = ctx.family
        notes.append(f"these baseline answers have judged {n} distinct candidates (this one included); "
                     + (f"this one was judged in a family of {family.size}" if family and family.size > 1 else
                        "this one was judged alone") + ": a choice among runs judged separately reuses the items "
                     "(quantlab run --family NAME --family-size N judges them as one family)")
    return n


FLOOR_MIN_DOCUMENTS = 100  # fewer pooled documents: the assumed discordance, not a wide bound from a few


def floor_parts(ctx: StageContext, role: str) -> dict[str, Any] | None:
    """The batch floor store's key parts for `role`'s model on this host (quality/batch_floor;
    None: the candidate's weights are not recorded yet, as in a dry run)."""
    from quantlab.quality import batch_floor

    if role == "baseline":
        weights: Any = ctx.baseline_identity()
    else:
        made = ctx.run.record.result("quantize") or ctx.run.record.result("checkpoint")
        weights = getattr(made, "weights_sha256", None)
        if not weights:
            return None
    plan = ctx.serving_plan(predicted=not (ctx.checkpoint_dir / "config.json").is_file())
    return batch_floor.model_parts(ctx.serving_probe(), plan.device, weights, ctx.recipe.serve.engine_args)


def measured_discordance(ctx: StageContext) -> tuple[float | None, str]:
    """The discordance a plan may assume from this host's measured batch noise floor: the upper
    95% bound of the baseline's flips between concurrency 1 and load (every point and earlier run
    pooled, load_quality's measure), once at least FLOOR_MIN_DOCUMENTS documents are pooled;
    else None, and why."""
    from quantlab.quality import batch_floor

    try:
        parts = floor_parts(ctx, "baseline")
    except (RecipeError, OSError) as err:
        return None, f"no batch floor read ({err})"
    floor = batch_floor.floor_for(parts, exclude_run=ctx.run.record.run_id) if parts else None
    if floor is None or floor.high is None:
        return None, "no batch floor measured on this host for this baseline yet"
    if floor.n < FLOOR_MIN_DOCUMENTS:
        return None, f"the batch floor here has {floor.n} documents, fewer than {FLOOR_MIN_DOCUMENTS}: {floor.line()}"
    return floor.high, f"this host's batch floor: {floor.line()}"


def tokenizer_dir(ctx: StageContext, role: str) -> Path:
    """The served checkpoint's tokenizer (the baseline's where the checkpoint has none), for
    lm-eval's loglikelihood requests: absolute, because lm-eval's child runs in the suite folder."""
    target = ctx.serving_plan().target(role)
    if target.model_dir is not None and (Path(target.model_dir) / "tokenizer_config.json").is_file():
        return Path(target.model_dir).resolve()
    return ctx.baseline_model().path.resolve()
