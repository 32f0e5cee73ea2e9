"""Quality stage: the recipe's eval suites through lm-eval against the served candidate
and the served baseline (or the baseline's cached results), compared sample by sample:
paired intervals, McNemar on pass/fail tasks, flips with both answers, next-token KL
divergence, and gates per task and per slice."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantlab.core.layout import QUALITY_DIR  # noqa: F401 (also read from here)
from quantlab.core import result_cache
from quantlab.core.stage_context import StageContext
from quantlab.core.errors import CheckError, EngineError, RecipeError
from quantlab.core.together import run_together
from quantlab.quality.suites import Suite
from quantlab.core.fsutil import write_json_atomic, write_text_atomic
from quantlab.core.progress import step
from quantlab.quality import gates as quality_gates
from quantlab.recipe.quality import QualitySpec
from quantlab.core.results import QualityResult
from quantlab.serving import stage as serve_stage
from quantlab.quality.work import (baseline_entry, baseline_folder, cache_parts, code_sandbox, mark_judged,
                                   measured_discordance, runnable, suites_of, tokenizer_dir)
from quantlab.quality.samples import Docs, evaluated_docs, task_samples
from quantlab.quality import gate_plan
from quantlab.quality.gate_plan import gate_plans, plan_summary
from quantlab.quality.kl_run import kl_dists, kl_of_candidate, kl_prompt_ids
from quantlab.quality.judging import gated_only, judge, sample_artifacts, write_flips
from quantlab.quality.pairing import compare_tasks, pool_slices

NAME = "quality"
OUT_DIR = QUALITY_DIR


def enabled(ctx: StageContext) -> bool:
    return ctx.recipe.quality is not None


def inputs(ctx: StageContext) -> dict[str, Any]:
    spec = ctx.recipe.quality
    return {"quality": spec.model_dump(mode="json"), "suites": [s.sha256 for s in suites_of(ctx)],
            "serving": serve_stage.inputs(ctx)}


def preflight(ctx: StageContext) -> None:
    spec: QualitySpec = ctx.recipe.quality
    try:
        suites_of(ctx)
    except RecipeError as err:
        raise RecipeError(str(err), file=err.file or str(ctx.loaded.path), field=err.field) from None
    code_sandbox(ctx)  # model code only where the recipe allows it, isolated unless it says unsandboxed
    if spec.kl.texts and not ctx.loaded.resolve(spec.kl.texts).is_file():
        raise RecipeError(f"KL text file '{spec.kl.texts}' does not exist", file=str(ctx.loaded.path),
                          field="quality.kl.texts")
    plans = gate_plans(ctx)[0]
    ctx.progress("quality plan (before any engine starts; --dry-run shows each comparison): "
                 + plan_summary(plans, measured_discordance(ctx)[0]))
    if ctx.recipe.release.policy.underpowered == "error":
        weak = [p for p in plans if p.underpowered]
        if weak:
            raise RecipeError(f"{len(weak)} required quality comparison(s) cannot decide with their data: "
                              + "; ".join(f"{p.scope} ({p.n} items, P(release | unchanged) "
                                          f"{p.p_release_unchanged:.0%}, needs ~{p.samples_to_show or '?'})"
                                          for p in weak)
                              + ". Give them more items (quality.limit), a wider margin, or let them warn "
                              "(release.policy.gates)", file=str(ctx.loaded.path), field="release.policy.underpowered")


def check_same_tokenizer(base_dir: Path, cand_dir: Path, *, trust_remote_code: bool) -> None:
    """Candidate and baseline must tokenize alike, or loglikelihood tasks compare
    different things."""
    from quantlab.models.tokenizer import load_tokenizer

    if base_dir.resolve() == cand_dir.resolve():
        return
    a = load_tokenizer(base_dir, trust_remote_code=trust_remote_code)
    b = load_tokenizer(cand_dir, trust_remote_code=trust_remote_code)
    probe = "Quantization check: naïve café, 12345 tokens!\n\tdef f(x): return x"
    problems = []
    if a.get_vocab() != b.get_vocab():
        problems.append(f"vocabularies differ ({len(a.get_vocab())} vs {len(b.get_vocab())} entries)")
    elif a(probe).input_ids != b(probe).input_ids:
        problems.append("the same text tokenizes differently")
    if getattr(a, "chat_template", None) != getattr(b, "chat_template", None):
        problems.append("chat templates differ")
    if problems:
        raise RecipeError(f"tokenizer mismatch between the baseline ({base_dir}) and the checkpoint ({cand_dir}): "
                          f"{'; '.join(problems)}. Export the checkpoint with the baseline's tokenizer")


def _evaluate(ctx: StageContext, role: str, work: list[tuple[Suite, Any]], out: Path, *,
              docs: dict[str, Docs] | None = None, deadline_s: float | None = None,
              stop: threading.Event | None = None) -> float:
    """`work` through lm-eval against one role's server: each task's `docs`, else all it
    evaluates (quality/samples.py); `stop`: give up (see core.together)."""
    from quantlab.quality.lmeval import run_tasks

    spec: QualitySpec = ctx.recipe.quality
    server = ctx.engine(role)
    started = time.monotonic()
    groups: dict[str, dict[bool, list[str]]] = {}  # suite -> chat API? -> tasks: one lm-eval process per suite
    folders = {}
    for suite, task in work:
        groups.setdefault(suite.name, {False: [], True: []})[task.api == "chat"].append(task.task)
        folders[suite.name] = suite.folder
    total = len(work)
    done = 0
    docs = evaluated_docs(spec, work) if docs is None else docs
    with step(ctx.progress, f"quality {role}: lm-eval", total=total, unit="tasks", announce=False) as bar:
        for suite_name, by_api in groups.items():
            def progress(line: str, _role=role) -> None:
                nonlocal done
                if line.startswith("done"):
                    done += 1
                    bar.detail(f"quality {_role}: [{done}/{total}] {line.split(' ', 2)[2]}", done=done)

            tasks = by_api[False] + by_api[True]
            run_tasks(tasks=by_api[False], chat_tasks=by_api[True], base_url=server.base_url,
                      served_name=server.served_name,
                      tokenizer=str(tokenizer_dir(ctx, role)), suite_dir=folders[suite_name], out_dir=out,
                      log_path=ctx.run.path / OUT_DIR / f"{role}-lmeval.log", seed=spec.seed,
                      docs=docs,
                      num_concurrent=spec.num_concurrent, request_timeout_s=spec.request_timeout_s,
                      max_retries=spec.max_retries, deadline_s=deadline_s or spec.timeout_s,
                      offline=folders[suite_name] is not None,
                      trust_remote_code=ctx.recipe.model.trust_remote_code, progress=progress,
                      code_sandbox=code_sandbox(ctx),
                      is_alive=lambda s=server: s.proc is None or s.proc.poll() is None, stop=stop)
            try:
                server.ensure_alive(f"during quality tasks {', '.join(tasks)}")
            except EngineError as err:
                raise EngineError(f"{err}\nlm-eval log: {ctx.run.path / OUT_DIR / f'{role}-lmeval.log'}") from None
    return time.monotonic() - started


def _both_servers_up(ctx: StageContext) -> bool:
    """Baseline and candidate may be asked at the same time: served side by side, and
    quality.concurrent_roles not turned off."""
    return ctx.recipe.serve.side_by_side and ctx.recipe.quality.concurrent_roles


def run(ctx: StageContext) -> QualityResult:
    spec: QualitySpec = ctx.recipe.quality
    suites = suites_of(ctx)
    out = ctx.run.path / OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    work, skipped = runnable(suites, ctx.served_max_model_len())
    if not work:
        raise CheckError("no quality task can run: " + "; ".join(f"{t.task}: {why}" for t, why in skipped))
    base_tok, cand_tok = tokenizer_dir(ctx, "baseline"), tokenizer_dir(ctx, "candidate")
    check_same_tokenizer(base_tok, cand_tok, trust_remote_code=ctx.recipe.model.trust_remote_code)
    kl_token_ids = kl_prompt_ids(ctx, suites, cand_tok)
    base_dir, cand_dir = out / "baseline", out / "candidate"
    seconds: dict[str, float] = {}
    cand_dir.mkdir(parents=True, exist_ok=True)
    # evaluate-until-decided reads the baseline's answers before each look: it waits for them
    alongside = None
    if spec.samples == "all" and _both_servers_up(ctx):
        ctx.engine("baseline"), ctx.engine("candidate")  # both got here, not from two threads at once
        alongside = lambda stop: _evaluate(ctx, "candidate", work, cand_dir, stop=stop)  # noqa: E731
    cached, key, share = _baseline(ctx, suites, work, kl_token_ids, base_dir, seconds, alongside)
    notes: list[str] = []
    judged_items = mark_judged(ctx, key, notes) if spec.baseline_cache else None
    plans: dict[str, list[int]] = {}
    if spec.samples == "auto":
        seconds["candidate"], plans = _evaluate_until_decided(ctx, work, base_dir, cand_dir, notes)
    elif "candidate" not in seconds:
        seconds["candidate"] = _evaluate(ctx, "candidate", work, cand_dir)
    else:
        notes.append(f"baseline and candidate were evaluated at the same time (both servers up): "
                     f"{seconds['baseline']:.0f} s and {seconds['candidate']:.0f} s overlap")
    kl_result = kl_of_candidate(ctx, kl_token_ids, base_dir, cand_dir)
    judged = judge(spec, work, skipped, base_dir, cand_dir, kl=kl_result, plans=plans)
    write_flips(out / "flips.jsonl", judged.flips)
    ctx.add_artifact(f"{OUT_DIR}/flips.jsonl", "quality-flips")
    raw = sample_artifacts(ctx, base_dir, cand_dir)
    if cached:
        notes.append(f"baseline results from the cache ({cached}{share}); no baseline evaluation ran")
    return QualityResult(
        tasks=judged.comparisons, slices=judged.slice_comparisons, kl=kl_result, baseline_cached=bool(cached),
        baseline_cache_key=key, judged_on_these_items=judged_items, skipped=[f"{t.task}: {why}" for t, why in skipped],
        seconds=seconds,
        lm_eval_version=judged.lm_eval_version,
        suites=[{"name": s.name, "folder": str(s.folder) if s.folder else None, "sha256": s.sha256} for s in suites],
        raw_files=raw, flips_file=f"{OUT_DIR}/flips.jsonl", plots=[], gates=judged.gates, notes=notes,
        traffic=judged.traffic,
        code_sandbox=code_sandbox(ctx),
        plan=_plan_lines(ctx))


def plan(ctx: StageContext) -> list[str]:
    """The dry run's hook: what each gated task and slice can tell with its items (quality/gate_plan.py)."""
    return gate_plan.plan(ctx)


