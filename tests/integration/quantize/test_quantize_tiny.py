"""The quantize stage end to end on a tiny random Llama: every method family, the
exported quantization_config, the tensors in the safetensors, and the failure paths."""

from __future__ import annotations

import json

import pytest
from conftest import quiet, tiny_variant, write_recipe
from safetensors import safe_open

from quantlab.core.errors import EngineError, RecipeError
from quantlab.core.layout import QUANTIZE_RESULT_FILE, RECIPE_COPY_FILE
from quantlab.pipeline.commands import quantize_only
from quantlab.recipe.file import load_recipe

pytestmark = pytest.mark.slow

# recipe -> (format, weight bits, weight strategy, group size, symmetric, activations, kv cache)
EXPECTED = {
    "rtn-w8a16": ("pack-quantized", 8, "channel", None, True, None, False),
    "gptq-w4a16": ("pack-quantized", 4, "group", 64, True, None, False),
    "awq-w4a16": ("pack-quantized", 4, "group", 64, False, None, False),
    "smoothquant-gptq-w8a8": ("int-quantized", 8, "channel", None, True, ("int", "token", True), False),
    "fp8-dynamic": ("float-quantized", 8, "channel", None, True, ("float", "token", True), False),
    "fp8-kv-cache": ("float-quantized", 8, "channel", None, True, ("float", "token", True), True),
}


def quantize(loaded, output, progress=quiet):
    return quantize_only(loaded, output, overwrite=False, progress=progress)


@pytest.fixture(scope="module")
def quantized(tiny_checkpoints):
    """The tiny model quantized once per shipped recipe (a session fixture)."""
    assert set(EXPECTED) <= set(tiny_checkpoints[1])
    return tiny_checkpoints


