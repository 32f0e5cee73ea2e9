"""What `quantlab verify` holds the load_quality gates to (load_quality/record.py): every gate the
registered section calls for (so one dropped from a manifest is found), and each gate's margin,
confidence, comparator and sample count against the registered section."""

from __future__ import annotations

from types import SimpleNamespace

from quantlab.core.verdicts import GateVerdict, Want
from quantlab.load_quality.record import wanted, wants

SECTIONS = SimpleNamespace(raw={
    "load_quality": {"margin": 0.05, "min_items": 40},
    "performance": {"workloads": [{"name": "w", "concurrency": [1, 8], "request_rates": [2.0]}]}})


def verdict(gate: str, scope: str, samples: int = 100, verdict: str = "pass") -> GateVerdict:
    return GateVerdict(check="load_quality", gate=gate, scope=scope, limit=-0.05, verdict=verdict, value=-0.01,
                       evidence="", samples=samples)


def test_every_registered_point_calls_for_at_load_and_all_but_c1_for_versus_c1():
    assert wanted(SECTIONS, None) == ["load_quality.at_load@w/c1", "load_quality.at_load@w/c8",
                                      "load_quality.versus_c1@w/c8", "load_quality.at_load@w/r2",
                                      "load_quality.versus_c1@w/r2"]
    only = SimpleNamespace(raw={**SECTIONS.raw, "load_quality": {"points": ["w/c8"], "versus_c1": False}})
    assert wanted(only, None) == ["load_quality.at_load@w/c8"]
    assert wanted(SimpleNamespace(raw={}), None) == []


def test_a_gate_is_held_to_the_registered_section():
    ok = wants(verdict("at_load", "w/c8"), SECTIONS, None)
    assert Want("margin", 0.05, "load_quality.margin") in ok and Want("confidence", 0.95, "load_quality.confidence") in ok
    assert "not a gate the registered" in wants(verdict("versus_c1", "w/c1"), SECTIONS, None)
    assert "not a gate the registered" in wants(verdict("at_load", "w/c4"), SECTIONS, None)
    assert "fewer than the registered load_quality.min_items" in wants(verdict("at_load", "w/c8", samples=12),
                                                                       SECTIONS, None)
    assert isinstance(wants(verdict("at_load", "w/c8", samples=12, verdict="inconclusive"), SECTIONS, None), list)
    assert "no load_quality section" in wants(verdict("at_load", "w/c8"), SimpleNamespace(raw={}), None)
