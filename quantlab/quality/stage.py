"""Quality stage: the recipe's eval suites through lm-eval against the served candidate
and the served baseline (or the baseline's cached results), compared sample by sample:
paired intervals, McNemar on pass/fail tasks, flips with both answers, next-token KL
divergence, and gates per task and per slice."""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantlab.core import result_cache
from quantlab.core.stage_context import StageContext
from quantlab.core.errors import CheckError, EngineError, RecipeError
from quantlab.core.together import run_together
from quantlab.quality.suites import Suite, load_suites
from quantlab.core.fsutil import write_json_atomic, write_text_atomic
from quantlab.core.progress import step
from quantlab.quality import gates as quality_gates
from quantlab.quality.compare import POOLED_SCOPE, TRANSFORMS, compare_task, paired_values, pooled
from quantlab.recipe.quality import QualitySpec
from quantlab.quality.stats import kl_summary, top_token, topk_kl
from quantlab.core.results import QualityResult
from quantlab.serving import stage as serve_stage

NAME = "quality"
OUT_DIR = "quality"
KL_FILE = "kl-topk.json"


def enabled(ctx: StageContext) -> bool:
    return ctx.recipe.quality is not None


def _suites(ctx: StageContext) -> list[Suite]:
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
    from quantlab.quality.traffic import build_suite, file_name

    # the baseline model's own tokenizer (known before any serving plan; the candidate must match it)
    tok = load_tokenizer(ctx.baseline_model().path, trust_remote_code=ctx.recipe.model.trust_remote_code)
    named: dict[str, str] = {}
    for i, f in enumerate(ctx.recipe.quality.traffic):
        name = file_name(f, ctx.loaded.resolve(f.path))
        if name in named:
            raise RecipeError(f"quality.traffic: {f.path} and {named[name]} would both name their tasks "
                              f"traffic_{name}_*; give one a `name`", field=f"quality.traffic.{i}.name")
        named[name] = f.path
    return [load_suite(build_suite(f, ctx.loaded.resolve(f.path), tok, cache_dir() / "traffic"))
            for f in ctx.recipe.quality.traffic]


def _gated(tasks: list[quality_gates.Paired], work: list[tuple[Suite, Any]]) -> list[quality_gates.Paired]:
    """The comparisons gates judge (a traffic file's unchecked rows are reported only)."""
    ungated = {t.task for _, t in work if not t.gated}
    return [t for t in tasks if t[0].task not in ungated]


def _traffic_findings(work: list[tuple[Suite, Any]], base_dir: Path, cand_dir: Path
                      ) -> tuple[list[dict[str, Any]], list[Any]]:
    """Traffic tasks: unchecked rows against the baseline's answers, checks that errored,
    and one gate per critical row."""
    from quantlab.quality.lmeval import read_samples
    from quantlab.quality.traffic import compare_unchecked, critical_verdicts

    findings, gates = [], []
    for suite, task in work:
        if not suite.name.startswith("traffic-") or suite.folder is None or \
                not (suite.folder / "data" / f"{task.task}.jsonl").is_file():
            continue  # not a generated traffic suite
        b_rows, _ = read_samples(base_dir, task.task)
        c_rows, _ = read_samples(cand_dir, task.task)
        if not task.gated:
            findings.append({"suite": suite.name, **compare_unchecked(task.task, b_rows, c_rows)})
            continue
        data = suite.folder / "data" / f"{task.task}.jsonl"
        docs = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
        critical = critical_verdicts(task.task, docs, b_rows, c_rows)
        gates += critical
        findings.append({"suite": suite.name, "task": task.task, "n": len(c_rows),
                         "errored": {"baseline": sum(int((r["metrics"] or {}).get("errored") or 0) for r in b_rows),
                                     "candidate": sum(int((r["metrics"] or {}).get("errored") or 0) for r in c_rows)},
                         "critical": [{"scope": v.scope, "verdict": v.verdict, "detail": v.detail} for v in critical]})
    return findings, gates


