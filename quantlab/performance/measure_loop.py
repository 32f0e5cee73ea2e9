"""The performance measuring loop: (repeat, role) blocks of every workload point on the
servers that are up, each server warmed up once per workload, the engines' placement set
before each block where it can be, then adaptive repeats of the points whose gates the
noise leaves undecided.

Two callers describe their run as a `Sweep` and share this loop: a single run's stage
(`performance/stage.py`: one member named "candidate", blocks A B B A ...) and a
comparison (`pipeline/candidates/shared_performance.py`: several candidates against one
shared baseline, in the block order of `pipeline/candidates/schedule.py`). A role is the
baseline or a member's name; a member's measurements are filed under "baseline" and
"candidate", so each is judged as in a single run."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable

from quantlab.core.engine_time import engine_busy
from quantlab.core.errors import EngineError
from quantlab.core.fsutil import write_text_atomic
from quantlab.core.layout import PERF_DIR
from quantlab.core.progress import Progress, step
from quantlab.core.results import PerfPoint
from quantlab.core.roles import BASELINE, CANDIDATE
from quantlab.core.stage_context import StageContext
from quantlab.performance import gates as perf_gates
from quantlab.performance.metrics import summarize
from quantlab.performance.noise import RepeatSample
from quantlab.performance.result import Measured, load_points, points_of
from quantlab.recipe.performance import PerformanceSpec, Workload

WARMUP_OUTPUT_TOKENS = 16
Block = tuple[int, str]  # (repeat, role)
Only = dict[str, set[tuple[str, str]]]  # member -> the (workload, point) pairs it still needs


@dataclass
class Member:
    """A candidate measured in the loop: its run (where its rows are filed) and what it measured."""

    ctx: StageContext
    measured: Measured


@dataclass
class Sweep:
    """What differs between a single run and a comparison. The baseline's rows are filed in
    the first member's folder and copied to every other member that needed that point."""

    spec: PerformanceSpec
    requests: dict[str, list]  # each workload's requests (stage.requests_for)
    members: dict[str, Member]
    server: Callable[[str], Any]  # role -> its server, asked at each block (one-at-a-time serving starts it then)
    block_of: Callable[[int, list[str]], list[Block]]  # an adaptive repeat's blocks for the members named
    device: str
    progress: Progress
    title: str = "performance: load points"
    warmed: set[tuple[str, str]] = field(default_factory=set)  # (role, workload) already warmed up
    place: Callable[[int], None] | None = None  # before each block: the engines' placement for that repeat


@dataclass
class Repeats:
    """What the adaptive repeats did: every block in measuring order, and where they stopped
    early (every member decided) the repeat and the points each member was last judged on."""

    order: list[Block]
    stopped_at: int | None = None
    points: dict[str, list[PerfPoint]] = field(default_factory=dict)


def measure_blocks(sweep: Sweep, order: list[Block], only: Only | None = None) -> None:
    """Every point of every workload (or only those some member still needs), on each role's
    server in the order given, filed into the members' measurements."""
    spec = sweep.spec
    picks = [(rep, role, _wanted(only, role)) for rep, role in order]
    total = sum(1 for _, _, pick in picks for w in spec.workloads for pt in load_points(w)
                if pick is None or (w.name, pt[0]) in pick)
    with step(sweep.progress, sweep.title, total=total, unit="points", announce=False) as bar:
        for block, (rep, role, pick) in enumerate(picks, 1):
            if sweep.place is not None:
                sweep.place(rep)
            _measure_block(sweep, bar, f"[{block}/{len(order)}]", (rep, role), pick, only)


def _wanted(only: Only | None, role: str) -> set[tuple[str, str]] | None:
    if only is None:
        return None
    if role == BASELINE:  # the baseline is measured at every point some member still needs
        return set().union(*only.values())
    return only.get(role, set())


def _measure_block(sweep: Sweep, bar, where: str, block: Block, pick: set[tuple[str, str]] | None,
                   only: Only | None) -> None:
    rep, role = block
    server = sweep.server(role)
    owner = next(iter(sweep.members.values())).ctx if role == BASELINE else sweep.members[role].ctx
    label = BASELINE if role == BASELINE else CANDIDATE
    slo = sweep.spec.slo.model_dump()
    for w in sweep.spec.workloads:
        points = [pt for pt in load_points(w) if pick is None or (w.name, pt[0]) in pick]
        if not points:
            continue
        reqs = [for_server(r, server.served_name) for r in sweep.requests[w.name]]
        warm_up(server, role, w, reqs, sweep.warmed)
        for point, conc, rate in points:
            bar.detail(f"performance {where} {role} repeat {rep + 1}: {w.name} {point}, {len(reqs)} requests")
            got = measure_point(owner, server, label, rep, w, reqs, point, conc, rate, device=sweep.device, slo=slo)
            targets = [n for n in sweep.members if only is None or (w.name, point) in only.get(n, set())] \
                if role == BASELINE else [role]
            for name in targets:
                _file(sweep.members[name], owner, label, (w.name, point), got)
            bar.advance()


def _file(member: Member, owner: StageContext, label: str, key: tuple[str, str], got: tuple) -> None:
    """One measured point into a member's measurements (the rows copied into its folder
    when another member's run holds them)."""
    metrics, msum, rel, result = got
    if member.ctx is not owner:
        shutil.copyfile(owner.run.path / rel, member.ctx.run.path / rel)
        member.ctx.add_artifact(rel, "perf-requests")
    m = member.measured
    m.metrics.setdefault(key, {}).setdefault(label, []).append(metrics)
    m.monitor.setdefault(key, {}).setdefault(label, []).append(msum)
    m.raw.setdefault(key, []).append(rel)
    m.samples.setdefault(key, {}).setdefault(label, []).append(RepeatSample.of(result.records, result.wall_s))
    m.sequence.setdefault(key, []).append(label)
    m.cpu_s += result.client_cpu_s
    m.wall_s += result.wall_s


