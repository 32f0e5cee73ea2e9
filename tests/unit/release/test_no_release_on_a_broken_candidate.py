"""No release on a broken candidate: each input that a decision once released without a
passed test, built from the project's own functions as it was found, now ends not shown
or blocked (decision rule 3); a release that `warn` lets through says in its ledger that
nothing bounds it."""

from __future__ import annotations

import numpy as np
import pytest

from quantlab.core.shipped import RECIPES
from quantlab.core.verdicts import GateVerdict
from quantlab.performance import gates as perf_gates
from quantlab.performance.metrics import summarize
from quantlab.performance.noise import RepeatSample
from quantlab.performance.result import Measured, points_of
from quantlab.performance.measure_loop import undecided_points
from quantlab.quality import gates as quality_gates
from quantlab.quality.compare import compare_task
from quantlab.recipe.file import load_recipe
from quantlab.recipe.performance import PerformanceSpec
from quantlab.recipe.quality import QualitySpec
from quantlab.recipe.stability import StabilitySpec
from quantlab.release.decision import DecisionPolicy, decide, policy_for
from quantlab.release.error_budget import ledger
from tests.unit.release.registered_release import requests

WARN = DecisionPolicy(not_shown="warn")


def passed_gate() -> GateVerdict:
    """A gate that passed (the KL summary within its limit), beside the one under test: a
    warning is never judged on its own (with no gate passed, every undecided gate holds)."""
    spec = QualitySpec.model_validate({"kl": {"max_mean_kl": 0.1}})
    [v] = quality_gates.kl_verdicts({"mean": 0.001, "same_top_rate": 1.0, "tokens": 256}, spec)
    assert v.verdict == "pass"
    return v


# --- the error rate: total errors over total requests, pooled over repeats, never undone ---


def _point_with_errors(errors: list[int], *, per_repeat: int = 200, max_error_rate: float | None = 0.02,
                       ok_candidate: bool = True, **gates):
    """One workload point measured as the stage measures it: each repeat's records summarized
    and sampled, the candidate failing `errors[i]` of `per_repeat` requests in repeat i."""
    spec = PerformanceSpec.model_validate({
        "workloads": [{"name": "w", "concurrency": [1], "num_requests": max(per_repeat, 1)}], "repeats": len(errors),
        "max_repeats": 4, "client_check": False, "gates": {"max_error_rate": max_error_rate, **gates}})
    rng = np.random.default_rng(0)
    measured = Measured()
    key = ("w", "c1")
    for e in errors:
        for role, (ok, bad) in (("baseline", (per_repeat, 0)),
                                ("candidate", (per_repeat - e, e) if ok_candidate else (0, per_repeat))):
            recs, wall = requests(ok, rng, n_errors=bad)
            measured.metrics.setdefault(key, {}).setdefault(role, []).append(summarize(recs, wall_s=wall, slo={}))
            measured.monitor.setdefault(key, {}).setdefault(role, []).append({})
            measured.samples.setdefault(key, {}).setdefault(role, []).append(RepeatSample.of(recs, wall))
        measured.raw.setdefault(key, []).append("")
    return spec, points_of(spec, measured, None, [], looks=3)


def test_the_error_rate_counts_every_request_of_every_repeat():
    """Errors [30, 0, 0] of 200 a repeat: 5% of the requests failed, and the median of the
    repeats' rates (0) passed the gate and released."""
    spec, [p] = _point_with_errors([30, 0, 0])
    assert p.candidate["error_rate"] == 0  # the median the gate used to judge
    [gate] = [v for v in perf_gates.verdicts([p], spec.gates) if v.gate == "max_error_rate"]
    assert gate.verdict == "fail" and gate.value == pytest.approx(30 / 600)
    assert "30 of 600 requests sent failed or timed out" in gate.evidence and "3 repeat(s)" in gate.evidence
    d = decide(perf_gates.verdicts([p], spec.gates), DecisionPolicy()).record
    assert d.decision == "blocked" and "performance.max_error_rate@w/c1" in d.failed_gates