def inputs(ctx: StageContext) -> dict[str, Any]:
    spec = ctx.recipe.quality
    return {"quality": spec.model_dump(mode="json"), "suites": [s.sha256 for s in _suites(ctx)],
            "serving": serve_stage.inputs(ctx)}


def preflight(ctx: StageContext) -> None:
    spec: QualitySpec = ctx.recipe.quality
    try:
        _suites(ctx)
    except RecipeError as err:
        raise RecipeError(str(err), file=err.file or str(ctx.loaded.path), field=err.field) from None
    if spec.kl.texts and not ctx.loaded.resolve(spec.kl.texts).is_file():
        raise RecipeError(f"KL text file '{spec.kl.texts}' does not exist", file=str(ctx.loaded.path),
                          field="quality.kl.texts")
    plans = _gate_plans(ctx)[0]
    ctx.progress("quality plan (before any engine starts; --dry-run shows each comparison): "
                 + _plan_summary(plans))
    if ctx.recipe.release.policy.underpowered == "error":
        weak = [p for p in plans if p.underpowered]
        if weak:
            raise RecipeError(f"{len(weak)} required quality comparison(s) cannot decide with their data: "
                              + "; ".join(f"{p.scope} ({p.n} items, P(release | unchanged) "
                                          f"{p.p_release_unchanged:.0%}, needs ~{p.samples_to_show or '?'})"
                                          for p in weak)
                              + ". Give them more items (quality.limit), a wider margin, or let them warn "
                              "(release.policy.gates)", file=str(ctx.loaded.path), field="release.policy.underpowered")


def _tokenizer_dir(ctx: StageContext, role: str) -> Path:
    target = ctx.serving_plan().target(role)
    if target.model_dir is not None and (Path(target.model_dir) / "tokenizer_config.json").is_file():
        return Path(target.model_dir).resolve()  # absolute: lm-eval runs in the suite folder
    return ctx.baseline_model().path.resolve()


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


def _cache_parts(ctx: StageContext, suites: list[Suite], tasks: list[str], plan) -> dict[str, Any]:
    from quantlab.quality.lmeval import lm_eval_version

    spec: QualitySpec = ctx.recipe.quality
    return {"baseline": ctx.baseline_identity(), "suites": {s.name: s.sha256 for s in suites}, "tasks": tasks,
            "limit": spec.limit, "seed": spec.seed, "num_concurrent": spec.num_concurrent,
            "engine": (plan.probe.get("versions") or {}).get("vllm"), "engine_args": plan.engine_args,
            "device": plan.device, "lm_eval": lm_eval_version(),
            "kl": spec.kl.model_dump(mode="json", include={"enabled", "texts", "max_texts", "max_tokens", "top_k"}),
            "format": 1}


def task_limit(spec: QualitySpec, suite: Suite, task: Any) -> int | None:
    """How many samples a task runs: quality.limit, else the suite task's own limit, never
    more than it has (None: all of them, count unknown)."""
    from quantlab.quality.suites import sample_count

    count = sample_count(suite, task.task)
    want = spec.limit or task.limit
    if want is None:
        return count
    return min(want, count) if count is not None else want


def _runnable(suites: list[Suite], max_len: int | None) -> tuple[list[tuple[Suite, Any]], list[tuple[Any, str]]]:
    """The tasks that can run at the served length, and those that cannot (task, why)."""
    run, skipped = [], []
    for s in suites:
        for t in s.tasks:
            if t.min_model_len and max_len is not None and max_len < t.min_model_len:
                skipped.append((t, f"needs max_model_len >= {t.min_model_len}, served {max_len}"))
            else:
                run.append((s, t))
    return run, skipped


