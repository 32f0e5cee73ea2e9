"""A run's place in its stream, claimed in the registration statement before any engine
starts, and `verify` holding the manifest's stream entry to that claim."""

from __future__ import annotations

from types import SimpleNamespace

from quantlab.recipe.stream import CONTROLLED, OFF, StreamDecision
from quantlab.release.registration import stream_claim
from quantlab.release.stream_consistency import claim_problems


def _decision(position: int = 3, share: float = 0.175) -> StreamDecision:
    return StreamDecision(key="k" * 32, position=position, share=share, method="lord++",
                          history=((1, 0.35, False), (2, 0.175, False))[:position - 1])


def _manifest(decision: StreamDecision) -> SimpleNamespace:
    return SimpleNamespace(error_budget={"stream": decision.record(0.05)})


def test_the_claim_holds_the_position_and_the_level_of_a_controlled_run():
    claim = stream_claim(_decision())
    assert claim["control"] == CONTROLLED and claim["key"] == "k" * 32 and claim["position"] == 3
    assert claim["share"] == 0.175 and claim["method"] == "lord++"
    assert stream_claim(None) is None
    assert stream_claim(StreamDecision(control=OFF, by="quantlab run --alone")) == {"control": OFF}


def test_verify_holds_the_manifest_to_the_registered_claim():
    claimed = {"stream": stream_claim(_decision())}
    assert claim_problems(_manifest(_decision()), claimed) == []
    # a register reset after the claim, the run decided at position 1 with the first decision's share
    moved = claim_problems(_manifest(_decision(position=1, share=0.35)), claimed)
    assert any("position 1" in p for p in moved) and any("share" in p for p in moved)
    turned_off = claim_problems(_manifest(StreamDecision(control=OFF, by="--alone")), claimed)
    assert turned_off and "control" in turned_off[0]
    # a statement from before claims were registered: nothing to hold the entry to
    assert claim_problems(_manifest(_decision(position=1)), {"stream": None}) == []