def test_a_failed_error_rate_stops_the_adaptive_repeats():
    """A failing second repeat used to leave the point undecided on its other gates, and a
    third repeat (0 errors) turned the median into a pass."""
    spec, points = _point_with_errors([30, 0])
    judged = perf_gates.verdicts(points, spec.gates)
    assert {v.verdict for v in judged if v.gate == "max_error_rate"} == {"fail"}
    # a gate the noise leaves undecided at two repeats would have asked for a third
    assert any(v.verdict == "inconclusive" and v.value is not None for v in judged), [v.verdict for v in judged]
    assert undecided_points(spec, points) == set()
    # with the errors gone, the same point is still repeated: the stop is the failure's
    spec, clean = _point_with_errors([0, 0])
    assert undecided_points(spec, clean) == {("w", "c1")}


# --- a critical row that could not be judged ---

def test_an_errored_or_unanswered_critical_row_is_never_released():
    """Under the shipped traffic recipe's policy (not_shown: warn), a critical row whose
    scorer errored on the candidate's answer, or which the candidate never answered, was
    released."""
    from quantlab.quality.traffic import critical_verdicts, load_rows

    policy = policy_for(load_recipe(RECIPES / "gptq-w4a16-traffic.yaml").recipe)
    assert policy.not_shown == "warn"
    critical = [r.id for r in load_rows(RECIPES / "traffic" / "support.jsonl") if r.critical]
    assert len(critical) == 2
    docs = [{"id": critical[0], "critical": True}, {"id": critical[1], "critical": True},
            {"id": "ok-row", "critical": True}]
    base = [{"doc_id": i, "metrics": {"passed": 1, "errored": 0}} for i in range(3)]
    cand = [{"doc_id": 0, "metrics": {"passed": 0, "errored": 1}},  # the scorer errored on its answer
            {"doc_id": 2, "metrics": {"passed": 1, "errored": 0}}]  # row 1: never answered
    vs = critical_verdicts("traffic_support_facts", docs, base, cand)
    by_row = {v.scope.split(":")[1]: v for v in vs}
    assert by_row["ok-row"].verdict == "pass"
    for row in critical:
        assert by_row[row].verdict == "inconclusive" and not by_row[row].warnable
    assert "errored on the candidate" in by_row[critical[0]].evidence
    assert "not answered by the candidate" in by_row[critical[1]].evidence
    d = decide(vs, policy).record
    assert d.decision == "not_shown" and sorted(d.not_shown_gates) == sorted(
        f"quality.critical_row@traffic_support_facts:{r}" for r in critical)
    # the candidate passing it needs no baseline to compare with; failing it does
    base_errored = [{"doc_id": 0, "metrics": {"passed": 0, "errored": 1}}]
    [ok] = critical_verdicts("t", docs[:1], base_errored, [{"doc_id": 0, "metrics": {"passed": 1, "errored": 0}}])
    [unknown] = critical_verdicts("t", docs[:1], base_errored, [{"doc_id": 0, "metrics": {"passed": 0, "errored": 0}}])
    assert ok.verdict == "pass" and unknown.verdict == "inconclusive" and not unknown.warnable


# --- non-inferiority gates too small to judge, under warn ---

def _rows(values):
    return [{"doc_id": i, "filter": "none", "prompt_hash": f"p{i}", "prompt": f"q{i}", "target": "t",
             "answer": str(v), "raw": None, "metrics": {"passed": v}} for i, v in enumerate(values)]


def _compared(task, slice_, base, cand, spec: QualitySpec):
    cmp, _ = compare_task(task, slice_, "passed", None, True, _rows(base), _rows(cand), confidence=0.95,
                          iters=500, seed=0)
    return cmp, [float(x) for x in base], [float(x) for x in cand]


def test_four_non_inferiority_gates_too_small_to_judge_are_not_released_under_warn():
    """The traffic recipe's four checked slices (8, 5, 1 and 1 rows), every row the same on
    both models, under its `not_shown: warn`: released, 'all 4 gate(s) passed; 4 not shown,
    warned', and a ledger stating a false-release bound of 0.025."""
    recipe = load_recipe(RECIPES / "gptq-w4a16-traffic.yaml").recipe
    spec, policy = recipe.quality, policy_for(recipe)
    tasks = [_compared(f"traffic_support_{s}", s, [1] * n, [1] * n, spec)
             for s, n in (("facts", 8), ("structured", 5), ("format", 1), ("summaries", 1))]
    vs = quality_gates.verdicts(spec, tasks, [], None, None)
    assert len(vs) == 4 and {v.verdict for v in vs} == {"inconclusive"} and not any(v.warnable for v in vs)
    assert all("release.policy cannot warn it through" in v.evidence for v in vs)
    d = decide(vs, policy).record
    assert d.decision == "not_shown" and len(d.not_shown_gates) == 4 and d.warned_gates == []
    assert "passed" not in d.why.split(":")[0]
    # the ledger the release stage writes for it names no warned release
    book = ledger(vs, rule_version=d.rule_version, quality=spec,
                  warned=d.warned_gates if d.decision == "release" else ())
    assert "warned_gates" not in book["run"]