def _evaluate(ctx: StageContext, role: str, work: list[tuple[Suite, Any]], out: Path, *,
              samples: dict[str, list[int]] | None = None, deadline_s: float | None = None,
              stop: threading.Event | None = None) -> float:
    """`work` through lm-eval against one role's server; `samples` picks doc indices per
    task instead of the first `quality.limit`; `stop`: give up (see core.together)."""
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
    picked = dict(samples or {})
    if samples is None:  # a suite task's own limit where the recipe sets none (a subset of the samples picks itself)
        for suite, task in work:
            if task.limit and spec.limit is None:
                picked[task.task] = list(range(task_limit(spec, suite, task)))
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
                      tokenizer=str(_tokenizer_dir(ctx, role)), suite_dir=folders[suite_name], out_dir=out,
                      log_path=ctx.run.path / OUT_DIR / f"{role}-lmeval.log", seed=spec.seed,
                      limit=None if samples is not None else spec.limit, samples=picked or None,
                      num_concurrent=spec.num_concurrent, request_timeout_s=spec.request_timeout_s,
                      max_retries=spec.max_retries, deadline_s=deadline_s or spec.timeout_s,
                      offline=folders[suite_name] is not None,
                      trust_remote_code=ctx.recipe.model.trust_remote_code, progress=progress,
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


def _kl_texts(ctx: StageContext, suites: list[Suite]) -> Path | None:
    spec: QualitySpec = ctx.recipe.quality
    if not spec.kl.enabled:
        return None
    if spec.kl.texts:
        return ctx.loaded.resolve(spec.kl.texts)
    return next((s.kl_texts for s in suites if s.kl_texts), None)


def _kl_dists(ctx: StageContext, role: str, texts: list[list[int]], out: Path) -> list:
    from quantlab.quality import kl

    spec: QualitySpec = ctx.recipe.quality
    server = ctx.engine(role)
    ctx.progress(f"quality {role}: next-token distributions on {len(texts)} texts (top {spec.kl.top_k})")
    dists = kl.distributions(server.base_url, server.served_name, texts, top_k=spec.kl.top_k,
                             timeout_s=spec.request_timeout_s)
    write_json_atomic(out / KL_FILE, kl.to_json(dists))
    return dists


def _kl(base: list, cand: list) -> dict[str, Any]:
    per_token, same = [], []
    if len(base) != len(cand) or any(len(b) != len(c) for b, c in zip(base, cand, strict=False)):
        raise CheckError("KL: the baseline and candidate distributions cover different positions (were the "
                         "cached baseline's texts cut at another length?)")
    for bt, ct in zip(base, cand, strict=True):
        for bp, cp in zip(bt, ct, strict=True):
            per_token.append(topk_kl(bp, cp))
            same.append(top_token(bp) == top_token(cp))
    return kl_summary(per_token, same)


