"""This host's performance noise, kept in the cache: the between-repeat spread of each gated
figure at each workload point, from outside any one run (noise.HostNoise), so that a run of
2-3 paired repeats judges with tens of degrees of freedom instead of k - 1.

Keyed per workload point by what makes two spreads comparable: the host's hardware
(core/cpu_emulation.cache_hardware), the engine's version, the device, the baseline's
weights, the engine args (redacted), side_by_side, and the point itself (the workload
fields that shape its requests: api, prompt and output tokens, the dataset's digest,
num_requests, the concurrency or rate). A recipe's name, repeats and gates are not in it.

Two kinds of contribution, each one file under `<cache>/perf-noise/<key>/`, written once and
never rewritten (two runs storing at once never race), named by kind and run id (a run adds
each kind once):
- "aa": an A/A run's repeats (both servers serve the baseline's weights, measured as the
  stage measures: `quantlab calibrate`, or any run whose candidate is the baseline's
  weights). Each repeat's log(candidate / baseline) figure x; the expected ratio is 1, so
  ss = sum(x^2) over df = n (a residual bias between the two servers counts as noise:
  conservative).
- "baseline": an ordinary run's baseline repeats (stored by every performance stage, free).
  Per run, the log figures' deviations from their run mean; a ratio of two independent
  blocks has twice one block's variance, so ss = 2 x sum((x - mean)^2) over df = k - 1
  (host drift that pairing cancels counts here too: conservative).
The per-repeat figures are the gate's own (noise.per_repeat_figures).

Each file holds its figures and the parts of its key, with an HMAC under this user's cache
secret (core/cache_secret, as core/result_cache authenticates its entries) over the store's
kind, the key, the file's name and its body: a file written or edited by someone without the
secret is skipped with a CacheEntryWarning, never pooled.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from quantlab.core import cpu_emulation, redact, result_cache, signed_entries
from quantlab.core.fsutil import sha256_file
from quantlab.core.roles import BASELINE, CANDIDATE
from quantlab.core.run import now_iso
from quantlab.core.stage_context import StageContext
from quantlab.performance.noise import RESAMPLED, HostNoise, RepeatSample, per_repeat_figures
from quantlab.recipe.performance import PerformanceSpec, Workload

KIND = "perf-noise"  # the cache folder
AA = "aa"
BASELINE_REPEATS = "baseline"
CONTRIBUTIONS = (AA, BASELINE_REPEATS)
FORMAT = 1
METRICS = RESAMPLED  # the gated figures' keys (performance/gates.PERF_GATES)


def workload_point(w: Workload, point: str, dataset_sha256: str | None) -> dict[str, Any]:
    """What shapes one load point's requests and batches (not the recipe's name, repeats or gates)."""
    from quantlab.performance.result import load_points

    found = [(conc, rate) for name, conc, rate in load_points(w) if name == point]
    if not found:
        raise ValueError(f"workload '{w.name}' has no point '{point}'")
    conc, rate = found[0]
    return {"api": w.api, "prompt_tokens": w.prompt_tokens, "output_tokens": w.output_tokens,
            "dataset_sha256": dataset_sha256, "num_requests": w.num_requests, "duration_s": w.duration_s,
            "concurrency": conc, "rate": rate, "seed": w.seed}


def point_parts(ctx: StageContext, w: Workload, point: str, *, plan: Any = None) -> dict[str, Any]:
    """The store's key parts for one point of this run (plan: the serving plan to key by;
    by default the run's, or the predicted one before the checkpoint exists)."""
    if plan is None:
        ready = (ctx.checkpoint_dir / "config.json").is_file()
        plan = ctx.serving_plan(predicted=not ready)
    dataset = sha256_file(ctx.loaded.resolve(w.dataset)) if w.dataset else None
    return {"format": FORMAT, "hardware": cpu_emulation.cache_hardware(plan.probe),
            "engine": (plan.probe.get("versions") or {}).get("vllm"), "device": plan.device,
            "baseline": ctx.baseline_identity(),
            "engine_args": redact.engine_args(plan.engine_args),  # written into the store: no secret
            "side_by_side": ctx.recipe.serve.side_by_side, "point": workload_point(w, point, dataset)}


def key_of(parts: dict[str, Any]) -> str:
    return result_cache.cache_key(parts)


def store_root() -> Path:
    return result_cache.cache_root(KIND)


def ss_df(kind: str, figures: list[float] | np.ndarray) -> tuple[float, int]:
    """One contribution's log-ratio-equivalent sum of squares and its degrees of freedom."""
    x = np.log(np.asarray(figures, dtype=float))
    x = x[np.isfinite(x)]
    if kind == AA:
        return float(np.sum(x ** 2)), len(x)
    if kind == BASELINE_REPEATS:
        if len(x) < 2:
            return 0.0, 0
        return float(2.0 * np.sum((x - x.mean()) ** 2)), len(x) - 1
    raise ValueError(f"unknown noise contribution kind {kind!r}; expected one of {CONTRIBUTIONS}")


def _file_name(kind: str, run_id: str) -> str:
    safe = run_id if re.fullmatch(r"[A-Za-z0-9._-]{1,80}", run_id) else result_cache.cache_key({"run": run_id})[:32]
    return f"{kind}-{safe}.json"