# --- gates with no estimate, under warn ---

def test_a_stability_gate_with_nothing_measured_is_not_warnable():
    """No repeated request answered (and none answered both alone and in a batch)."""
    from quantlab.stability.gates import verdicts as stability_verdicts

    role = {"determinism": {"greedy": {"mismatch_rate": None}, "seeded": {"mismatch_rate": None}},
            "batch": {"mismatch_rate": None}}
    vs = stability_verdicts({"baseline": role, "candidate": role}, StabilitySpec())
    assert {v.gate for v in vs} == {"max_determinism_mismatch", "max_batch_mismatch_excess"}
    assert all(v.verdict == "inconclusive" and not v.warnable for v in vs)
    d = decide([passed_gate(), *vs], WARN).record
    assert d.decision == "not_shown" and len(d.not_shown_gates) == 2


def test_a_kl_gate_with_no_positions_compared_is_not_warnable():
    spec = QualitySpec.model_validate({"kl": {"max_mean_kl": 0.1, "min_same_top_rate": 0.9}})
    vs = quality_gates.kl_verdicts({"mean": None, "same_top_rate": None, "tokens": 0}, spec)
    assert len(vs) == 2 and all(v.verdict == "inconclusive" and not v.warnable for v in vs)
    stab = GateVerdict(check="stability", gate="max_server_errors", scope="bad_requests", verdict="pass", value=0,
                       limit=0, evidence="0 of 22", comparator="at_most", estimate=0, test="threshold")
    assert decide([stab, *vs], WARN).record.decision == "not_shown"


def test_a_performance_figure_with_no_successful_request_is_not_warnable():
    """Every candidate request failed, max_error_rate and the throughput gate unset: no
    latency was measured (a set throughput gate fails on its 0 tokens/s)."""
    spec, [p] = _point_with_errors([0, 0], max_error_rate=None, ok_candidate=False, min_throughput_ratio=None)
    vs = perf_gates.verdicts([p], spec.gates)
    assert {v.gate for v in vs} == {"max_p99_ttft_ratio", "max_p99_tpot_ratio"}
    assert all(v.verdict == "inconclusive" and v.value is None and not v.warnable for v in vs)
    d = decide([passed_gate(), *vs], WARN).record
    assert d.decision == "not_shown" and len(d.not_shown_gates) == 2
    # the error-rate gate with nothing sent is not a pass at 0% either
    spec, [p] = _point_with_errors([0], per_repeat=0, max_error_rate=0.0, min_throughput_ratio=None,
                                   max_p99_ttft_ratio=None, max_p99_tpot_ratio=None)
    [v] = perf_gates.verdicts([p], spec.gates)
    assert v.verdict == "inconclusive" and not v.warnable and "no request was sent" in v.evidence


def test_no_gate_passed_is_never_a_release_however_warned():
    """Undecided gates with intervals, estimates within their limits, and not one passed:
    a warning stands beside passed tests, never in place of all of them."""
    tasks = [_compared(f"t{i}", "s", [1] * 30 + [0] * 10, [1] * 29 + [0] * 11, QualitySpec()) for i in range(2)]
    vs = quality_gates.verdicts(QualitySpec.model_validate({"pooled": None}), tasks, [], None, None)
    assert {v.verdict for v in vs} == {"inconclusive"} and all(v.within_limit() and v.warnable for v in vs)
    d = decide(vs, WARN).record
    assert d.decision == "not_shown" and "no gate passed" in d.why
    assert decide([passed_gate(), *vs], WARN).record.decision == "release"


# --- at exactly the margin ---