def run(ctx: StageContext) -> QualityResult:
    spec: QualitySpec = ctx.recipe.quality
    suites = _suites(ctx)
    out = ctx.run.path / OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    work, skipped = _runnable(suites, ctx.served_max_model_len())
    if not work:
        raise CheckError("no quality task can run: " + "; ".join(f"{t.task}: {why}" for t, why in skipped))
    base_tok, cand_tok = _tokenizer_dir(ctx, "baseline"), _tokenizer_dir(ctx, "candidate")
    check_same_tokenizer(base_tok, cand_tok, trust_remote_code=ctx.recipe.model.trust_remote_code)
    kl_token_ids = _kl_token_ids(ctx, suites, cand_tok)
    base_dir, cand_dir = out / "baseline", out / "candidate"
    seconds: dict[str, float] = {}
    cand_dir.mkdir(parents=True, exist_ok=True)
    # evaluate-until-decided reads the baseline's answers before each look: it waits for them
    alongside = None
    if spec.samples == "all" and _both_servers_up(ctx):
        ctx.engine("baseline"), ctx.engine("candidate")  # both got here, not from two threads at once
        alongside = lambda stop: _evaluate(ctx, "candidate", work, cand_dir, stop=stop)  # noqa: E731
    cached, key = _baseline(ctx, suites, work, kl_token_ids, base_dir, seconds, alongside)
    notes: list[str] = []
    looks: dict[str, int] = {}
    plans: dict[str, list[int]] = {}
    if spec.samples == "auto":
        seconds["candidate"], plans = _evaluate_until_decided(ctx, work, base_dir, cand_dir, notes)
        looks = {task: len(p) for task, p in plans.items()}
    elif "candidate" not in seconds:
        seconds["candidate"] = _evaluate(ctx, "candidate", work, cand_dir)
    else:
        notes.append(f"baseline and candidate were evaluated at the same time (both servers up): "
                     f"{seconds['baseline']:.0f} s and {seconds['candidate']:.0f} s overlap")
    kl_result = _kl_result(ctx, kl_token_ids, base_dir, cand_dir)
    tasks, flips, lm_eval_version = _compare_tasks(spec, work, base_dir, cand_dir, plans=plans)
    slices = _pool_slices(spec, _gated(tasks, work), looks=looks)
    everything = _pool_everything(spec, _gated(tasks, work), looks=looks)
    gates = quality_gates.verdicts(spec, _gated(tasks, work), slices, kl_result, everything)
    gates += quality_gates.skipped_verdicts(spec, [(t.task, why) for t, why in skipped if t.gated])
    traffic, critical = _traffic_findings(work, base_dir, cand_dir)
    gates += critical
    write_text_atomic(out / "flips.jsonl", "".join(json.dumps(f, default=str) + "\n" for f in flips))
    ctx.add_artifact(f"{OUT_DIR}/flips.jsonl", "quality-flips")
    raw = []
    for role_dir, role in ((cand_dir, "candidate"), (base_dir, "baseline")):
        for p in sorted(role_dir.glob("*.jsonl")):
            rel = str(p.relative_to(ctx.run.path))
            ctx.add_artifact(rel, f"quality-{role}-samples")
            raw.append(rel)
    comparisons = [cmp for cmp, _, _ in tasks]
    slice_comparisons = [cmp for cmp, _, _ in slices + ([everything] if everything else [])]
    if cached:
        notes.append(f"baseline results from the cache ({cached}); no baseline evaluation ran")
    return QualityResult(
        tasks=comparisons, slices=slice_comparisons, kl=kl_result, baseline_cached=bool(cached),
        baseline_cache_key=key, skipped=[f"{t.task}: {why}" for t, why in skipped], seconds=seconds,
        lm_eval_version=lm_eval_version,
        suites=[{"name": s.name, "folder": str(s.folder) if s.folder else None, "sha256": s.sha256} for s in suites],
        raw_files=raw, flips_file=f"{OUT_DIR}/flips.jsonl", plots=[], gates=gates, notes=notes, traffic=traffic,
        plan=_plan_lines(ctx))


def _plan_lines(ctx: StageContext) -> list[str]:
    """The planner's lines for the record and the report (a failure to plan never fails the run)."""
    try:
        return plan(ctx)
    except (RecipeError, CheckError, OSError, ValueError) as err:
        return [f"not planned: {err}"]


def _kl_token_ids(ctx: StageContext, suites: list[Suite], cand_tok: Path) -> list[list[int]] | None:
    """The KL texts as token ids (the candidate's tokenizer), or None when KL is off."""
    kl_path = _kl_texts(ctx, suites)
    if kl_path is None:
        return None
    from quantlab.models.tokenizer import load_tokenizer
    from quantlab.quality.kl import texts_as_token_ids

    spec: QualitySpec = ctx.recipe.quality
    tok = load_tokenizer(cand_tok, trust_remote_code=ctx.recipe.model.trust_remote_code)
    return texts_as_token_ids(kl_path, tok, max_texts=spec.kl.max_texts, max_tokens=spec.kl.max_tokens)


