"""The planners' discordance from this host's batch noise floor (quality/work.measured_discordance):
the baseline's pooled flips between concurrency 1 and load, its upper 95% bound once at least
FLOOR_MIN_DOCUMENTS documents are pooled, this run's own contribution left out; else None and why
(the planner's assumed 5% then stands)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from quantlab.quality import batch_floor
from quantlab.quality.work import FLOOR_MIN_DOCUMENTS, floor_parts, measured_discordance

PROBE = {"versions": {"vllm": "0.32.0"}, "cpu": {"model": "Xeon"}, "gpus": []}
BASELINE = {"model.safetensors": "b" * 64}


pytestmark = pytest.mark.usefixtures("own_cache")  # tests/conftest.py: a cache and secret of its own


def ctx(tmp_path: Path, run_id: str = "run-now") -> SimpleNamespace:
    return SimpleNamespace(baseline_identity=lambda: BASELINE, serving_probe=lambda: PROBE,
                           serving_plan=lambda predicted=False: SimpleNamespace(device="cpu"),
                           checkpoint_dir=tmp_path / "checkpoint",
                           recipe=SimpleNamespace(serve=SimpleNamespace(engine_args={"dtype": "bfloat16"})),
                           run=SimpleNamespace(record=SimpleNamespace(run_id=run_id, result=lambda name: None)))


def test_nothing_measured_is_none_and_says_so(tmp_path):
    d, why = measured_discordance(ctx(tmp_path))
    assert d is None and "no batch floor" in why


def test_too_few_documents_keep_the_assumption(tmp_path):
    batch_floor.record(floor_parts(ctx(tmp_path), "baseline"), "c8", run_id="earlier", role="baseline", k=0, n=40)
    d, why = measured_discordance(ctx(tmp_path))
    assert d is None and f"fewer than {FLOOR_MIN_DOCUMENTS}" in why


def test_enough_documents_give_the_pooled_upper_bound_without_this_run(tmp_path):
    parts = floor_parts(ctx(tmp_path), "baseline")
    batch_floor.record(parts, "c8", run_id="earlier", role="baseline", k=2, n=120)
    batch_floor.record(parts, "c4", run_id="older", role="baseline", k=1, n=100)
    batch_floor.record(parts, "c8", run_id="run-now", role="baseline", k=50, n=100)  # this run's own: left out
    d, why = measured_discordance(ctx(tmp_path))
    expected = batch_floor.FlipRate.of(3, 220).high
    assert d == pytest.approx(expected) and "3 of 220" in why
    assert 3 / 220 < d < 0.05


def test_the_candidate_has_no_parts_before_its_weights_are_recorded(tmp_path):
    assert floor_parts(ctx(tmp_path), "candidate") is None
