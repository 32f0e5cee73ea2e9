"""Which stages a resumed run redoes: by the hash of each stage's inputs (pure: no
engine runs; the records are written as the stages would write them)."""

from __future__ import annotations

import copy

import pytest
from conftest import shipped, write_recipe

from quantlab.core.digest import inputs_hash
from quantlab.pipeline.context import RunContext
from quantlab.core.errors import RecipeError
from quantlab.pipeline.candidate_run import open_run
from quantlab.pipeline.stages import stages_to_run
from quantlab.recipe.file import load_recipe
from quantlab.core.results import FileFact, QuantizeResult
from quantlab.core.run import RunDir, StageRecord, now_iso
from quantlab.performance import stage as perf_stage
from quantlab.quality import stage as quality_stage
from quantlab.quantize import stage as quantize_stage
from quantlab.release import stage as release_stage
from quantlab.serving import stage as serve_stage
from quantlab.stability import stage as stability_stage


def quiet(msg):
    pass


REDONE = "an earlier stage is redone"
ORDER = ["quantize", "serve", "quality", "performance", "stability", "release"]
ALL_AFTER = {name: ORDER[i + 1:] for i, name in enumerate(ORDER)}


def redone(names: list[str]) -> dict[str, str]:
    return {n: REDONE for n in names}


def fake_quantize_result(weights_sha: str = "a" * 64) -> QuantizeResult:
    return QuantizeResult(checkpoint="checkpoint", method="gptq", scheme="W4A16", layers_quantized=14,
                          calibration=None, quantization_config={}, size_bytes=1,
                          files={"model.safetensors": FileFact(size=1, sha256=weights_sha)}, timings={},
                          peak_rss_bytes=1, versions={}, model={})


def finish(ctx: RunContext, stage, result=None, status="ok"):
    from quantlab.pipeline.stages import STAGES, enabled

    ctx.enabled_stages = {s.NAME for s in STAGES if enabled(s, ctx)}
    ctx.run.put_stage(StageRecord(name=stage.NAME, status=status, started_at=now_iso(), finished_at=now_iso(),
                                  duration_s=1.0, inputs_sha256=inputs_hash(stage.inputs(ctx)), result=result))


@pytest.fixture
def done_run(tmp_path):
    """A run whose quantize, serve, quality and performance stages finished with the recipe as written."""
    data = shipped("gptq-w4a16")
    recipe = write_recipe(tmp_path, copy.deepcopy(data))
    loaded = load_recipe(recipe)
    run = RunDir.create(loaded, tmp_path / "runs")
    ctx = RunContext(loaded, run, quiet)
    finish(ctx, quantize_stage, fake_quantize_result())
    finish(ctx, serve_stage)
    finish(ctx, quality_stage)
    finish(ctx, perf_stage)
    finish(ctx, stability_stage)
    finish(ctx, release_stage)
    return tmp_path, data, run


def resumed(tmp_path, data, run, name="edited.yaml"):
    loaded = load_recipe(write_recipe(tmp_path, data, name))
    reopened = open_run(loaded, tmp_path / "runs", run.path)
    return stages_to_run(RunContext(loaded, reopened, quiet)), reopened


def test_nothing_to_redo_with_the_same_recipe(done_run):
    tmp_path, data, run = done_run
    assert resumed(tmp_path, data, run)[0] == {}


def test_a_description_edit_changes_nothing(done_run):
    tmp_path, data, run = done_run
    data["description"] = "reworded"
    todo, reopened = resumed(tmp_path, data, run)
    assert todo == {}
    assert len(reopened.record.recipe_history) == 1  # the edit is on record all the same


def test_an_edited_serve_section_reserves_and_keeps_the_checkpoint(done_run):
    tmp_path, data, run = done_run
    data["serve"] = {"engine_args": {"max_model_len": 1024}}
    assert resumed(tmp_path, data, run)[0] == {"serve": "its inputs changed", **redone(ALL_AFTER["serve"])}


def test_an_edited_gate_reruns_the_performance_stage_and_what_follows_it(done_run):
    tmp_path, data, run = done_run
    data["performance"]["gates"]["min_throughput_ratio"] = 0.95
    # quantize, serve and quality are kept; stability follows performance (its fallback rate counts both)
    assert resumed(tmp_path, data, run)[0] == {"performance": "its inputs changed",
                                               "stability": "an earlier stage is redone",
                                               "release": "an earlier stage is redone"}


def test_a_stage_without_its_recipe_section_does_not_run(done_run):
    tmp_path, data, run = done_run
    del data["performance"]
    # the release stage summarises the stages: one fewer is a different release
    assert resumed(tmp_path, data, run)[0] == {"release": "its inputs changed"}


def test_a_changed_signing_section_re_signs_only(done_run):
    tmp_path, data, run = done_run
    data["signing"] = {"method": "none"}
    assert resumed(tmp_path, data, run)[0] == {"release": "its inputs changed"}


def test_an_edited_quantization_section_starts_from_quantize(done_run):
    tmp_path, data, run = done_run
    data["quantization"]["group_size"] = 32
    assert resumed(tmp_path, data, run)[0] == {"quantize": "its inputs changed", **redone(ALL_AFTER["quantize"])}


def test_an_edited_calibration_file_requantizes(done_run):
    tmp_path, data, run = done_run
    local = tmp_path / "calib.jsonl"
    local.write_text('{"text": "one"}\n')
    data["calibration"]["datasets"] = [{"path": str(local)}]
    loaded = load_recipe(write_recipe(tmp_path, data, "local.yaml"))
    ctx = RunContext(loaded, open_run(loaded, tmp_path / "runs", run.path), quiet)
    finish(ctx, quantize_stage, fake_quantize_result())
    finish(ctx, serve_stage)
    finish(ctx, quality_stage)
    finish(ctx, perf_stage)
    finish(ctx, stability_stage)
    finish(ctx, release_stage)
    assert stages_to_run(ctx) == {}
    local.write_text('{"text": "two"}\n')
    assert "quantize" in stages_to_run(ctx)


def test_a_failed_stage_is_redone(done_run):
    tmp_path, data, run = done_run
    loaded = load_recipe(write_recipe(tmp_path, data, "same.yaml"))
    ctx = RunContext(loaded, open_run(loaded, tmp_path / "runs", run.path), quiet)
    finish(ctx, serve_stage, status="failed")
    assert stages_to_run(ctx) == {"serve": "last attempt failed", **redone(ALL_AFTER["serve"])}


def test_new_weights_reserve(done_run):
    tmp_path, data, run = done_run
    loaded = load_recipe(write_recipe(tmp_path, data, "same.yaml"))
    ctx = RunContext(loaded, open_run(loaded, tmp_path / "runs", run.path), quiet)
    record = ctx.run.record.stages["quantize"]
    record.result = fake_quantize_result("b" * 64)  # e.g. a checkpoint quantized again elsewhere
    assert stages_to_run(ctx) == {"serve": "its inputs changed", **redone(ALL_AFTER["serve"])}


def test_resuming_another_recipes_run_is_refused(done_run):
    tmp_path, data, run = done_run
    data["name"] = "another-name"
    with pytest.raises(RecipeError, match="run of recipe 'gptq-w4a16'"):
        resumed(tmp_path, data, run)