def _baseline(ctx: StageContext, suites: list[Suite], work: list[tuple[Suite, Any]], kl_token_ids, base_dir: Path,
              seconds: dict[str, float], alongside: Callable[[threading.Event], float] | None = None
              ) -> tuple[Path | None, str]:
    """The baseline's samples in base_dir: copied from the cache, or evaluated (and cached).
    `alongside` (the candidate's evaluation, both servers up): run at the same time as an
    evaluated baseline, its seconds kept as seconds["candidate"]; not run when the baseline
    is cached. Returns (the cache folder used or None, the cache key)."""
    spec: QualitySpec = ctx.recipe.quality
    plan = ctx.serving_plan()
    parts = _cache_parts(ctx, suites, [t.task for _, t in work], plan)
    key = result_cache.cache_key(parts)
    cached = result_cache.lookup(result_cache.QUALITY, key) if spec.baseline_cache else None
    if cached:
        ctx.progress(f"quality baseline: reusing cached results ({key[:12]})")
        # a copy in the run folder: the run stays self-contained and the manifest hashes what was compared
        shutil.copytree(cached, base_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns(result_cache.COMPLETE))
        return cached, key
    base_dir.mkdir(parents=True, exist_ok=True)
    if alongside is None:
        seconds["baseline"] = _evaluate(ctx, "baseline", work, base_dir)
    else:
        ctx.progress("quality: baseline and candidate evaluated at the same time (both servers are up)")
        done = run_together({"baseline": lambda stop: _evaluate(ctx, "baseline", work, base_dir, stop=stop),
                             "candidate": alongside})
        seconds.update(done)
    if kl_token_ids is not None:
        _kl_dists(ctx, "baseline", kl_token_ids, base_dir)
    if spec.baseline_cache:  # stored now: a candidate that fails later does not cost the baseline's work
        early_work, _ = _runnable(suites, ctx.recipe_max_model_len())  # what needs_baseline asks
        early = result_cache.cache_key(_cache_parts(ctx, suites, [t.task for _, t in early_work], plan))
        result_cache.store(result_cache.QUALITY, key, base_dir, parts, aliases=(early,))
    return None, key


def _kl_result(ctx: StageContext, kl_token_ids, base_dir: Path, cand_dir: Path) -> dict[str, Any] | None:
    if kl_token_ids is None:
        return None
    from quantlab.quality.kl import from_json

    cand_dists = _kl_dists(ctx, "candidate", kl_token_ids, cand_dir)
    base_dists = from_json(json.loads((base_dir / KL_FILE).read_text()))
    result = _kl(base_dists, cand_dists)
    result["texts"] = len(kl_token_ids)
    return result


def _compare_tasks(spec: QualitySpec, work: list[tuple[Suite, Any]], base_dir: Path, cand_dir: Path, *,
                   plans: dict[str, list[int]] | None = None
                   ) -> tuple[list[quality_gates.Paired], list[dict[str, Any]], str | None]:
    """Each task's samples joined and compared: (comparison, baseline values, candidate
    values) per task, every flip, and the lm-eval version that wrote them. With `plans`
    (evaluate until decided: each task's look schedule) the candidate answered a prefix:
    the baseline is cut to the same samples and the interval judged at what this look
    spends (quality/sequential.spent_confidence)."""
    from quantlab.quality.lmeval import read_samples
    from quantlab.quality.sequential import spent_confidence

    tasks, flips, lm_eval_version = [], [], None
    for suite, task in work:
        b_rows, b_sum = read_samples(base_dir, task.task)
        c_rows, c_sum = read_samples(cand_dir, task.task)
        confidence = quality_gates.task_gates(spec, task.task, task.slice).confidence
        if plans:
            answered = {r["doc_id"] for r in c_rows}
            b_rows = [r for r in b_rows if r["doc_id"] in answered]
            confidence = spent_confidence(confidence, plans.get(task.task, [len(answered)]), len(answered))
        lm_eval_version = c_sum.get("lm_eval")
        hib = _direction(task, suite, c_sum)
        cmp, task_flips = compare_task(task.task, task.slice, task.metric, task.filter, hib, b_rows, c_rows,
                                       confidence=confidence, iters=spec.bootstrap_iters, seed=spec.seed)
        flips += task_flips
        _, bv, cv = paired_values(task.task, task.metric, task.filter, b_rows, c_rows)
        tasks.append((cmp, bv, cv))
    return tasks, flips, lm_eval_version


