"""Stability gates and the fallback rate from hand-made probe results."""

from __future__ import annotations

from quantlab.recipe.stability import StabilitySpec
from quantlab.stability.gates import verdicts as gates
from quantlab.stability.stage import fallback_rate


def role(*, batch_rate=0.0, length_fail=0, greedy=0.0, seeded=0.0, server_errors=0, soak_errors=0, growth=10.0,
         failing_rows=(), accepted=(), memory_visible=True):
    rows = [{"prompt_tokens": n, "status": 200, "ok": True} for n in (96, 224, 428, 480)]
    rows.append({"prompt_tokens": 513, "status": 400, "ok": True, "healthy_after": True})
    for i in failing_rows:
        rows[i] = {**rows[i], "ok": False, "status": 500}
    return {
        "batch": {"mismatch_rate": batch_rate, "errors": 0, "requests": 32},
        "lengths": {"rows": rows, "failures": length_fail},
        "determinism": {m: {"mismatch_rate": r, "compared": 16, "errors": 0} for m, r in
                        (("greedy", greedy), ("seeded", seeded))},
        "bad_requests": {"server_errors": server_errors, "rows": [
            {"case": "NaN temperature", "status": 500 if server_errors else 400, "server_error": bool(server_errors),
             "healthy_after": True}], "accepted": list(accepted)},
        "soak": {"requests": 64, "errors": soak_errors, "empty": 0, "error_rate": soak_errors / 64,
                 "rss_growth_mb": growth, "memory_visible": memory_visible},
    }


def verdicts(stab, spec=None):
    return {g.gate: g.verdict for g in gates(stab, spec or StabilitySpec())}


def test_identical_behaviour_passes_every_gate():
    v = verdicts({"baseline": role(), "candidate": role()})
    assert set(v.values()) == {"pass"} and len(v) == 6


def test_batch_mismatch_is_judged_against_the_baseline_not_zero():
    assert verdicts({"baseline": role(batch_rate=0.3), "candidate": role(batch_rate=0.4)})[
        "max_batch_mismatch_excess"] == "pass"
    assert verdicts({"baseline": role(batch_rate=0.0), "candidate": role(batch_rate=0.5)})[
        "max_batch_mismatch_excess"] == "fail"


def test_each_finding_fails_its_own_gate_with_the_evidence():
    stab = {"baseline": role(), "candidate": role(length_fail=1, greedy=0.25, server_errors=1, soak_errors=2,
                                                  growth=900, failing_rows=(3,))}
    gs = {g.gate: g for g in gates(stab, StabilitySpec())}
    assert {k: g.verdict for k, g in gs.items()} == {
        "max_batch_mismatch_excess": "pass", "max_length_failures": "fail", "max_server_errors": "fail",
        "max_determinism_mismatch": "fail", "max_soak_error_rate": "fail", "max_rss_growth_mb": "fail"}
    assert "480 tokens -> 500" in gs["max_length_failures"].evidence
    assert "NaN temperature -> 500" in gs["max_server_errors"].evidence
    assert gs["max_rss_growth_mb"].value == 900


def test_memory_of_an_external_server_is_inconclusive():
    stab = {"baseline": role(growth=None, memory_visible=False), "candidate": role(growth=None, memory_visible=False)}
    assert verdicts(stab)["max_rss_growth_mb"] == "inconclusive"


def test_unread_memory_of_a_launched_server_fails():
    """It used to read as 'external server' (inconclusive, so released): quantlab launched
    this one, so memory it could not read is a failed gate."""
    stab = {"baseline": role(), "candidate": role(growth=None)}
    [g] = [g for g in gates(stab, StabilitySpec()) if g.gate == "max_rss_growth_mb"]
    assert g.verdict == "fail" and "could not be read" in g.evidence


def test_a_malformed_request_answered_200_fails_the_bad_request_gate():
    """It used to be a note only: a server that accepts what it should refuse fails."""
    stab = {"baseline": role(), "candidate": role(accepted=["top_p above 1"])}
    [g] = [g for g in gates(stab, StabilitySpec()) if g.gate == "max_server_errors"]
    assert g.verdict == "fail" and g.value == 1 and "top_p above 1 -> 200 (accepted)" in g.evidence


def test_fallback_rate_counts_what_the_candidate_failed_and_the_baseline_answered():
    base, cand = role(), role(failing_rows=(2,), soak_errors=3)
    fr = fallback_rate({"baseline": base, "candidate": cand}, None)
    # 5 length rows + 32 batch + 64 soak + 2 x 16 determinism requests
    assert fr["requests"] == 5 + 32 + 64 + 32 and fr["candidate_failed_baseline_answered"] == 1 + 3
    assert fallback_rate({"baseline": base, "candidate": role()}, None)["rate"] == 0
    # the baseline failing too is not a fallback
    assert fallback_rate({"baseline": role(soak_errors=3), "candidate": role(soak_errors=3)},
                         None)["candidate_failed_baseline_answered"] == 0