def _plan_lines(ctx: StageContext) -> list[str]:
    """The planner's lines for the record and the report (a failure to plan never fails the run)."""
    try:
        return plan(ctx)
    except (RecipeError, CheckError, OSError, ValueError) as err:
        return [f"not planned: {err}"]


def _baseline(ctx: StageContext, suites: list[Suite], work: list[tuple[Suite, Any]], kl_token_ids, base_dir: Path,
              seconds: dict[str, float], alongside: Callable[[threading.Event], float] | None = None
              ) -> tuple[Path | None, str, str]:
    """The baseline's samples in base_dir: copied from the cache, or evaluated (and cached).
    `alongside` (the candidate's evaluation, both servers up): run at the same time as an
    evaluated baseline, its seconds kept as seconds["candidate"]; not run when the baseline
    is cached. Returns (the cache folder used or None, the cache key, "; N of the M tasks it
    holds" when that entry holds more than this run asked for, else "")."""
    spec: QualitySpec = ctx.recipe.quality
    plan = ctx.serving_plan()
    parts = cache_parts(ctx, suites, [t.task for _, t in work], plan)
    cached, key, others = baseline_entry(parts) if spec.baseline_cache else (None, result_cache.cache_key(parts), [])
    if cached:
        asked = len(parts["tasks"])
        share = f"; {asked} of the {asked + len(others)} tasks it holds" if others else ""
        ctx.progress(f"quality baseline: reusing cached results ({key[:12]}{share})")
        # a copy in the run folder: the run stays self-contained and the manifest hashes what was
        # compared (so not the answers of tasks this run did not ask for)
        # only the files the entry's authenticated index lists, each hashed as it is copied
        result_cache.copy_entry(result_cache.QUALITY, cached, base_dir, skip=tuple(f"{t}.*" for t in others))
        return cached, key, share
    base_dir.mkdir(parents=True, exist_ok=True)
    if alongside is None:
        seconds["baseline"] = _evaluate(ctx, "baseline", work, base_dir)
    else:
        ctx.progress("quality: baseline and candidate evaluated at the same time (both servers are up)")
        done = run_together({"baseline": lambda stop: _evaluate(ctx, "baseline", work, base_dir, stop=stop),
                             "candidate": alongside})
        seconds.update(done)
    if kl_token_ids is not None:
        kl_dists(ctx, "baseline", kl_token_ids, base_dir)
    if spec.baseline_cache:  # stored now: a candidate that fails later does not cost the baseline's work
        early_work, _ = runnable(suites, ctx.recipe_max_model_len())  # what needs_baseline asks
        early = result_cache.cache_key(cache_parts(ctx, suites, [t.task for _, t in early_work], plan))
        result_cache.store(result_cache.QUALITY, key, base_dir, parts, aliases=(early,))
    return None, key, ""


