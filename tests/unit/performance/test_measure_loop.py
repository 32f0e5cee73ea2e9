"""The one measuring loop (performance/measure_loop.py), driven with fake servers and a fake
load point: a single run's shape (one member, A B B A) and a comparison's (two members
beside one shared baseline, B C1 C2 B C2 C1), each with an adaptive repeat that measures
only the points still undecided and stops once every member has decided."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from quantlab.performance import loadgen, measure_loop
from quantlab.performance.loadgen import PreparedRequest
from quantlab.performance.measure_loop import Member, Sweep, measure_blocks, more_repeats
from quantlab.performance.result import Measured
from quantlab.performance.stage import _paired_block
from quantlab.pipeline.candidates.schedule import block_order, one_sweep
from quantlab.recipe.performance import PerformanceSpec

SPEC = PerformanceSpec.model_validate({
    "workloads": [{"name": "w", "concurrency": [1, 2], "warmup_requests": 2},
                  {"name": "v", "concurrency": [1], "warmup_requests": 0}],
    "repeats": 2, "max_repeats": 4, "client_check": False})


@pytest.fixture
def calls(monkeypatch):
    """Every load point and warm-up the loop asks for, in order; each point's rows on file."""
    seen: list[tuple] = []

    def point(ctx, server, role, rep, w, reqs, name, conc, rate, *, device, slo):
        rel = f"perf/{role}-{w.name}-{name}-r{rep + 1}.jsonl"
        (ctx.run.path / rel).write_text(server.served_name)
        assert {r.body["model"] for r in reqs} == {server.served_name}
        seen.append(("point", server.served_name, rep, w.name, name))
        return {"rep": rep}, {}, rel, SimpleNamespace(records=[], wall_s=1.0, client_cpu_s=0.25)

    monkeypatch.setattr(measure_loop, "measure_point", point)
    monkeypatch.setattr(loadgen, "run_point", lambda url, reqs, **kw: seen.append(("warm", url)))
    return seen


def _member(tmp_path, name: str) -> Member:
    (tmp_path / name / "perf").mkdir(parents=True)  # made by the stage, or by the comparison for every member
    ctx = SimpleNamespace(run=SimpleNamespace(path=tmp_path / name), artifacts=[])
    ctx.add_artifact = lambda rel, kind: ctx.artifacts.append(rel)
    return Member(ctx, Measured())


def _sweep(members: dict[str, Member], block_of, monkeypatch, needs: dict[str, dict]) -> Sweep:
    """A sweep whose member `name` leaves (workload, point) undecided until it has
    `needs[name][(workload, point)]` candidate repeats there."""
    who = {id(m.measured): name for name, m in members.items()}

    def undecided(spec, name: str) -> set:
        metrics = members[name].measured.metrics
        return {k for k, n in needs[name].items() if len(metrics[k]["candidate"]) < n}
    monkeypatch.setattr(measure_loop, "points_of", lambda spec, measured, client, notes, looks: who[id(measured)])
    monkeypatch.setattr(measure_loop, "undecided_points", undecided)
    requests = {w.name: [PreparedRequest("/v1/completions", {"prompt": "x"}, 4)] * 3 for w in SPEC.workloads}
    return Sweep(SPEC, requests, members, server=lambda role: SimpleNamespace(served_name=role, base_url=role),
                 block_of=block_of, device="cpu", progress=lambda line: None)


def _points(calls) -> list[tuple]:
    return [c[1:] for c in calls if c[0] == "point"]


def test_one_candidate_alternates_warms_once_and_repeats_only_the_undecided_point(tmp_path, calls, monkeypatch):
    one = {"candidate": _member(tmp_path, "run")}
    sweep = _sweep(one, _paired_block, monkeypatch, {"candidate": {("w", "c2"): 3}})
    placed: list[int] = []
    sweep.place = placed.append
    order = [(0, "baseline"), (0, "candidate"), (1, "candidate"), (1, "baseline")]
    measure_blocks(sweep, order)
    repeats = more_repeats(sweep, order, looks=3)
    assert repeats.order == order + [(2, "baseline"), (2, "candidate")] and repeats.stopped_at == 3
    blocks = [(role, rep) for role, rep, _, _ in _points(calls)]
    assert list(dict.fromkeys(blocks)) == [(r, rep) for rep, r in repeats.order]
    assert _points(calls)[-2:] == [("baseline", 2, "w", "c2"), ("candidate", 2, "w", "c2")]
    assert [c for c in calls if c[0] == "warm"] == [("warm", "baseline"), ("warm", "candidate")]  # v: no warm-up
    assert placed == [0, 0, 1, 1, 2, 2]
    m = one["candidate"].measured
    assert m.sequence[("w", "c2")] == ["baseline", "candidate", "candidate", "baseline", "baseline", "candidate"]
    assert len(m.metrics[("w", "c1")]["baseline"]) == 2 and m.wall_s == 14.0


def test_two_candidates_share_the_baseline_and_only_the_undecided_one_repeats(tmp_path, calls, monkeypatch):
    two = {"c1": _member(tmp_path, "c1"), "c2": _member(tmp_path, "c2")}
    sweep = _sweep(two, one_sweep, monkeypatch, {"c1": {}, "c2": {("w", "c1"): 3, ("v", "c1"): 4}})
    order = block_order(["c1", "c2"], 2)
    measure_blocks(sweep, order)
    repeats = more_repeats(sweep, order, looks=3)
    assert repeats.order == order + [(2, "baseline"), (2, "c2"), (3, "baseline"), (3, "c2")]
    assert repeats.stopped_at is None  # max_repeats reached
    assert list(dict.fromkeys((role, rep) for role, rep, _, _ in _points(calls))) == \
        [("baseline", 0), ("c1", 0), ("c2", 0), ("baseline", 1), ("c2", 1), ("c1", 1), ("baseline", 2),
         ("c2", 2), ("baseline", 3), ("c2", 3)]
    assert _points(calls)[-6:] == [("baseline", 2, "w", "c1"), ("baseline", 2, "v", "c1"), ("c2", 2, "w", "c1"),
                                   ("c2", 2, "v", "c1"), ("baseline", 3, "v", "c1"), ("c2", 3, "v", "c1")]
    c1, c2 = two["c1"].measured, two["c2"].measured
    # the baseline's blocks count for a candidate only at the points it was measured at
    assert len(c1.metrics[("w", "c1")]["baseline"]) == 2 and len(c2.metrics[("w", "c1")]["baseline"]) == 3
    assert c2.sequence[("v", "c1")] == ["baseline", "candidate"] * 4
    # the baseline's rows are filed in the first member's run and copied to those of the others that used them
    assert (tmp_path / "c2" / "perf/baseline-w-c1-r3.jsonl").read_text() == "baseline"
    assert "perf/baseline-w-c1-r3.jsonl" in two["c2"].ctx.artifacts and not two["c1"].ctx.artifacts
    assert [c for c in calls if c[0] == "warm"] == [("warm", "baseline"), ("warm", "c1"), ("warm", "c2")]
