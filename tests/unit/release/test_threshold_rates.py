"""The fixed thresholds' measured A/A false-block rates, as the ledger lists them."""

from __future__ import annotations

import pytest

from quantlab.core.verdicts import GateVerdict
from quantlab.release.error_budget import ledger
from quantlab.release.threshold_rates import MEASURED, AaMeasure, measured_for


def fixed(check: str, gate: str, scope: str, limit: float, comparator: str = "at_most") -> GateVerdict:
    return GateVerdict(check=check, gate=gate, scope=scope, verdict="pass", value=0, limit=limit, evidence="d",
                       comparator=comparator, test="threshold")


def test_the_upper_bound_is_clopper_pearson():
    none_blocked = AaMeasure(gates={}, trials=23, blocked=0, trial="t", host="h", source="s")
    assert none_blocked.upper_bound() == pytest.approx(0.1221, abs=1e-4)  # 1 - 0.05 ** (1/23)
    one_blocked = AaMeasure(gates={}, trials=20, blocked=1, trial="t", host="h", source="s")
    assert one_blocked.upper_bound() == pytest.approx(0.2161, abs=1e-4)  # beta.ppf(0.95, 2, 19)
    assert AaMeasure(gates={}, trials=3, blocked=3, trial="t", host="h", source="s").upper_bound() == 1.0


def test_a_shipped_threshold_is_listed_with_its_measurement():
    measured, missing = measured_for([fixed("stability", "max_server_errors", "bad_requests", 0),
                                      fixed("stability", "max_determinism_mismatch", "determinism", 0.0)])
    assert missing == []
    (entry,) = measured
    assert entry["gates"] == ["stability.max_determinism_mismatch@determinism",
                              "stability.max_server_errors@bad_requests"]
    assert entry["trials"] == 23 and entry["blocked"] == 0 and entry["upper_bound"] == pytest.approx(0.1221, abs=1e-4)
    assert "no BF16" in entry["host"] and "docs/decisions.md" in entry["source"]


def test_a_tighter_limit_than_measured_is_not_covered():
    # an unchanged model was never tried against 100 MB of growth: the 512 MB rounds say nothing of it
    measured, missing = measured_for([fixed("stability", "max_rss_growth_mb", "soak", 100)])
    assert measured == []
    assert missing[0]["gate"] == "stability.max_rss_growth_mb@soak" and "tighter than the 512" in missing[0]["why"]
    # a looser one is covered; for an at-least gate, looser is lower
    assert measured_for([fixed("stability", "max_rss_growth_mb", "soak", 1024)])[1] == []
    assert measured_for([fixed("quality", "min_same_top_rate", "kl", 0.9, "at_least")])[1] == []


def test_a_threshold_no_a_a_run_measured_says_why():
    _, missing = measured_for([fixed("quality", "critical_row", "t:r1", 1.0, "at_least"),
                               fixed("targets", "max_p99_ttft_ms", "gpu", 500)])
    why = {m["gate"]: m["why"] for m in missing}
    assert "1 - (1 - d/2)^k" in why["quality.critical_row@t:r1"]
    assert why["targets.max_p99_ttft_ms@gpu"] == "no A/A measurement of this threshold"


def test_the_ledger_lists_every_fixed_gate_once():
    verdicts = [fixed("stability", "max_server_errors", "bad_requests", 0),
                fixed("performance", "max_error_rate", "short/c8", 0.0),
                fixed("quality", "critical_row", "t:r1", 1.0, "at_least")]
    verdicts[1] = verdicts[1].model_copy(update={"test": "count"})
    book = ledger(verdicts, rule_version=3)["fixed_thresholds"]
    listed = [g for m in book["measured"] for g in m["gates"]] + [m["gate"] for m in book["not_measured"]]
    assert sorted(listed) == sorted(book["gates"]) and len(listed) == 3
    assert {m["trials"] for m in book["measured"]} == {23, 20}


def test_every_measurement_names_a_check_gate_and_its_source():
    for m in MEASURED:
        assert m.trials > 0 and 0 <= m.blocked <= m.trials and m.source.startswith("docs/decisions.md")
        assert all(name.count(".") == 1 for name in m.gates)


def test_the_measured_names_are_the_recipes_gates():
    from quantlab.recipe.performance import PerfGates
    from quantlab.recipe.quality import KLSpec
    from quantlab.recipe.stability import StabilityGates

    fields = {"stability": StabilityGates.model_fields, "quality": KLSpec.model_fields,
              "performance": PerfGates.model_fields}
    for m in MEASURED:
        for name in m.gates:
            check, gate = name.split(".")
            assert gate in fields[check], name


def test_the_report_line_says_what_was_measured_and_what_was_not():
    from quantlab.release.threshold_rates import report_line

    book = ledger([fixed("stability", "max_server_errors", "bad_requests", 0),
                   fixed("quality", "critical_row", "t:r1", 1.0, "at_least")], rule_version=3)["fixed_thresholds"]
    line = report_line(book)
    assert line.startswith("2 fixed threshold(s), no interval: 1 gate(s) of stability: blocked 0 of 23 A/A trials, "
                           "at most 12.2% a run (95%)")
    assert line.endswith("not measured: quality.critical_row@t:r1")
    assert report_line({"gates": []}) is None