def _evaluate_until_decided(ctx: StageContext, work: list[tuple[Suite, Any]], base_dir: Path, cand_dir: Path,
                            notes: list[str]) -> tuple[float, dict[str, list[int]]]:
    """`quality.samples: auto`: the candidate answers each task's samples look by look
    (quality/sequential.py) until the task's gates and its slice's are decided, its data
    runs out, or quality.timeout_s is spent. Each look's answers land in
    candidate/look-<k>/ and are appended to the task's file. Returns (seconds, each task's
    look schedule)."""
    from quantlab.quality.lmeval import read_samples
    from quantlab.quality.sequential import undecided_tasks

    spec: QualitySpec = ctx.recipe.quality
    available = {t.task: len({r["doc_id"] for r in read_samples(base_dir, t.task)[0]}) for _, t in work}
    sampled = {t.task: task_samples(spec, s, t, answered=available[t.task]) for s, t in work}
    plans = {task: list(s.looks) for task, s in sampled.items()}
    looks = {task: len(p) for task, p in plans.items()}
    slice_of = {t.task: t.slice for _, t in work}
    answered = dict.fromkeys(plans, 0)
    stopped: dict[str, tuple[int, str]] = {}
    pending = set(plans)
    for task in [t for t in sorted(pending) if not available[t]]:  # nothing to pair an answer with
        stopped[task] = (0, "the baseline answered none of its documents")
        pending.discard(task)
    spent = 0.0
    for look in range(max(looks.values())):
        todo = {task: sampled[task].look_docs(look) for task in sorted(pending) if look < len(plans[task])}
        if not todo:
            break
        left = spec.timeout_s - spent
        if left <= 0:
            for task in pending:
                stopped[task] = (look, "quality.timeout_s spent")
            break
        ctx.progress(f"quality candidate: look {look + 1}, {sum(d.size for d in todo.values())} more samples of "
                     f"{len(todo)} undecided task(s)")
        folder = cand_dir / f"look-{look + 1}"
        spent += _evaluate(ctx, "candidate", [(s, t) for s, t in work if t.task in todo], folder, docs=todo,
                           deadline_s=left)
        for task in todo:
            _append_samples(folder, cand_dir, task)
            answered[task] = plans[task][look]
        tasks, _, _ = compare_tasks(spec, work, base_dir, cand_dir, plans=plans)
        tasks = gated_only(tasks, work)
        still = undecided_tasks(quality_gates.verdicts(spec, tasks, pool_slices(spec, tasks, looks=looks), None,
                                                       plans=plans), slice_of)
        for task in list(pending):
            if task not in still:
                stopped[task] = (look + 1, "decided")
            elif answered[task] >= available[task]:
                stopped[task] = (look + 1, "data exhausted")
            else:
                continue
            pending.discard(task)
    parts = [f"{task} {answered[task]}/{available[task]} at look {k} of {looks[task]} ({why})"
             for task, (k, why) in sorted(stopped.items())]
    notes.append("evaluated until decided (quality.samples: auto; each look of a task judged at its nominal level "
                 "of a Lan-DeMets O'Brien-Fleming-type boundary, slices and the pooled gate at a Bonferroni share "
                 "of the looks): " + "; ".join(parts))
    return spent, plans


