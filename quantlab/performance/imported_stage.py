"""Performance on imported evidence (`quantlab decide`): per-request rows from `vllm bench serve
--save-detailed` or GuideLLM, the baseline's and the candidate's, read from the run's copies
(release/evidence_stage.py) and judged by the same gates, intervals and noise model as a run's
own load (performance/result.points_of).

Each file (or each benchmark of a GuideLLM report) is one repeat at one workload point of the
recipe, found by its concurrency or request rate. What quantlab's own load does and these files
cannot: interleave the roles' repeats on one host (so a drift between the baseline's and the
candidate's sessions lands in the ratio), pool a calibrated host noise (the host is not this
one), and watch memory. The report says so; the interval rests on the files' own repeats."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantlab.core.errors import CheckError, RecipeError
from quantlab.core.evidence import BENCH, OPTION
from quantlab.core.layout import PERF_DIR
from quantlab.core.results import EvidenceResult, PerfResult
from quantlab.core.roles import BASELINE, CANDIDATE, ROLES
from quantlab.core.stage_context import StageContext
from quantlab.performance import gates as perf_gates
from quantlab.performance.bench_files import BenchRun, point_of, read_bench_file
from quantlab.performance.metrics import summarize
from quantlab.performance.noise import RepeatSample
from quantlab.performance.result import Measured, headline_cost, load_points, points_of
from quantlab.recipe.performance import PerformanceSpec

NAME = "performance"
MEMORY_KEYS = ("checkpoint_bytes_on_disk", "kv_cache_tokens", "kv_cache_dtype", "peak_bytes", "device_memory_bytes",
               "headroom_bytes")
NOT_INTERLEAVED = ("imported benchmark files: quantlab did not interleave the roles' repeats, so a drift of the "
                   "host between the baseline's and the candidate's sessions is inside the ratio; no calibrated host "
                   "noise is pooled (the files were measured elsewhere), so each interval rests on the files' own "
                   "repeats, and memory was not watched")


def enabled(ctx: StageContext) -> bool:
    return ctx.recipe.performance is not None and bool(getattr(ctx, "evidence", None) and ctx.evidence.bench)


def inputs(ctx: StageContext) -> dict[str, Any]:
    return {"performance": ctx.recipe.performance.model_dump(mode="json")}


def preflight(ctx: StageContext) -> None:
    runs = {role: [r for p in files for r in read_bench_file(Path(p))] for role, files in ctx.evidence.bench.items()}
    placed(ctx, runs)


def placed(ctx: StageContext, runs: dict[str, list[BenchRun]]) -> dict[tuple[str, str], dict[str, list[BenchRun]]]:
    """Each role's runs at the recipe's workload points: {(workload, point): {role: repeats}}.
    Refused (exit 2) when a file's point is not the recipe's, when the recipe's point has no
    file, or when the roles' repeats at a point differ in number or are fewer than two."""
    spec: PerformanceSpec = ctx.recipe.performance
    where: dict[str, list[str]] = {}
    for w in spec.workloads:
        for point, _, _ in load_points(w):
            where.setdefault(point, []).append(w.name)
    recipe_file = str(ctx.loaded.path)
    served = ctx.recipe.serve.served_model_name
    baseline_names = {str(ctx.recipe.model.source)} | ({served} if served else set())
    out: dict[tuple[str, str], dict[str, list[BenchRun]]] = {}
    for role in ROLES:
        for run in runs.get(role, []):
            point = point_of(run)
            names = where.get(point, [])
            if len(names) != 1:
                why = ("is not a point of any workload in the recipe" if not names else
                       f"is a point of several workloads ({', '.join(names)}): give one workload per decision")
                raise RecipeError(f"{run.file} (benchmark {run.index + 1}) ran at {point}, which {why}; the recipe's "
                                  f"points: {', '.join(sorted(where))}. Add the point to performance.workloads, or "
                                  "leave the file out", file=str(run.file), field=OPTION[BENCH].format(role=role))
            out.setdefault((names[0], point), {r: [] for r in ROLES})[role].append(run)
    missing = [f"{w}/{p}" for p, ws in where.items() for w in ws if (w, p) not in out]
    if missing:
        raise RecipeError(f"no benchmark file measured the recipe's point(s) {', '.join(missing)}: give files "
                          "measured there for both roles, or remove the point from performance.workloads",
                          file=recipe_file, field="performance.workloads")
    for (w, p), by_role in out.items():
        counts = {r: len(by_role[r]) for r in ROLES}
        if counts[BASELINE] != counts[CANDIDATE] or counts[BASELINE] < 2:
            raise RecipeError(f"{w}/{p}: {counts[BASELINE]} baseline and {counts[CANDIDATE]} candidate repeat(s); "
                              "the gates pair the roles' repeats, so each role needs the same number, at least 2 "
                              "(each repeat a separate benchmark run, alternating the roles if you can)",
                              file=recipe_file, field="--candidate-bench")
        comparable(f"{w}/{p}", by_role, baseline_names)
    return out


PROMPT_TOLERANCE = 0.10  # the roles' mean prompt lengths at a point may differ this much (same dataset, seed)


