"""What a quality stage runs: the recipe's suites (traffic files as generated suites), the
tasks that fit the served length, how many samples each takes, the baseline cache's key parts,
and the candidates judged against its cached answers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantlab.core import cpu_emulation, result_cache
from quantlab.core.digest import json_sha256
from quantlab.core.stage_context import StageContext, once
from quantlab.core.errors import RecipeError
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


def cache_parts(ctx: StageContext, suites: list[Suite], tasks: list[str], plan) -> dict[str, Any]:
    from quantlab.quality.lmeval import lm_eval_version

    spec: QualitySpec = ctx.recipe.quality
    return {"baseline": ctx.baseline_identity(), "suites": {s.name: s.sha256 for s in suites}, "tasks": tasks,
            "limit": spec.limit, "seed": spec.seed, "num_concurrent": spec.num_concurrent,
            "engine": (plan.probe.get("versions") or {}).get("vllm"), "engine_args": plan.engine_args,
            "device": plan.device, "lm_eval": lm_eval_version(),
            # the shared cache of --ray spans machines: a baseline's answers on one CPU or GPU kind are not another's
            "hardware": cpu_emulation.cache_hardware(plan.probe),
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
    covering = result_cache.lookup_covering(result_cache.QUALITY, parts, "tasks")
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


def task_limit(spec: QualitySpec, suite: Suite, task: Any) -> int | None:
    """How many samples a task runs: quality.limit, else the suite task's own limit, never
    more than it has (None: all of them, count unknown)."""
    from quantlab.quality.suites import sample_count

    count = sample_count(suite, task.task)
    want = spec.limit or task.limit
    if want is None:
        return count
    return min(want, count) if count is not None else want


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