def _append_samples(folder: Path, into: Path, task: str) -> None:
    """One look's answers added to the task's file (and its summary's sample count)."""
    from quantlab.quality.lmeval import read_samples

    rows, summary = read_samples(folder, task)
    if (into / f"{task}.jsonl").is_file():
        earlier, _ = read_samples(into, task)
        rows = earlier + rows
    summary["n_samples"] = len(rows)
    write_text_atomic(into / f"{task}.jsonl", "".join(json.dumps(r, default=str) + "\n" for r in rows))
    write_json_atomic(into / f"{task}.summary.json", summary)


def needs_baseline(ctx: StageContext) -> bool:
    """A baseline server is needed unless this run's baseline results are cached."""
    return not baseline_cached(ctx)


def reuses(ctx: StageContext) -> str | None:
    return "the baseline's results are cached: only the candidate is evaluated" if baseline_cached(ctx) else None


def baseline_cached(ctx: StageContext) -> bool:
    spec: QualitySpec | None = ctx.recipe.quality
    if spec is None or not spec.baseline_cache:
        return False

    def parts() -> dict[str, Any]:
        suites = suites_of(ctx)
        work, _ = runnable(suites, ctx.served_max_model_len())
        return cache_parts(ctx, suites, [t.task for _, t in work], ctx.serving_plan())

    return baseline_folder(parts) is not None


