"""The one decision rule: verdicts + policy -> the run's decision, per-target decisions,
and the verdicts that block."""

from quantlab.core.verdicts import GateVerdict
from quantlab.release.decision import DecisionPolicy, decide, targets_line


def verdict(gate, v, scope="w/c1"):
    return GateVerdict(stage="performance", gate=gate, scope=scope, verdict=v, value=1.0, limit=1.0, detail="d")


def test_decision_follows_the_verdicts():
    base = DecisionPolicy(fallback="base")
    assert decide([], base).record.decision == "release"
    d = decide([verdict("a", "pass"), verdict("b", "inconclusive")], base).record
    assert d.decision == "release" and d.inconclusive_gates == ["performance.b@w/c1"] and "inconclusive" in d.why
    decided = decide([verdict("a", "pass"), verdict("b", "fail", "w/c8")], base)
    d = decided.record
    assert d.decision == "blocked" and d.failed_gates == ["performance.b@w/c8"] and d.fallback == "base"
    assert decided.blocked and [v.scope for v in decided.blocking] == ["w/c8"]


def gv(verdict, target=None, gate="g"):
    return GateVerdict(stage="targets" if target else "quality", gate=gate, scope=target or "task", target=target,
                       verdict=verdict, value=None, limit=1, detail=f"{gate} on {target}")


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
