"""Performance of several candidates against one baseline, in one sweep (a comparison run).

The baseline and every candidate are up at once. Blocks are measured in the order of
`candidates/schedule.block_order`: the baseline, then each candidate, then the baseline
again and the candidates backwards (B, C1, C2, B, C2, C1, ...). Every candidate's
ratios pair its block with the baseline block of the same sweep, so each candidate is
judged exactly as in a single run (same gates, intervals, adaptive repeats), while the
baseline is measured once per sweep instead of once per candidate.

Each candidate's run folder gets its own copy of the baseline's per-request rows, so its
record, report and plots stand alone.
"""

from __future__ import annotations

import shutil

from quantlab.pipeline.candidates.schedule import BASELINE, block_order
from quantlab.pipeline.context import RunContext
from quantlab.core.progress import step
from quantlab.core.results import PerfResult
from quantlab.performance import noise_store
from quantlab.performance import stage as single
from quantlab.performance.result import Measured, load_points, points_of
from quantlab.performance.noise import RepeatSample
from quantlab.recipe.performance import PerformanceSpec


def run_shared(ctxs: dict[str, RunContext]) -> dict[str, PerfResult]:
    """Measure the candidates named by `ctxs` (all serving, with the same baseline server)
    and return each one's PerfResult. The recipes' performance sections are equal (the
    comparison checks it before anything starts)."""
    from quantlab.performance.loadgen import measure_client_ceiling

    names = list(ctxs)
    first = ctxs[names[0]]
    spec: PerformanceSpec = first.recipe.performance
    for ctx in ctxs.values():
        (ctx.run.path / single.OUT_DIR).mkdir(parents=True, exist_ok=True)
    client = None
    if spec.client_check:
        first.progress("performance: measuring the load generator's own ceiling against a stub server")
        client = measure_client_ceiling()
    requests = single.requests_for(first, spec)
    measured = {name: Measured(host_noise=noise_store.for_run(ctxs[name], spec)) for name in names}
    warmed: set[tuple[str, str]] = set()
    order = block_order(names, spec.repeats)
    _measure_blocks(ctxs, spec, order, requests, measured, warmed, only=None)
    looks = single.looks_for(spec, True, [])
    for rep in range(spec.repeats, spec.max_repeats or spec.repeats):
        undecided = {name: single.undecided_points(spec, points_of(spec, measured[name], None, [],
                                                                           looks=looks)) for name in names}
        undecided = {name: pts for name, pts in undecided.items() if pts}
        if not undecided:
            break
        first.progress(f"performance: points not decided yet for {', '.join(undecided)}; measuring repeat "
                       f"{rep + 1} of at most {spec.max_repeats}")
        sweep = [n for n in (names if rep % 2 == 0 else names[::-1]) if n in undecided]
        block = [(rep, BASELINE)] + [(rep, n) for n in sweep]
        _measure_blocks(ctxs, spec, block, requests, measured, warmed, only=undecided)
        order += block
    labels = [f"{role}#{rep + 1}" for rep, role in order]
    return {name: _result(name, ctxs[name], spec, measured[name], client, order, labels, names, looks)
            for name in names}


def _server(ctxs: dict[str, RunContext], role: str):
    """The shared baseline (every candidate's context holds the same one) or a candidate's own."""
    name = next(iter(ctxs)) if role == BASELINE else role
    return ctxs[name].engine("baseline" if role == BASELINE else "candidate")


def _measure_blocks(ctxs: dict[str, RunContext], spec: PerformanceSpec, order: list[tuple[int, str]],
                    requests: dict[str, list], measured: dict[str, Measured], warmed: set[tuple[str, str]],
                    *, only: dict[str, set[tuple[str, str]]] | None) -> None:
    first = ctxs[next(iter(ctxs))]
    device = first.serving_plan().device
    slo = spec.slo.model_dump()

    def wanted(role: str) -> set[tuple[str, str]] | None:
        if only is None:
            return None
        if role == BASELINE:  # the baseline is measured at every point some candidate still needs
            return set().union(*only.values())
        return only.get(role, set())

    total = sum(1 for _, role in order for w in spec.workloads for pt in load_points(w)
                if wanted(role) is None or (w.name, pt[0]) in wanted(role))
    with step(first.progress, "performance: load points (shared baseline)", total=total, unit="points",
              announce=False) as bar:
        for block, (rep, role) in enumerate(order, 1):
            server = _server(ctxs, role)
            # the baseline's rows go to the first candidate's folder, then are copied to the others'
            owner = first if role == BASELINE else ctxs[role]
            label = "baseline" if role == BASELINE else "candidate"
            pick = wanted(role)
            for w in spec.workloads:
                if pick is not None and not any((w.name, pt[0]) in pick for pt in load_points(w)):
                    continue
                reqs = [single.for_server(r, server.served_name) for r in requests[w.name]]
                single.warm_up(server, role, w, reqs, warmed)
                for point, conc, rate in load_points(w):
                    if pick is not None and (w.name, point) not in pick:
                        continue
                    bar.detail(f"performance [{block}/{len(order)}] {role} repeat {rep + 1}: {w.name} {point}")
                    metrics, msum, rel, result = single.measure_point(owner, server, label, rep, w, reqs, point, conc,
                                                                 rate, device=device, slo=slo)
                    sample = RepeatSample.of(result.records, result.wall_s)
                    targets = [n for n in ctxs if role == BASELINE and (only is None or (w.name, point) in
                                                                         only.get(n, set()))] \
                        if role == BASELINE else [role]
                    for name in targets:
                        if ctxs[name] is not owner:
                            dest = ctxs[name].run.path / rel
                            shutil.copyfile(owner.run.path / rel, dest)
                            ctxs[name].add_artifact(rel, "perf-requests")
                        m = measured[name]
                        key = (w.name, point)
                        m.metrics.setdefault(key, {}).setdefault(label, []).append(metrics)
                        m.monitor.setdefault(key, {}).setdefault(label, []).append(msum)
                        m.raw.setdefault(key, []).append(rel)
                        m.samples.setdefault(key, {}).setdefault(label, []).append(sample)
                        m.sequence.setdefault(key, []).append(label)
                        m.cpu_s += result.client_cpu_s
                        m.wall_s += result.wall_s
                    bar.advance()


def _result(name: str, ctx: RunContext, spec: PerformanceSpec, measured: Measured, client: dict | None,
            order: list[tuple[int, str]], labels: list[str], names: list[str], looks: int) -> PerfResult:
    notes = [f"measured in one comparison with {len(names) - 1} other candidate(s) ({', '.join(names)}): the "
             f"baseline's blocks are shared, each candidate's ratios pair its block with the baseline block of the "
             f"same sweep"] if len(names) > 1 else []
    if looks > 1:
        notes.append(f"adaptive repeats: up to performance.max_repeats {spec.max_repeats}; the fail side's alpha is "
                     f"split over {looks} looks")
    mine = [(rep, role) for rep, role in order if role in (BASELINE, name)]
    # a baseline block counts for this candidate only when this candidate was measured in that sweep
    reps = {rep for rep, role in mine if role == name}
    own_order = [f"{'baseline' if role == BASELINE else 'candidate'}#{rep + 1}" for rep, role in mine if rep in reps]
    return single.result_of(ctx, spec, measured, client, notes, looks=looks, interleaved=True, order=own_order,
                            measured_together=["baseline", *names], comparison_order=labels)
