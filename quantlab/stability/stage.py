"""Stability stage: robustness probes on the served baseline and candidate (batch and
length sweeps, determinism, malformed requests, a soak), judged candidate against
baseline, with the fallback rate a router would see. A server that dies during a probe
fails the stage naming the probe, with the log tail."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from quantlab.core.layout import STABILITY_DIR  # noqa: F401 (also read from here)
from quantlab.core import cpu_emulation, redact
from quantlab.core.stage_context import StageContext
from quantlab.core.roles import ROLES
from quantlab.core.errors import CheckError, RecipeError
from quantlab.core.fsutil import sha256_file, write_text_atomic
from quantlab.core.progress import step
from quantlab.core.result_cache import STABILITY, cache_key, lookup, lookup_parts, read_entry_file, store
from quantlab.core.results import PerfResult, StabilityResult
from quantlab.core.together import run_together
from quantlab.stability import gates as stability_gates
from quantlab.stability.probe_run import PROMPT_TEXTS, PROMPT_TOKENS, probe_prompts, run_probe, tokenizer_dir
from quantlab.recipe.stability import StabilitySpec
from quantlab.serving import stage as serve_stage

NAME = "stability"
OUT_DIR = STABILITY_DIR


def enabled(ctx: StageContext) -> bool:
    return ctx.recipe.stability is not None


def needs_baseline(ctx: StageContext) -> bool:
    """Every probe is judged against the baseline's own behaviour: its server is needed
    unless its results are cached."""
    return not _cached(ctx)


def _cache_parts(ctx: StageContext, tokenizer_dir: Path, max_len: int | None) -> dict[str, Any]:
    spec: StabilitySpec = ctx.recipe.stability
    plan = ctx.serving_plan()
    tok_files = {p.name: sha256_file(p) for p in sorted(tokenizer_dir.glob("tokenizer*")) if p.is_file()}
    return {"baseline": ctx.baseline_identity(),
            "probes": spec.model_dump(mode="json", exclude={"gates", "fallback", "baseline_cache", "concurrent_roles"}),
            "prompts": {"texts": sha256_file(PROMPT_TEXTS), "tokens": PROMPT_TOKENS, "tokenizer": tok_files},
            "max_model_len": max_len, "engine": (plan.probe.get("versions") or {}).get("vllm"),
            "engine_args": redact.engine_args(plan.engine_args), "device": plan.device,  # no secret in the cache
            "hardware": cpu_emulation.cache_hardware(plan.probe), "format": 1}


def reuses(ctx: StageContext) -> str | None:
    return "the baseline's probe results are cached: only the candidate is probed" if _cached(ctx) else None


def _cached(ctx: StageContext) -> Path | None:
    spec: StabilitySpec | None = ctx.recipe.stability
    if spec is None or not spec.baseline_cache:
        return None
    return lookup_parts(STABILITY, lambda: _cache_parts(ctx, tokenizer_dir(ctx), ctx.served_max_model_len()))


def inputs(ctx: StageContext) -> dict[str, Any]:
    return {"stability": ctx.recipe.stability.model_dump(mode="json"), "serving": serve_stage.inputs(ctx)}


def preflight(ctx: StageContext) -> None:
    spec: StabilitySpec = ctx.recipe.stability
    if spec.fallback != "baseline" and "/" in spec.fallback and not ctx.loaded.resolve(spec.fallback).exists():
        raise RecipeError(f"fallback checkpoint '{spec.fallback}' does not exist: name 'baseline', an existing "
                          "folder, or a release name without '/'", file=str(ctx.loaded.path),
                          field="stability.fallback")


def _served_max_len(ctx: StageContext) -> int:
    found = ctx.served_max_model_len()
    if found is None:
        raise CheckError("the served max_model_len is unknown (no serve facts): set serve.engine_args.max_model_len")
    return found


def _rss_sampler(server):
    import psutil

    def sample() -> int | None:
        if server.proc is None:
            return None  # an external server's memory is not visible from here
        try:
            root = psutil.Process(server.proc.pid)
            return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
        except psutil.Error:
            return None

    return sample


def _run_role(ctx: StageContext, role: str, spec: StabilitySpec, prompts, pool, max_len: int, vocab: int
              ) -> dict[str, Any]:
    server = ctx.engine(role)
    started = time.monotonic()
    probes = sum(bool(x) for x in (spec.batch, spec.lengths, spec.determinism, spec.bad_requests, spec.soak))
    with step(ctx.progress, f"stability {role}", total=probes, unit="probes", announce=False) as bar:
        out = probe_server(server, spec, prompts, pool, max_len, vocab,
                           call=lambda name, fn, *a, **k: run_probe(ctx, role, server, name, fn, *a, bar=bar, **k))
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def probe_server(server, spec: StabilitySpec, prompts, pool, max_len: int, vocab: int, *,
                 call=lambda _name, fn, *a, **k: fn(*a, **k)) -> dict[str, Any]:
    """The recipe's stability probes against one server, each through `call(name, fn, ...)`
    (the stage's: progress and a dead server named; scripts/aa_stability.py's: plain)."""
    from quantlab.stability import probe as sp

    url, name, t = server.base_url, server.served_name, spec.request_timeout_s
    out: dict[str, Any] = {}
    if spec.batch:
        out["batch"] = call(f"batch sweep {spec.batch.concurrency}", sp.batch_sweep, url, name, prompts,
                            max_tokens=spec.max_tokens, levels=spec.batch.concurrency, timeout_s=t)
    if spec.lengths:
        out["lengths"] = call(f"length sweep up to max_model_len {max_len}", sp.length_sweep, url, name, pool,
                              max_model_len=max_len, fractions=spec.lengths.fractions,
                              past_limit=spec.lengths.past_limit, max_tokens=spec.max_tokens, timeout_s=t)
    if spec.determinism:
        d = spec.determinism
        out["determinism"] = call(f"determinism x{d.repeats}", sp.determinism, url, name, prompts,
                                  max_tokens=spec.max_tokens, repeats=d.repeats, temperature=d.sampled_temperature,
                                  seed=d.seed, timeout_s=t)
    if spec.bad_requests:
        out["bad_requests"] = call("bad requests", sp.bad_requests, url, name, vocab_size=vocab, timeout_s=t)
    if spec.soak:
        s = spec.soak
        out["soak"] = call(f"soak {s.requests} requests at concurrency {s.concurrency}", sp.soak, url, name,
                           prompts, requests=s.requests, concurrency=s.concurrency, max_tokens=s.max_tokens,
                           timeout_s=t, sample_rss=_rss_sampler(server))
        # quantlab launched it, so its memory must be readable: no samples then is a failure, not "unknown"
        out["soak"]["memory_visible"] = server.proc is not None
    return out


def fallback_rate(stab: dict[str, dict[str, Any]], perf: PerfResult | None) -> dict[str, Any]:
    """Requests the candidate failed (error, timeout, empty or invalid output) that the
    baseline answered, over all stability and performance requests. Length-sweep rows
    pair exactly; the other probes pair by count (max(0, candidate failures - baseline
    failures))."""
    failed = total = 0
    b, c = stab.get("baseline", {}), stab.get("candidate", {})
    if "lengths" in c:
        for cr, br in zip(c["lengths"]["rows"], b.get("lengths", {}).get("rows", []), strict=False):
            total += 1
            failed += int(not cr["ok"] and br["ok"])
    for probe, err_key, n_key in (("batch", "errors", "requests"), ("soak", "errors", "requests")):
        if probe in c:
            total += c[probe][n_key]
            extra = c[probe][err_key] + c[probe].get("empty", 0)
            failed += max(0, extra - (b.get(probe, {}).get(err_key, 0) + b.get(probe, {}).get("empty", 0)))
    if "determinism" in c:
        for mode in ("greedy", "seeded"):
            total += c["determinism"][mode]["compared"] + c["determinism"][mode]["errors"]
            failed += max(0, c["determinism"][mode]["errors"] - b.get("determinism", {}).get(mode, {}).get("errors", 0))
    if perf is not None:
        for p in perf.points:
            n = p.candidate.get("requests") or 0
            total += n
            failed += max(0, round(((p.candidate.get("error_rate") or 0) - (p.baseline.get("error_rate") or 0)) * n))
    return {"requests": total, "candidate_failed_baseline_answered": failed,
            "rate": failed / total if total else None}


def run(ctx: StageContext) -> StabilityResult:
    from quantlab.models.tokenizer import load_tokenizer

    spec: StabilitySpec = ctx.recipe.stability
    out = ctx.run.path / OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    folder = tokenizer_dir(ctx)
    tok = load_tokenizer(folder, trust_remote_code=ctx.recipe.model.trust_remote_code)
    prompts, pool = probe_prompts(tok, spec.prompts)
    max_len = _served_max_len(ctx)
    parts = _cache_parts(ctx, folder, max_len)
    key = cache_key(parts)
    cached = lookup(STABILITY, key) if spec.baseline_cache else None
    stab: dict[str, dict[str, Any]] = {}
    if not cached and spec.concurrent_roles and ctx.recipe.serve.side_by_side:
        ctx.engine("baseline"), ctx.engine("candidate")  # both got here, not from two threads at once
        ctx.progress("stability: baseline and candidate probed at the same time (both servers are up)")
        stab = run_together({role: lambda _stop, r=role: _run_role(ctx, r, spec, prompts, pool, max_len, len(tok))
                             for role in ROLES})
    for role in ROLES:
        rel = f"{OUT_DIR}/{role}.json"
        if role == "baseline" and cached:
            ctx.progress(f"stability baseline: reusing cached results ({key[:12]})")
            stab[role] = json.loads(read_entry_file(STABILITY, cached, "baseline.json"))  # checked against its index
        elif role not in stab:
            stab[role] = _run_role(ctx, role, spec, prompts, pool, max_len, len(tok))
        write_text_atomic(ctx.run.path / rel, json.dumps(stab[role], indent=1, default=str))
        ctx.add_artifact(rel, f"stability-{role}")
        if role == "baseline" and not cached and spec.baseline_cache:
            early = cache_key(_cache_parts(ctx, folder, ctx.recipe_max_model_len()))  # what needs_baseline asks
            with tempfile.TemporaryDirectory() as tmp:  # stored now: a failing candidate does not cost it
                shutil.copyfile(ctx.run.path / rel, Path(tmp) / "baseline.json")
                store(STABILITY, key, Path(tmp), parts, aliases=(early,))
    perf = ctx.run.record.result("performance")
    notes = []
    for role in ROLES:
        accepted = stab[role].get("bad_requests", {}).get("accepted") or []
        if accepted:
            notes.append(f"{role}: the server answered 200 to malformed requests it could have refused: "
                         f"{', '.join(accepted)}")
    return StabilityResult(
        roles=stab, max_model_len=max_len,
        fallback=spec.fallback if spec.fallback != "baseline" else "baseline", baseline_cached=bool(cached),
        fallback_rate=fallback_rate(stab, perf if isinstance(perf, PerfResult) else None),
        gates=stability_gates.verdicts(stab, spec), notes=notes, prompts=len(prompts), prompt_tokens=PROMPT_TOKENS)
