"""The one decision rule: verdicts + policy -> the run's decision, per-target decisions,
and the verdicts that block."""

from quantlab.core.verdicts import GateVerdict
from quantlab.release.decision import RULE_VERSION, DecisionPolicy, decide, targets_line


def verdict(gate, v, scope="w/c1"):
    """A performance gate whose interval (0.9 .. 1.6) was computed, its estimate 1.0 within its limit 1.5: what
    release.policy's warn may let through when it cannot decide."""
    return GateVerdict(check="performance", gate=gate, scope=scope, verdict=v, value=1.0, limit=1.5, evidence="d",
                       comparator="at_most", estimate=1.0, low=0.9, high=1.6, test="hierarchical-bootstrap")


def test_decision_follows_the_verdicts():
    base = DecisionPolicy(fallback="base")
    decided = decide([verdict("a", "pass"), verdict("b", "fail", "w/c8")], base)
    d = decided.record
    assert d.decision == "blocked" and d.failed_gates == ["performance.b@w/c8"] and d.fallback == "base"
    assert decided.blocked and [v.scope for v in decided.blocking] == ["w/c8"]


def test_a_required_gate_that_could_not_decide_releases_nothing():
    """It used to release: 'inconclusive never blocks', so quality.limit: 10 (every quality
    gate below min_samples) released a model nothing had been shown about."""
    decided = decide([verdict("a", "pass"), verdict("b", "inconclusive")], DecisionPolicy(fallback="base"))
    d = decided.record
    assert d.decision == "not_shown" and decided.blocked and d.fallback == "base"
    assert d.inconclusive_gates == d.not_shown_gates == ["performance.b@w/c1"] and "could not decide" in d.why
    assert [v.gate for v in decided.blocking] == ["b"]
    # failed and not shown together: blocked, both listed
    both = decide([verdict("a", "fail"), verdict("b", "inconclusive", "w/c2")], DecisionPolicy()).record
    assert both.decision == "blocked" and both.not_shown_gates == ["performance.b@w/c2"]


def test_release_policy_can_warn_per_gate_per_check_or_for_all():
    unsure = [verdict("a", "pass"), verdict("b", "inconclusive")]
    for policy in (DecisionPolicy(not_shown="warn"), DecisionPolicy(checks={"performance": "warn"}),
                   DecisionPolicy(gates={"performance.b": "warn"})):
        d = decide(unsure, policy).record
        assert d.decision == "release" and d.not_shown_gates == [] and "warned by release.policy" in d.why
    # the gate's own rule wins over its check's and the default
    assert decide(unsure, DecisionPolicy(not_shown="warn", gates={"performance.b": "block"})).record.decision \
        == "not_shown"
    assert decide(unsure, DecisionPolicy(checks={"performance": "warn"}, gates={"performance.b": "block"})
                  ).record.decision == "not_shown"
    assert decide(unsure, DecisionPolicy()).record.not_shown_policy == {"not_shown": "block", "checks": {},
                                                                          "gates": {}}
    # one scope of a gate: warn there, block elsewhere
    two = [verdict("a", "pass"), verdict("b", "inconclusive", "w/c1"), verdict("b", "inconclusive", "w/c8")]
    d = decide(two, DecisionPolicy(gates={"performance.b@w/c1": "warn"})).record
    assert d.decision == "not_shown" and d.not_shown_gates == ["performance.b@w/c8"]
    assert decide(two, DecisionPolicy(gates={"performance.b": "warn", "performance.b@w/c8": "block"})
                  ).record.not_shown_gates == ["performance.b@w/c8"]


def test_policy_names_are_checked():
    import pytest

    from quantlab.recipe.release import ReleasePolicySpec

    assert ReleasePolicySpec(gates={"quality.non_inferiority@ql_code": "warn"}).gates
    for bad in ("quality", "nope.gate", "quality.non_inferiority@"):
        with pytest.raises(ValueError, match="is not 'check.gate' or 'check.gate@scope'"):
            ReleasePolicySpec(gates={bad: "warn"})


def gv(verdict, target=None, gate="g"):
    return GateVerdict(check="targets" if target else "quality", gate=gate, scope=target or "task", target=target,
                       verdict=verdict, value=None, limit=1, evidence=f"{gate} on {target}")


def test_per_target_decisions():
    verdicts = [gv("pass"), gv("pass", "cpu2"), gv("fail", "gpu", "servable")]
    decided = decide(verdicts, DecisionPolicy(fallback="b", targets={"primary": True, "cpu2": True, "gpu": False}))
    assert decided.record.decision == "release" and decided.blocking == []
    # gpu required: the run is blocked
    assert decide(verdicts, DecisionPolicy(fallback="b", targets={"gpu": True})).record.decision == "blocked"
    d = decided.targets
    assert [d[n].decision for n in ("primary", "cpu2", "gpu")] == ["release", "release", "blocked"]
    assert d["gpu"].failed_gates == ["targets.servable@gpu"] and d["gpu"].why == "servable on gpu"
    assert targets_line(d) == "released for primary, cpu2; blocked for gpu (optional): servable on gpu"
    # a gate failed on the primary target blocks every target
    d = decide([gv("fail"), gv("pass", "cpu2")], DecisionPolicy(targets={"primary": True, "cpu2": True})).targets
    assert {x.decision for x in d.values()} == {"blocked"}
    assert d["cpu2"].why == "1 gate(s) failed on the primary target"