def more_repeats(sweep: Sweep, order: list[Block], *, looks: int) -> Repeats:
    """One more repeat at a time of the points some member has not decided (the baseline and
    those members only), until every member's are decided or performance.max_repeats is
    reached."""
    spec = sweep.spec
    out = Repeats(order=list(order))
    points = {name: points_of(spec, m.measured, None, [], looks=looks) for name, m in sweep.members.items()}
    for rep in range(spec.repeats, spec.max_repeats or spec.repeats):
        undecided = {name: pts for name in sweep.members if (pts := undecided_points(spec, points[name]))}
        if not undecided:
            out.stopped_at, out.points = rep, points
            return out
        count = sum(len(pts) for pts in undecided.values())
        whose = f" for {', '.join(undecided)}" if len(sweep.members) > 1 else ""
        sweep.progress(f"performance: {count} point(s) not decided yet{whose}, measuring repeat {rep + 1} of at "
                       f"most {spec.max_repeats}")
        block = sweep.block_of(rep, list(undecided))
        measure_blocks(sweep, block, only=undecided)
        out.order += block
        points.update({name: points_of(spec, sweep.members[name].measured, None, [], looks=looks)
                       for name in undecided})
    out.points = points
    return out


def looks_for(spec: PerformanceSpec, interleaved: bool, notes: list[str]) -> int:
    """How many times the gates may be looked at (the first measurement plus one per
    adaptive repeat); the fail side's alpha is split over them."""
    if spec.max_repeats is None or spec.max_repeats == spec.repeats:
        return 1
    if not interleaved:
        notes.append("performance.max_repeats is set but serve.side_by_side is false: adaptive repeats need both "
                     "servers up, so exactly `repeats` were measured")
        return 1
    return spec.max_repeats - spec.repeats + 1


def undecided_points(spec: PerformanceSpec, points: list[PerfPoint]) -> set[tuple[str, str]]:
    """(workload, point) of every gate the noise leaves not shown; none once an error-rate
    gate failed: the run is blocked whatever more repeats show, and pooling more requests
    into the count could only dilute the failure into a pass."""
    judged = perf_gates.verdicts(points, spec.gates)
    if error_rate_failed(judged):
        return set()
    return {tuple(v.scope.split("/", 1)) for v in judged if v.verdict == "inconclusive" and v.value is not None}


def error_rate_failed(judged: list) -> list[str]:
    """The scopes whose error-rate gate failed."""
    return [v.scope for v in judged if v.gate == "max_error_rate" and v.verdict == "fail"]


def warm_up(server, role: str, w: Workload, reqs: list, warmed: set[tuple[str, str]]) -> None:
    """Once per server and workload, before its first measured point: what warming pays
    for (a CPU engine's first batch of a new size, first-use allocations) happens once."""
    from quantlab.performance.loadgen import run_point

    if not w.warmup_requests or (role, w.name) in warmed:
        return
    top = max(w.concurrency or [1])
    with engine_busy():
        run_point(server.base_url, [_short(r) for r in (reqs * top)[:max(w.warmup_requests, top)]],
                  concurrency=top, timeout_s=w.request_timeout_s)
    warmed.add((role, w.name))


def _short(req, tokens: int = WARMUP_OUTPUT_TOKENS):
    """A warm-up copy of a request: the same prompt, fewer output tokens. The batch shapes
    (prefill and decode at the batch size) are what a first use costs; more decode steps
    of the same shape warm nothing more."""
    from quantlab.performance.loadgen import PreparedRequest

    n = min(tokens, req.requested_output_tokens)
    body = {**req.body, "max_tokens": n} | ({"min_tokens": n} if "min_tokens" in req.body else {})
    return PreparedRequest(req.path, body, n)


def for_server(req, served_name: str):
    from quantlab.performance.loadgen import PreparedRequest

    return PreparedRequest(req.path, {**req.body, "model": served_name}, req.requested_output_tokens)


def measure_point(ctx: StageContext, server, role: str, rep: int, w, reqs, point: str, conc, rate, *, device: str,
                  slo: dict) -> tuple[dict[str, Any], dict[str, Any], str, Any]:
    """One load point on one server: the requests, the monitor's samples, the per-request
    rows on file (in `ctx`'s run, named by `role`), the metrics."""
    from quantlab.performance.loadgen import run_point
    from quantlab.performance.monitor import Monitor

    monitor = Monitor(server.base_url, server.proc.pid if server.proc else None, device=device).start()
    try:
        with engine_busy():
            result = run_point(server.base_url, reqs, concurrency=conc, rate=rate, duration_s=w.duration_s,
                               timeout_s=w.request_timeout_s, seed=w.seed + rep)
    finally:
        msum = monitor.stop()
    rel = f"{PERF_DIR}/{role}-{w.name}-{point}-r{rep + 1}.jsonl"
    write_text_atomic(ctx.run.path / rel, "".join(json.dumps(r.as_row()) + "\n" for r in result.records))
    ctx.add_artifact(rel, "perf-requests")
    try:
        server.ensure_alive(f"during performance workload '{w.name}' {point}")
    except EngineError as err:
        raise EngineError(f"{err}\nPartial per-request data: {ctx.run.path / rel}") from None
    metrics = summarize(result.records, wall_s=result.wall_s, slo=slo,
                        price_per_hour=ctx.recipe.performance.price_per_hour)
    metrics["not_sent"] = result.not_sent
    metrics["client_cpu_share"] = result.client_cpu_s / result.wall_s if result.wall_s else None
    return metrics, msum, rel, result
