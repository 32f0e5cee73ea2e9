"""Performance of several candidates against one baseline, in one sweep (a comparison run).

The baseline and every candidate are up at once. Blocks are measured in the order of
`candidates/schedule.block_order`: the baseline, then each candidate, then the baseline
again and the candidates backwards (B, C1, C2, B, C2, C1, ...). Every candidate's
ratios pair its block with the baseline block of the same sweep, so each candidate is
judged exactly as in a single run (same gates, intervals, adaptive repeats), while the
baseline is measured once per sweep instead of once per candidate. The measuring itself
is the single run's loop (`performance/measure_loop.py`), given these members and order.

Each candidate's run folder gets its own copy of the baseline's per-request rows, so its
record, report and plots stand alone.
"""

from __future__ import annotations

from quantlab.pipeline.candidates.schedule import BASELINE, block_order, one_sweep
from quantlab.pipeline.context import RunContext
from quantlab.core.results import PerfResult
from quantlab.performance import noise_store
from quantlab.performance import stage as single
from quantlab.performance.measure_loop import Member, Sweep, looks_for, measure_blocks, more_repeats
from quantlab.performance.result import Measured
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
    members = {name: Member(ctxs[name], Measured(host_noise=noise_store.for_run(ctxs[name], spec)))
               for name in names}
    shared = Sweep(spec, requests, members, server=lambda role: _server(ctxs, role), block_of=one_sweep,
                   device=first.serving_plan().device, progress=first.progress,
                   title="performance: load points (shared baseline)")
    order = block_order(names, spec.repeats)
    measure_blocks(shared, order)
    looks = looks_for(spec, True, [])
    if looks > 1:
        order = more_repeats(shared, order, looks=looks).order
    labels = [f"{role}#{rep + 1}" for rep, role in order]
    return {name: _result(name, ctxs[name], spec, members[name].measured, client, order, labels, names, looks)
            for name in names}


def _server(ctxs: dict[str, RunContext], role: str):
    """The shared baseline (every candidate's context holds the same one) or a candidate's own."""
    name = next(iter(ctxs)) if role == BASELINE else role
    return ctxs[name].engine("baseline" if role == BASELINE else "candidate")


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