def _direction(task: Any, suite: Suite, summary: dict[str, Any]) -> bool:
    """The metric's direction as the suite knew it at preflight; lm-eval's own word must agree."""
    known = suite.directions.get(task.task)
    said = (summary.get("higher_is_better") or {}).get(task.metric)
    if known is not None and said is not None and bool(said) != known:
        raise CheckError(f"task '{task.task}': lm-eval says '{task.metric}' is "
                         f"{'higher' if said else 'lower'}-is-better, the suite said the opposite at preflight; "
                         "fix the task's higher_is_better")
    if known is None and said is None:
        raise CheckError(f"task '{task.task}': the direction of '{task.metric}' is not known (neither the suite "
                         "nor lm-eval says): set higher_is_better on the task")
    return known if known is not None else bool(said)


def _pool_everything(spec: QualitySpec, tasks: list[quality_gates.Paired], *, looks: dict[str, int] | None = None
                     ) -> quality_gates.Paired | None:
    """Every gated pass/fail item pooled (quality.pooled), at the confidence of the
    most-looked-at task when evaluating until decided."""
    from quantlab.quality.compare import pooled_all
    from quantlab.quality.sequential import look_confidence

    if spec.pooled is None:
        return None
    most = max([(looks or {}).get(cmp.task, 1) for cmp, _, _ in tasks] or [1])
    return pooled_all([cmp for cmp, _, _ in tasks], {cmp.task: (bv, cv) for cmp, bv, cv in tasks},
                      confidence=look_confidence(spec.pooled.confidence, most), iters=spec.bootstrap_iters,
                      seed=spec.seed)


def _pool_slices(spec: QualitySpec, tasks: list[quality_gates.Paired], *, looks: dict[str, int] | None = None
                 ) -> list[quality_gates.Paired]:
    """Each slice's pass/fail tasks pooled into one paired comparison (judged, when
    evaluating until decided, at the confidence of its most-looked-at task)."""
    from quantlab.quality.sequential import look_confidence

    comparisons = [cmp for cmp, _, _ in tasks]
    values = {cmp.task: (bv, cv) for cmp, bv, cv in tasks}
    out = []
    for name in sorted({c.slice for c in comparisons}):
        most = max([(looks or {}).get(c.task, 1) for c in comparisons if c.slice == name] or [1])
        pool = pooled(comparisons, values, name,
                      confidence=look_confidence(quality_gates.slice_gates(spec, name).confidence, most),
                      iters=spec.bootstrap_iters, seed=spec.seed)
        if pool is not None:
            out.append(pool)
    return out