def test_warn_does_not_release_an_estimate_exactly_at_the_margin():
    """40 items, baseline 20 right, the candidate loses 2: a drop of exactly the 0.05
    margin (0.45 - 0.5 in floats), its interval straddling it. Warn used to release it."""
    spec = QualitySpec.model_validate({"pooled": None, "gates": {"non_inferiority_margin": 0.1,
                                                                 "non_inferiority_min_margin": 0.05}})
    base = [1] * 20 + [0] * 20
    at = _compared("t", "s", base, [0, 0] + [1] * 18 + [0] * 20, spec)
    [v] = quality_gates.verdicts(spec, [at], [], None, None)
    assert v.verdict == "inconclusive" and v.margin == pytest.approx(0.05) and v.estimate == pytest.approx(-0.05)
    assert v.low is not None and not v.within_limit()
    d = decide([passed_gate(), v], WARN).record
    assert d.decision == "not_shown" and d.not_shown_gates == ["quality.non_inferiority@t"]
    assert decide([passed_gate(), v], WARN, rule=2).record.decision == "release"  # how rule 2 decided it


# --- the ledger of a warned release ---

def test_a_warned_release_states_no_bound_in_its_ledger():
    """One gate passed on 400 items, one undecided on 40 with its estimate inside the margin,
    warned through: released, and the ledger's false-release bound is 1.0, with why."""
    spec = QualitySpec.model_validate({"pooled": None, "gates": {"non_inferiority_min_margin": 0.05}})
    same = _compared("big", "a", [1] * 200 + [0] * 200, [1] * 200 + [0] * 200, spec)
    near = _compared("small", "b", [1] * 20 + [0] * 20, [0] + [1] * 19 + [0] * 20, spec)
    vs = quality_gates.verdicts(spec, [same, near], [], None, None)
    by_scope = {v.scope: v for v in vs}
    assert by_scope["big"].verdict == "pass" and by_scope["small"].verdict == "inconclusive"
    d = decide(vs, WARN).record
    assert d.decision == "release" and d.warned_gates == ["quality.non_inferiority@small"]
    assert d.why.startswith("1 of 2 gate(s) passed; 1 not shown, warned by release.policy")
    book = ledger(vs, rule_version=d.rule_version, quality=spec, warned=d.warned_gates)
    assert book["run"]["false_release_bound"] == 1.0
    assert book["run"]["warned_gates"] == ["quality.non_inferiority@small"]
    assert "nothing bounds a wrong release" in book["run"]["false_release_rule"]
    # without the warned gate, the passed test's own alpha bounds it
    assert ledger([by_scope["big"]], rule_version=3, quality=spec)["run"]["false_release_bound"] == pytest.approx(0.025)


# --- a task the served context dropped from a slice ---

def test_a_pooled_task_dropped_by_the_context_holds_its_slice():
    """The shipped GPTQ recipe at max_model_len 1024: the 700- and 1300-word pass keys
    cannot run; their own gates are disabled (they are judged pooled in the long-context
    slice), so they left no gate and the slice was judged on the shorter two alone."""
    from quantlab.quality.suites import load_suites
    from quantlab.quality.work import runnable

    loaded = load_recipe(RECIPES / "gptq-w4a16.yaml")
    spec = loaded.recipe.quality
    _, skipped = runnable(load_suites(spec, loaded.path.parent), 1024)
    dropped = [(t.task, why, t.slice, t.metric) for t, why in skipped if t.gated]
    assert sorted(t for t, *_ in dropped) == ["ql_passkey_1300w", "ql_passkey_700w"]
    assert all(spec.task_gates[t].disabled for t, *_ in dropped)
    vs = quality_gates.skipped_verdicts(spec, dropped)
    assert sorted(v.scope for v in vs) == ["ql_passkey_1300w", "ql_passkey_700w"]
    assert all(not v.warnable and "slice:long-context" in v.evidence for v in vs)
    d = decide([passed_gate(), *vs], WARN).record
    assert d.decision == "not_shown" and sorted(d.not_shown_gates) == [
        "quality.skipped@ql_passkey_1300w", "quality.skipped@ql_passkey_700w"]
    # a disabled task pooled nowhere gated (its slice's gates off, no pooled gate) still leaves no gate
    quiet = spec.model_copy(update={"pooled": None, "slice_gates": {**spec.slice_gates, "long-context": _disabled()}})
    assert quality_gates.skipped_verdicts(quiet, dropped) == []


def _disabled():
    from quantlab.recipe.quality import GateOverride

    return GateOverride(disabled=True)