def comparable(where: str, by_role: dict[str, list[BenchRun]], baseline_names: set[str]) -> None:
    """The roles' files at one point measure the same load: one tool, the same number of requests
    a repeat, prompts of the same length, and the baseline's files name the baseline. A ratio of
    two tools, or of two workloads, shows neither model's speed."""
    runs = [r for role in ROLES for r in by_role[role]]
    tools = sorted({r.tool for r in runs})
    if len(tools) > 1:
        _refuse(runs[-1], f"{where} was measured by {' and '.join(tools)}: tools time requests differently, so a ratio "
                "across them measures the tools. Measure both roles with one tool")
    for b, c in zip(by_role[BASELINE], by_role[CANDIDATE], strict=True):
        if len(b.records) != len(c.records):
            _refuse(c, f"{where}: this candidate repeat sent {len(c.records)} requests, its baseline repeat "
                    f"({b.file.name}) {len(b.records)}: give both roles the same --num-prompts")
    means = {role: _mean_prompt(by_role[role]) for role in ROLES}
    if all(means.values()) and abs(means[CANDIDATE] / means[BASELINE] - 1) > PROMPT_TOLERANCE:
        _refuse(by_role[CANDIDATE][0], f"{where}: the candidate's prompts average {means[CANDIDATE]:.0f} tokens, the "
                f"baseline's {means[BASELINE]:.0f}: another workload. Give both roles the same dataset, lengths "
                "and seed")
    for run in by_role[BASELINE]:
        model = run.facts.get("model")
        if model is not None and model not in baseline_names:
            _refuse(run, f"{where}: this baseline benchmark names its model '{model}', the recipe's baseline is "
                    f"{' or '.join(sorted(baseline_names))}: another model's. Give the baseline's own files, or set "
                    "model.source (or serve.served_model_name) to the model it measured", role=BASELINE)


def _mean_prompt(runs: list[BenchRun]) -> float | None:
    tokens = [r.prompt_tokens for run in runs for r in run.records if r.prompt_tokens]
    return sum(tokens) / len(tokens) if tokens else None


def _refuse(run: BenchRun, why: str, role: str = CANDIDATE) -> None:
    raise RecipeError(why, file=str(run.file), field=OPTION[BENCH].format(role=role))


def run(ctx: StageContext) -> PerfResult:
    spec: PerformanceSpec = ctx.recipe.performance
    evidence = ctx.run.record.result("evidence")
    if not isinstance(evidence, EvidenceResult) or set(evidence.bench) != set(ROLES):
        raise CheckError("no imported benchmark files in this run's evidence: run it from its first stage")
    runs = {role: [r for rel in evidence.bench[role] for r in read_bench_file(ctx.run.path / rel)] for role in ROLES}
    at = placed(ctx, runs)
    measured = _measured(spec, at, ctx.run.path)
    notes = [NOT_INTERLEAVED]
    points = points_of(spec, measured, None, notes, looks=1)
    facts = {role: _facts(runs[role]) for role in ROLES}
    (ctx.run.path / PERF_DIR).mkdir(parents=True, exist_ok=True)  # the plots' folder
    return PerfResult(
        interleaved=False, order=[],  # the files do not say in what order the roles' sessions ran
        points=points, client=None, client_cpu_share=0.0,
        memory={role: dict.fromkeys(MEMORY_KEYS) | {"peak_is": "not recorded by the benchmark files"} for role in ROLES},
        cost={role: headline_cost(points, role, spec.price_per_hour) for role in ROLES},
        gates=perf_gates.verdicts(points, spec.gates), plots=[], notes=notes,
        workload_context={"label": f"{ctx.recipe.name} on imported benchmark files", "recipe": ctx.recipe.name,
                          "imported": True, "device": None, "hardware": facts[CANDIDATE].get("hardware"),
                          "vllm": facts[CANDIDATE].get("engine_version"), "files": facts,
                          "workloads": [w.model_dump(mode="json") for w in spec.workloads]})


def _measured(spec: PerformanceSpec, at: dict[tuple[str, str], dict[str, list[BenchRun]]], run_path: Path) -> Measured:
    """What a run's own load would have measured, from the files: per point and role, each
    repeat's metrics and its requests (no monitor, no interleaving, no host noise)."""
    slo = spec.slo.model_dump()
    m = Measured()
    for key, by_role in at.items():
        m.metrics[key] = {r: [summarize(x.records, wall_s=x.wall_s, slo=slo, price_per_hour=spec.price_per_hour)
                              for x in by_role[r]] for r in ROLES}
        m.monitor[key] = {r: [] for r in ROLES}
        m.samples[key] = {r: [RepeatSample.of(x.records, x.wall_s) for x in by_role[r]] for r in ROLES}
        m.raw[key] = [_rel(x.file, run_path) for r in ROLES for x in by_role[r]]
    return m


def _rel(path: Path, run_path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path(run_path).resolve()))
    except ValueError:
        return str(path)


def _facts(runs: list[BenchRun]) -> dict[str, Any]:
    """What a role's files say (the first's, with what any file leaves unknown)."""
    if not runs:
        return {}
    first = runs[0]
    return {**first.facts, "tool": first.tool, "unknown": sorted({u for r in runs for u in r.unknown})}