def test_a_target_with_a_gate_that_could_not_decide_is_not_shown():
    verdicts = [gv("pass"), gv("inconclusive", "cpu2", "max_mismatch")]
    decided = decide(verdicts, DecisionPolicy(targets={"primary": True, "cpu2": False}))
    assert decided.record.decision == "release"  # an optional target decides itself only
    assert decided.targets["cpu2"].decision == "not_shown"
    assert decided.targets["cpu2"].not_shown_gates == ["targets.max_mismatch@cpu2"]
    assert targets_line(decided.targets) == ("released for primary; not shown for cpu2 (optional): "
                                             "max_mismatch on cpu2")



def test_no_gate_is_never_a_release():
    """It used to be: decide([]) said 'no gate was configured' and released, so a recipe
    without checks signed a release on no evidence at all."""
    d = decide([], DecisionPolicy(fallback="base")).record
    assert d.decision == "not_shown" and "nothing shows" in d.why and d.rule_version == RULE_VERSION
    # a manifest made under rule 1 is decided again under rule 1 (what it was signed with)
    assert decide([], DecisionPolicy(), rule=1).record.decision == "release"
    policy = DecisionPolicy(targets={"primary": True, "gpu": False})
    assert decide([], policy).targets["gpu"].decision == "not_shown"


def test_warn_never_releases_a_gate_whose_estimate_is_beyond_its_limit():
    """A 2x-margin drop on 50 items was released 92% of the time under not_shown: warn:
    the interval could not show the breach, and warn let it through."""
    def quality(estimate, margin=0.05):
        return GateVerdict(check="quality", gate="non_inferiority", scope="t", verdict="inconclusive",
                           value=estimate - 0.1, limit=-margin, evidence="d", comparator="non_inferior", margin=margin,
                           estimate=estimate, low=estimate - 0.1, high=estimate + 0.1)
    warn = DecisionPolicy(not_shown="warn")
    passed = verdict("a", "pass")
    for rule in (2, 3):
        inside = decide([passed, quality(-0.03)], warn, rule=rule).record
        assert inside.decision == "release" and inside.warned_gates == ["quality.non_inferiority@t"]
        beyond = decide([passed, quality(-0.10)], warn, rule=rule).record
        assert beyond.decision == "not_shown" and beyond.not_shown_gates == ["quality.non_inferiority@t"]
    assert "beyond its limit" in decide([passed, quality(-0.10)], warn, rule=2).record.why
    assert "warned but held" in decide([passed, quality(-0.10)], warn).record.why
    assert decide([quality(-0.10)], warn, rule=1).record.decision == "release"  # how rule 1 decided it
    ratio = GateVerdict(check="performance", gate="max_p99_ttft_ratio", scope="w/c1", verdict="inconclusive",
                        value=1.7, limit=1.5, evidence="d", comparator="at_most")
    assert decide([passed, ratio], warn, rule=2).record.decision == "not_shown"
    # rule 2 let a gate with no interval through on its value; rule 3 needs the interval computed
    assert decide([passed, ratio.model_copy(update={"value": 1.2})], warn, rule=2).record.decision == "release"
    assert decide([passed, ratio.model_copy(update={"value": 1.2, "estimate": 1.2})], warn).record.decision \
        == "not_shown"


def test_an_unknown_rule_version_is_refused():
    import pytest

    with pytest.raises(ValueError, match="unknown decision rule version 9"):
        decide([], DecisionPolicy(), rule=9)


def test_a_gate_named_before_its_verdict_gets_the_same_rule():
    """The planner asks before there is a verdict: the same lookup, most specific first."""
    policy = DecisionPolicy(not_shown="warn", gates={"quality.non_inferiority@ql_code": "block"})
    assert policy.requires("quality", "non_inferiority", "ql_code")
    assert not policy.requires("quality", "non_inferiority", "ql_chat")
    v = GateVerdict(check="quality", gate="non_inferiority", scope="ql_code", verdict="inconclusive", value=None,
                    limit=0, evidence="d")
    assert policy.required(v) is policy.requires("quality", "non_inferiority", "ql_code")


def test_a_blocked_headline_names_the_most_important_gates_first_and_counts_the_rest():
    """21 gates that hold the release back: the decision says how many, names the first
    few by importance (failed before not shown, the pooled gate and slices before tasks)
    in about 80 characters, and leaves the full lists to failed_gates / not_shown_gates."""
    failed = [GateVerdict(check="quality", gate="non_inferiority", scope=s, verdict="fail", value=-0.3, limit=-0.05,
                          evidence="d") for s in ("ql_code", "pooled", "slice:prose")]
    unshown = [GateVerdict(check="quality", gate="non_inferiority", scope=f"t{i:02d}", verdict="inconclusive",
                           value=None, limit=-0.05, evidence="d") for i in range(18)]
    d = decide(failed + unshown, DecisionPolicy()).record
    assert d.decision == "blocked" and len(d.failed_gates) == 3 and len(d.not_shown_gates) == 18
    assert d.why.startswith("3 gate(s) failed, 18 more not shown: quality.non_inferiority@pooled, "
                            "quality.non_inferiority@slice:prose")
    assert d.why.endswith("and 19 more (all in the report)") and len(d.why) < 160