def tensors(folder):
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_exported_quantization_config(quantized, name):
    root, _ = quantized
    fmt, bits, strategy, group, sym, act, kv = EXPECTED[name]
    qc = json.loads((root / name / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == fmt
    assert qc["quantization_status"] == "compressed"
    assert "lm_head" in qc["ignore"]
    [group_cfg] = qc["config_groups"].values()
    w = group_cfg["weights"]
    assert (w["num_bits"], w["strategy"], w["group_size"], w["symmetric"]) == (bits, strategy, group, sym)
    a = group_cfg["input_activations"]
    assert (a is None) if act is None else ((a["type"], a["strategy"], a["dynamic"]) == act)
    if kv:
        assert qc["kv_cache_scheme"]["type"] == "float" and qc["kv_cache_scheme"]["num_bits"] == 8
        assert qc["kv_cache_scheme"]["dynamic"] is False
    else:
        assert qc["kv_cache_scheme"] is None


@pytest.mark.parametrize("name", list(EXPECTED))
def test_safetensors_hold_quantized_weights_and_scales(quantized, name):
    import torch

    root, _ = quantized
    t = tensors(root / name)
    fmt, bits, *_rest, kv = EXPECTED[name]
    q = "model.layers.0.self_attn.q_proj"
    assert f"{q}.weight_scale" in t
    if fmt == "pack-quantized":
        packed = t[f"{q}.weight_packed"]
        assert packed.dtype == torch.int32
        # 128x128 weights packed 32 // bits values per int32
        assert packed.shape == (128, 128 * bits // 32)
        assert (f"{q}.weight_zero_point" in t) == (name == "awq-w4a16")
    elif fmt == "int-quantized":
        assert t[f"{q}.weight"].dtype == torch.int8
    else:
        assert t[f"{q}.weight"].dtype == torch.float8_e4m3fn
    assert t["model.embed_tokens.weight"].dtype == torch.bfloat16  # not targeted, left as is
    if kv:
        for which in ("k_scale", "v_scale"):
            scale = t[f"model.layers.0.self_attn.{which}"].float()
            assert scale.numel() == 1 and torch.isfinite(scale).all() and scale.item() > 0
    else:
        assert not any(k.endswith("k_scale") for k in t)


def test_result_records_calibration_timings_and_versions(quantized):
    root, results = quantized
    r = json.loads((root / "gptq-w4a16" / QUANTIZE_RESULT_FILE).read_text())
    assert r == json.loads(json.dumps(results["gptq-w4a16"]))
    cal = r["calibration"]
    assert cal["num_samples"] == 8 and 0 < cal["num_tokens"] <= 8 * 128 and len(cal["sha256"]) == 64
    assert r["versions"]["llmcompressor"] == "0.14.0.1"
    assert r["peak_rss_bytes"] > 100e6
    assert set(r["timings"]) >= {"preflight_s", "calibration_data_s", "load_model_s", "oneshot_and_save_s"}
    assert r["layers_quantized"] == 14
    # GPTQ reports one loss per quantized layer
    assert len(r["gptq"]["layer_losses"]) == 14 and r["gptq"]["max_loss"] > 0
    assert (root / "gptq-w4a16" / RECIPE_COPY_FILE).is_file()
    assert (root / "gptq-w4a16" / "recipe.yaml").is_file()  # llm-compressor's own record
    files = r["checkpoint"]["files"]
    assert "model.safetensors" in files and len(files["model.safetensors"]["sha256"]) == 64


def test_data_free_methods_record_no_calibration(quantized):
    _, results = quantized
    assert results["rtn-w8a16"]["calibration"] is None
    assert results["fp8-dynamic"]["calibration"] is None
    assert results["gptq-w4a16"]["gptq"] is not None and results["rtn-w8a16"]["gptq"] is None


def test_awq_runs_on_cpu_through_the_documented_shim(quantized):
    import torch

    _, results = quantized
    if torch.accelerator.is_available():
        pytest.skip("the shim only applies without an accelerator")
    assert results["awq-w4a16"]["shims"] == ["awq_pin_memory_without_accelerator (llm-compressor PR #2813 on CPU)"]


def test_the_awq_shim_is_still_needed():
    """If upstream stops pinning memory without an accelerator, this fails: drop the shim."""
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    if torch.accelerator.is_available():
        pytest.skip("CPU-only behaviour")
    original = getattr(IntermediatesCache.pin_memory, "__wrapped__", IntermediatesCache.pin_memory)
    cache = IntermediatesCache.from_dataloader([{"x": torch.ones(2)}], torch.device("cpu"))
    with pytest.raises(RuntimeError, match="accelerator"):
        original(cache, 0)


def test_calibration_hash_is_reproducible(tmp_path, tiny_model_dir, quantized):
    _, results = quantized
    recipe = write_recipe(tmp_path, tiny_variant("gptq-w4a16", tiny_model_dir))
    again = quantize(load_recipe(recipe), tmp_path / "out", progress=lambda m: None)
    assert again["calibration"]["sha256"] == results["gptq-w4a16"]["calibration"]["sha256"]
    # GPTQ on CPU with the same inputs gives the same weights
    assert again["checkpoint"]["files"]["model.safetensors"]["sha256"] == \
        results["gptq-w4a16"]["checkpoint"]["files"]["model.safetensors"]["sha256"]


def test_preflight_failure_writes_nothing(tmp_path, tiny_model_dir):
    data = tiny_variant("gptq-w4a16", tiny_model_dir)
    data["quantization"]["group_size"] = 256  # attention inputs are 128 wide
    recipe = write_recipe(tmp_path / "r", data)
    with pytest.raises(RecipeError, match=r"group_size: 256 does not divide .* \[32, 64, 128\]"):
        quantize(load_recipe(recipe), tmp_path / "out", progress=lambda m: None)
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_engine_failure_leaves_no_half_checkpoint(tmp_path, tiny_model_dir):
    data = tiny_variant("raw-llmcompressor", tiny_model_dir)
    data["quantization"]["raw_recipe"] = {"quant_stage": {"quant_modifiers": {"NoSuchModifier": {}}}}
    recipe = write_recipe(tmp_path / "r", data)
    with pytest.raises(EngineError, match=r"oneshot failed.*its output: .*out.llmcompressor.log"):
        quantize(load_recipe(recipe), tmp_path / "out", progress=lambda m: None)
    # no checkpoint, half or whole; the engine's own output is kept to diagnose the failure
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.llmcompressor.log", "r"]


def test_existing_output_is_not_overwritten_by_default(tmp_path, tiny_model_dir):
    (tmp_path / "out").mkdir()
    recipe = write_recipe(tmp_path / "r", tiny_variant("rtn-w8a16", tiny_model_dir))
    with pytest.raises(RecipeError, match="already exists; pass --overwrite"):
        quantize(load_recipe(recipe), tmp_path / "out", progress=lambda m: None)


def test_raw_recipe_is_passed_through(tmp_path, tiny_model_dir):
    recipe = write_recipe(tmp_path / "r", tiny_variant("raw-llmcompressor", tiny_model_dir))
    quantize(load_recipe(recipe), tmp_path / "out", progress=lambda m: None)
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    strategies = {g["weights"]["strategy"] for g in qc["config_groups"].values()}
    assert strategies == {"channel", "group"}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_predicted_scheme_matches_the_export(quantized, name):
    """`quantlab run` judges servability from the recipe before quantizing: the prediction
    must classify exactly as the real checkpoint does."""
    from quantlab.serving.compat import check_compat, predict_quant_config

    root, _ = quantized
    actual = json.loads((root / name / "config.json").read_text())["quantization_config"]
    predicted = predict_quant_config(load_recipe(root / "recipes" / f"{name}.yaml").recipe.quantization)
    probe = {"device": "cpu", "versions": {}}
    assert check_compat(predicted, probe).schemes == check_compat(actual, probe).schemes


def test_the_terminal_shows_quantlab_and_the_log_file_the_engine(tmp_path, tiny_model_dir):
    """llm-compressor prints a line per module and progress bars: they go to a log file;
    the terminal keeps quantlab's few lines, and stdout only the checkpoint path."""
    import subprocess
    import sys

    from conftest import REPO

    recipe = write_recipe(tmp_path / "r", tiny_variant("gptq-w4a16", tiny_model_dir))
    out = tmp_path / "ckpt"
    r = subprocess.run([sys.executable, "-m", "quantlab", "quantize", recipe, "--output", out], capture_output=True,
                       text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == str(out.resolve())
    log = (tmp_path / "ckpt.llmcompressor.log").read_text()
    assert "GPTQ" in log or "gptq" in log  # the engine's per-module lines landed in the file
    assert "Calibrating" not in r.stderr and "| INFO -" not in r.stderr and "| INFO -" not in r.stdout
    assert all(line.startswith("quantlab ") for line in r.stderr.splitlines() if line.strip()), r.stderr[-2000:]


def test_the_quantize_stage_reuses_a_checkpoint_made_from_the_same_inputs(tiny_model_dir, tmp_path, monkeypatch):
    from conftest import tiny_variant, write_recipe

    from quantlab.pipeline.context import RunContext
    from quantlab.recipe.file import load_recipe
    from quantlab.core.run import RunDir
    from quantlab.quantize import stage as quantize_stage

    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    data = tiny_variant("gptq-w4a16", tiny_model_dir)
    data["quantization"]["reuse_checkpoint"] = True

    def quantize(name):
        loaded = load_recipe(write_recipe(tmp_path, data, name))
        ctx = RunContext(loaded, RunDir.create(loaded, tmp_path / "runs"), progress=lines.append)
        reuses = quantize_stage.reuses(ctx)
        quantize_stage.preflight(ctx)
        preflight_log = (ctx.run.path / "logs" / "llmcompressor.log").is_file()  # llm-compressor imported
        return ctx, quantize_stage.run(ctx), reuses, preflight_log

    lines: list[str] = []
    ctx1, first, reuses, checked = quantize("a.yaml")
    assert first.reused_from_cache is None and reuses is None and checked
    assert (ctx1.run.path / "logs" / "llmcompressor.log").is_file()
    ctx2, second, reuses, checked = quantize("b.yaml")  # another run, the same inputs: not quantized again
    assert second.reused_from_cache and any("reusing the checkpoint" in x for x in lines)
    assert reuses.startswith("reuses the checkpoint cached") and second.reused_from_cache[:12] in reuses
    assert not checked  # the preflight that passed for these inputs before is not redone
    assert second.files == first.files and second.quantization_config == first.quantization_config
    assert not (ctx2.run.path / "logs" / "llmcompressor.log").exists()
    names = [sorted(p.name for p in c.checkpoint_dir.iterdir()) for c in (ctx1, ctx2)]
    assert names[0] == names[1]
    assert "quantize.json" in first.files  # every file of the export is in the record the release checks
    # the cached entry's weights edited in place (same size): found as it is copied, removed, quantized again
    entry = next((tmp_path / "cache" / "checkpoints").glob("*/model.safetensors"))
    raw = bytearray(entry.read_bytes())
    raw[-1] ^= 0xFF
    entry.write_bytes(bytes(raw))
    lines.clear()
    _, fourth, _, _ = quantize("d.yaml")
    assert fourth.reused_from_cache is None and fourth.files["model.safetensors"] == first.files["model.safetensors"]
    assert any("model.safetensors is not the file its authenticated index lists" in x and "quantized again" in x
               for x in lines), lines
    data["calibration"]["num_samples"] = 7  # other calibration: another checkpoint
    _, third, reuses, checked = quantize("c.yaml")
    assert third.reused_from_cache is None and reuses is None and checked and third.calibration["num_samples"] == 7


def test_float32_calibration_exports_the_same_checkpoint_layout_as_bf16(tiny_model_dir, tmp_path):
    """Calibrating in float32 (what 'auto' picks where bf16 is emulated) exports a bf16
    checkpoint with the same tensors, dtypes, shapes and config as calibrating in bf16,
    and nearly the same integers (GPTQ's own math is float32 either way)."""
    import torch

    out = {}
    for dtype in ("bfloat16", "float32"):
        data = tiny_variant("gptq-w4a16", tiny_model_dir)
        data["quantization"]["calibration_dtype"] = dtype
        out[dtype] = quantize(load_recipe(write_recipe(tmp_path, data, f"{dtype}.yaml")), tmp_path / dtype)
    assert out["float32"]["compute_dtype"] == {"dtype": "float32", "requested": "float32", "model_dtype": "bfloat16",
                                               "reason": "float32 as the recipe sets it"}
    a, b = tensors(tmp_path / "bfloat16"), tensors(tmp_path / "float32")
    assert {k: (v.dtype, v.shape) for k, v in a.items()} == {k: (v.dtype, v.shape) for k, v in b.items()}
    assert torch.float32 not in {v.dtype for v in b.values()}  # all cast to the export dtype
    configs = [json.loads((tmp_path / d / "config.json").read_text()) for d in ("bfloat16", "float32")]
    assert configs[0] == configs[1]
    packed = [k for k in a if k.endswith("weight_packed")]
    nibbles = [torch.stack([(t[k] >> s) & 0xF for s in range(0, 32, 4)]) for t in (a, b) for k in packed]
    half = len(packed)
    agree = sum((x == y).sum().item() for x, y in zip(nibbles[:half], nibbles[half:], strict=True))
    assert agree / sum(x.numel() for x in nibbles[:half]) > 0.8  # measured 0.92 on the tiny model