def _evaluate_until_decided(ctx: StageContext, work: list[tuple[Suite, Any]], base_dir: Path, cand_dir: Path,
                            notes: list[str]) -> tuple[float, dict[str, list[int]]]:
    """`quality.samples: auto`: the candidate answers each task's samples look by look
    (quality/sequential.py) until the task's gates and its slice's are decided, its data
    runs out, or quality.timeout_s is spent. Each look's answers land in
    candidate/look-<k>/ and are appended to the task's file. Returns (seconds, each task's
    look schedule)."""
    from quantlab.quality.lmeval import read_samples
    from quantlab.quality.sequential import schedule, undecided_tasks

    spec: QualitySpec = ctx.recipe.quality
    available = {t.task: len({r["doc_id"] for r in read_samples(base_dir, t.task)[0]}) for _, t in work}
    plans = {task: schedule(n, spec.sequential.first, spec.sequential.growth) for task, n in available.items()}
    looks = {task: len(p) for task, p in plans.items()}
    slice_of = {t.task: t.slice for _, t in work}
    answered = dict.fromkeys(plans, 0)
    stopped: dict[str, tuple[int, str]] = {}
    pending = set(plans)
    spent = 0.0
    for look in range(max(looks.values())):
        todo = {task: list(range(answered[task], plans[task][look])) for task in sorted(pending)
                if look < len(plans[task])}
        if not todo:
            break
        left = spec.timeout_s - spent
        if left <= 0:
            for task in pending:
                stopped[task] = (look, "quality.timeout_s spent")
            break
        ctx.progress(f"quality candidate: look {look + 1}, {sum(map(len, todo.values()))} more samples of "
                     f"{len(todo)} undecided task(s)")
        folder = cand_dir / f"look-{look + 1}"
        spent += _evaluate(ctx, "candidate", [(s, t) for s, t in work if t.task in todo], folder, samples=todo,
                           deadline_s=left)
        for task in todo:
            _append_samples(folder, cand_dir, task)
            answered[task] = plans[task][look]
        tasks, _, _ = _compare_tasks(spec, work, base_dir, cand_dir, plans=plans)
        tasks = _gated(tasks, work)
        still = undecided_tasks(quality_gates.verdicts(spec, tasks, _pool_slices(spec, tasks, looks=looks), None),
                                slice_of)
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
    notes.append("evaluated until decided (quality.samples: auto; each look of a task judged at the share of "
                 "1 - confidence it spends, O'Brien-Fleming-like): " + "; ".join(parts))
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
        suites = _suites(ctx)
        work, _ = _runnable(suites, ctx.served_max_model_len())
        return _cache_parts(ctx, suites, [t.task for _, t in work], ctx.serving_plan())

    return result_cache.lookup_parts(result_cache.QUALITY, parts) is not None


def plan(ctx: StageContext) -> list[str]:
    """`--dry-run`: what each gated pass/fail task and slice can tell with its items
    (quality/planner.py; perplexity-type tasks depend on their per-sample spread). The
    baseline's scores come from its cached results where there are some, else from a
    stated assumption."""
    from quantlab.quality.planner import ASSUMED_DISCORDANCE, ASSUMED_SCORE, POWER

    plans, cached = _gate_plans(ctx)
    source = (f"the baseline's own scores from its cached results where known (else {ASSUMED_SCORE:.0%})"
              if cached else f"an assumed baseline score of {ASSUMED_SCORE:.0%} (no cached baseline results yet)")
    lines = [f"quality gates, planned: {len(plans)} gated pass/fail comparisons; {source}, and "
             f"{ASSUMED_DISCORDANCE:.0%} of answers changing between two servers of the same model (drops are "
             "shares of all items)"]
    lines += [p.line() for p in plans]
    required, chance, weak = _run_chance(plans)
    if required:
        lines.append(f"all {required} required comparisons pass for an unchanged model with probability about "
                     f"{chance:.0%} (if independent)")
    if weak:
        lines.append(f"cannot decide at this size ({len(weak)}: P(release | unchanged) < {POWER:.0%}): "
                     f"{', '.join(weak)}; release.policy.underpowered: error refuses such a run")
    return lines


def _run_chance(plans: list[Any]) -> tuple[int, float, list[str]]:
    """(required comparisons, the chance an unchanged model passes all of them if they were
    independent, those that cannot decide)."""
    required = [p for p in plans if p.required and p.margin is not None]
    return (len(required), math.prod(p.p_release_unchanged for p in required),
            [p.scope for p in required if p.underpowered])


def _plan_summary(plans: list[Any]) -> str:
    """One line: how likely an unchanged model passes every required comparison, and which cannot decide."""
    from quantlab.quality.planner import ASSUMED_DISCORDANCE

    required, chance, weak = _run_chance(plans)
    if not required:
        return "no required pass/fail comparison"
    line = (f"{required} required pass/fail comparisons; an unchanged model passes all of them about "
            f"{chance:.0%} of the time at {ASSUMED_DISCORDANCE:.0%} discordance")
    return line + (f"; cannot decide with their items: {', '.join(weak)}" if weak else "")