def add(parts: dict[str, Any], kind: str, run_id: str, figures: dict[str, list[float]], *,
        recipe: str | None = None, origin: str | None = None) -> Path | None:
    """Store one run's contribution of `kind` for the point these parts key (figures: metric ->
    the per-repeat figures, positive and finite); None when this run already added one of
    this kind there (one per run, never rewritten) or no metric has a usable figure."""
    if kind not in CONTRIBUTIONS:
        raise ValueError(f"unknown noise contribution kind {kind!r}; expected one of {CONTRIBUTIONS}")
    kept = {m: [float(v) for v in vs if np.isfinite(v) and v > 0] for m, vs in figures.items() if m in METRICS}
    kept = {m: vs for m, vs in kept.items() if ss_df(kind, vs)[1] > 0}
    if not kept:
        return None
    body = {"format": FORMAT, "kind": kind, "run": run_id, "recipe": recipe, "origin": origin,
            "date": now_iso(), "figures": kept, "parts": json.loads(json.dumps(parts, default=str))}
    return signed_entries.write_once(KIND, key_of(parts), _file_name(kind, run_id), body)


def contributions(parts: dict[str, Any], *, exclude_run: str | None = None) -> list[dict[str, Any]]:
    """The authenticated contributions for the point these parts key (bodies, oldest first);
    one that does not authenticate is skipped with a warning."""
    out = [body for body in signed_entries.read_all(KIND, key_of(parts), what="performance noise",
                                                    remedy="`quantlab calibrate` stores new ones")
           if _usable(body) and body.get("run") != exclude_run]
    return sorted(out, key=lambda b: (b["date"], b["run"]))


def _usable(body: dict[str, Any]) -> bool:
    return body.get("format") == FORMAT and body.get("kind") in CONTRIBUTIONS and isinstance(body.get("figures"), dict)


def host_noise(parts: dict[str, Any], metric: str, *, exclude_run: str | None = None) -> HostNoise | None:
    """The store's evidence on one figure's between-repeat spread at one point, summed over its
    contributions (None when it holds none for this metric); `exclude_run`: the judging run's
    own baseline repeats, which its own interval already counts."""
    ss, df = 0.0, 0
    groups: dict[str, list[tuple[str, int]]] = {AA: [], BASELINE_REPEATS: []}
    for body in contributions(parts, exclude_run=exclude_run):
        figures = body["figures"].get(metric)
        if not isinstance(figures, list):
            continue
        try:
            s, d = ss_df(body["kind"], figures)
        except (TypeError, ValueError):
            continue
        if d:
            ss, df = ss + s, df + d
            groups[body["kind"]].append((str(body.get("date", ""))[:10], d))
    if not df:
        return None
    return HostNoise(ss=ss, df=df, sources=tuple(_source_line(kind, got) for kind, got in groups.items() if got))


def _source_line(kind: str, got: list[tuple[str, int]]) -> str:
    dates = sorted(d for d, _ in got)
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    df = sum(d for _, d in got)
    if kind == AA:
        return f"{df} A/A repeats from {len(got)} calibration run(s) ({when})"
    return f"{df} df from {len(got)} earlier run(s)' baseline repeats ({when})"


def describe(noise: HostNoise | None, own_df: int) -> str:
    """Which noise model judges a figure, in words (the dry run's and the report's line)."""
    if noise is None:
        return f"the run's own repeats: {own_df} df"
    return f"host calibration: {noise.df} df from {'; '.join(noise.sources)}, pooled with the run's own {own_df}"


# the stage's side ----------------------------------------------------------------------------


def for_run(ctx: StageContext, spec: PerformanceSpec, *, plan: Any = None
            ) -> dict[tuple[str, str], dict[str, HostNoise]]:
    """Per (workload, point), per metric: the host noise this run's intervals pool (none when
    performance.host_noise is off). This run's own contributions are left out."""
    from quantlab.performance.result import load_points

    if not spec.host_noise:
        return {}
    run_id = ctx.run.record.run_id
    out: dict[tuple[str, str], dict[str, HostNoise]] = {}
    for w in spec.workloads:
        for point, _, _ in load_points(w):
            parts = point_parts(ctx, w, point, plan=plan)
            found = {m: n for m in METRICS if (n := host_noise(parts, m, exclude_run=run_id)) is not None}
            if found:
                out[(w.name, point)] = found
    return out


def is_aa_run(ctx: StageContext) -> bool:
    """Whether this run's candidate is the baseline's own weights (an A/A run: `quantlab
    calibrate`, or validate given the baseline's folder): its repeats are A/A repeats."""
    q = ctx.run.record.result("quantize") or ctx.run.record.result("checkpoint")
    weights = getattr(q, "weights_sha256", None)
    files = (ctx.baseline_identity() or {}).get("files")
    if not weights or not isinstance(files, dict):
        return False
    return weights == {n: s for n, s in files.items() if n.endswith(".safetensors")}


def record_run(ctx: StageContext, spec: PerformanceSpec, samples: dict[tuple[str, str], dict[str, list[RepeatSample]]],
               *, plan: Any = None) -> tuple[str, int]:
    """Store this run's repeats: an A/A run's per-repeat ratios, else its baseline's per-repeat
    figures. Returns (the kind stored, how many points got a contribution)."""
    from quantlab.performance.result import load_points

    kind = AA if is_aa_run(ctx) else BASELINE_REPEATS
    stored = 0
    for w in spec.workloads:
        for point, _, _ in load_points(w):
            got = samples.get((w.name, point)) or {}
            b, c = got.get(BASELINE, []), got.get(CANDIDATE, [])
            if not b or (kind == AA and not c):
                continue
            figures = {m: per_repeat_figures(b, c if kind == AA else None, m).tolist() for m in METRICS}
            if add(point_parts(ctx, w, point, plan=plan), kind, ctx.run.record.run_id, figures,
                   recipe=ctx.recipe.name, origin="A/A run" if kind == AA else "baseline repeats") is not None:
                stored += 1
    return kind, stored
