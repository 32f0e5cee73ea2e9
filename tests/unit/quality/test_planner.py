"""The dry-run planner: what a gate can tell with n samples, by the gates' own interval."""

from __future__ import annotations

from quantlab.quality.planner import plan_gate
from quantlab.quality.spec import QualityGates
from quantlab.quality.suites import SHIPPED, load_suite, sample_count


def test_more_samples_narrow_the_floor_and_let_non_inferiority_show():
    gates = QualityGates()  # margin 0.1 x score, 95%, min_samples 20
    plans = {n: plan_gate(f"t{n}", n, gates, family=13) for n in (10, 30, 100, 1000)}
    widths = [plans[n].half_width for n in (30, 100, 1000)]
    assert widths == sorted(widths, reverse=True)
    assert not plans[10].can_show and plans[10].blocks_drop is None  # below min_samples: nothing shown
    assert not plans[30].can_show and 30 < plans[30].samples_to_show < 1000
    assert plans[1000].can_show and plans[1000].samples_to_show is None
    assert plans[1000].blocks_drop < plans[100].blocks_drop < plans[30].blocks_drop
    # what it says is what the gate would do: at the planned size, an unchanged model shows
    assert plan_gate("t", plans[30].samples_to_show, gates, family=13).can_show
    assert "cannot be shown (needs ~" in plans[30].line() and "blocks drops >= " in plans[30].line()


def test_a_larger_family_needs_a_larger_drop_to_block():
    gates = QualityGates()
    assert plan_gate("t", 200, gates, family=1).blocks_drop < plan_gate("t", 200, gates, family=40).blocks_drop


def test_sample_counts_come_from_the_suite_data():
    suite = load_suite(SHIPPED / "default")
    counts = {t.task: sample_count(suite, t.task) for t in suite.tasks}
    assert counts["ql_passkey_150w"] == 60 and counts["ql_passkey_1300w"] == 20 and counts["ql_arithmetic"] == 150
    assert all(n and n > 0 for n in counts.values())