def _gate_plans(ctx: StageContext) -> tuple[list[Any], bool]:
    """The planner's view of every gated pass/fail comparison (tasks, then pooled slices),
    and whether the baseline's scores came from its cache."""
    from quantlab.quality.planner import ASSUMED_SCORE, plan_gate
    from quantlab.quality.suites import sample_count
    from quantlab.core.verdicts import not_shown_rule

    spec: QualitySpec = ctx.recipe.quality
    rules = ctx.recipe.release.policy  # the recipe's words; the decision reads them the same way
    work, _ = _runnable(_suites(ctx), ctx.recipe_max_model_len())
    scores = _cached_baseline_scores(ctx, work)
    sized, ungated = [], set()  # a task whose own gates are disabled still counts in its slice and the pool
    for suite, task in work:
        count = sample_count(suite, task.task)
        override = spec.task_gates.get(task.task)
        if count is None or task.metric in TRANSFORMS or not task.gated:
            continue
        sized.append((task, task_limit(spec, suite, task)))
        if override and override.disabled:
            ungated.add(task.task)
    slices: dict[str, int] = {}
    for task, n in sized:
        slices[task.slice] = slices.get(task.slice, 0) + n
    pooled_slices = {name: n for name, n in slices.items()
                     if sum(1 for t, _ in sized if t.slice == name) >= 2 and not (
                         spec.slice_gates.get(name) and spec.slice_gates[name].disabled)}
    everything = sum(n for _, n in sized) if spec.pooled is not None and len(sized) >= 2 else 0
    family = len(sized) - len(ungated) + len(pooled_slices) + (1 if everything else 0)

    def required(scope: str) -> bool:
        return not_shown_rule(quality_gates.CHECK, "non_inferiority", scope, default=rules.not_shown,
                              checks=rules.checks, gates=rules.gates) == "block"

    plans = [plan_gate(task.task, n, quality_gates.task_gates(spec, task.task, task.slice), family,
                       score=scores.get(task.task, ASSUMED_SCORE), required=required(task.task))
             for task, n in sized if task.task not in ungated]
    for name, n in sorted(pooled_slices.items()):
        members = [(t, m) for t, m in sized if t.slice == name]
        score = sum(scores.get(t.task, ASSUMED_SCORE) * m for t, m in members) / max(1, sum(m for _, m in members))
        plans.append(plan_gate(f"slice:{name}", n, quality_gates.slice_gates(spec, name), family, score=score,
                               required=required(f"slice:{name}")))
    if everything:
        score = sum(scores.get(t.task, ASSUMED_SCORE) * m for t, m in sized) / everything
        plans.append(plan_gate(POOLED_SCOPE, everything, quality_gates.pooled_gates(spec), family, score=score,
                               required=required(POOLED_SCOPE)))
    return plans, bool(scores)


def _cached_baseline_scores(ctx: StageContext, work: list[tuple[Suite, Any]]) -> dict[str, float]:
    """Each task's baseline score from the baseline's cached per-sample results (the
    served length this recipe asks for), or {} when nothing is cached."""
    spec: QualitySpec = ctx.recipe.quality
    if not spec.baseline_cache:
        return {}
    from quantlab.quality.lmeval import read_samples

    def parts() -> dict[str, Any]:
        # before the quantize stage (a dry run) the plan is the one predicted from the recipe
        ready = (ctx.checkpoint_dir / "config.json").is_file()
        return _cache_parts(ctx, _suites(ctx), [t.task for _, t in work], ctx.serving_plan(predicted=not ready))

    folder = result_cache.lookup_parts(result_cache.QUALITY, parts)
    if folder is None:
        return {}
    scores = {}
    for _, task in work:
        try:
            rows, _ = read_samples(folder, task.task)
            _, values, _ = paired_values(task.task, task.metric, task.filter, rows, rows)
        except (OSError, ValueError, KeyError, CheckError):
            continue
        finite = [float(v) for v in values if isinstance(v, (int, float))]
        if finite:
            scores[task.task] = sum(finite) / len(finite)
    return scores
