"""Every path runs the stages of STAGES: a comparison (its groups and its one-at-a-time
form) and a Ray node read the list as it is, so a stage added to STAGES, as docs/design.md
instructs, runs there too (before, a comparison named its stages by hand and skipped it)."""

from __future__ import annotations

from types import ModuleType

from quantlab.executors import ray_node
from quantlab.pipeline import stages as stage_list
from quantlab.pipeline.candidates.run import check_stages
from quantlab.performance import stage as perf_stage
from quantlab.release import stage as release_stage


def dummy_stage() -> ModuleType:
    stage = ModuleType("dummy_stage")
    stage.NAME = "dummy"
    return stage


def test_a_comparison_runs_every_stage_between_the_checkpoint_and_the_release_in_order():
    for stages in (stage_list.STAGES, stage_list.VALIDATE_STAGES):
        assert check_stages(stages) == stages[1:-1]
        assert stages[-1] is release_stage and perf_stage in check_stages(stages)


def test_a_stage_added_to_stages_runs_in_a_comparison_and_on_a_ray_node(monkeypatch):
    dummy = dummy_stage()
    added = [*stage_list.STAGES[:3], dummy, *stage_list.STAGES[3:]]
    monkeypatch.setattr(stage_list, "STAGES", added)
    monkeypatch.setattr(ray_node, "STAGES", added)
    assert dummy in check_stages(added) and check_stages(added).index(dummy) == 2
    on_node = ray_node.node_stages()
    assert dummy in on_node and release_stage not in on_node and on_node == added[:-1]


def test_a_group_runs_each_candidates_stages_in_turn_around_the_shared_load():
    """serve and quality per candidate (c1 serve, c1 quality, c2 ...), the one shared load, then
    quality at load, stability and targets per candidate: the order a comparison had before it
    read STAGES, with the check added since in its place."""
    from quantlab.pipeline.candidates.run import segments

    stages = check_stages(stage_list.STAGES)
    cut = segments(stages)
    assert [s for segment in cut for s in segment] == stages
    assert [perf_stage] in cut and [s.NAME for s in cut[0]] == ["serve", "quality"]
    assert [s.NAME for s in cut[-1]] == ["load_quality", "stability", "targets"]
    assert segments([perf_stage]) == [[perf_stage]] and segments([]) == []
