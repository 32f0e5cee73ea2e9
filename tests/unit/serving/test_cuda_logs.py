"""vLLM 0.33 CUDA start-up logs through the log parser (serving/engine_log.py) and the serve
check's kernel-path gate (serving/gates.py), against the expectation the plan makes for the
GPU (serving/kernels.py via serving/compat.py). No GPU ran these: each log in
tests/data/cuda_logs is written from vLLM 0.33.0's own logger statements, cited file:line in
its header (see the README there). No engine starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from quantlab.release.decision import DecisionPolicy, decide
from quantlab.serving.compat import check_compat
from quantlab.serving.engine_log import expected_but_missing, parse_engine_log, startup_phase
from quantlab.serving.gates import kernel_path, verdicts

LOGS = Path(__file__).resolve().parents[2] / "data" / "cuda_logs"
VERSIONS = {"vllm": "0.33.0", "compressed-tensors": "0.17.0"}  # the CUDA serving environment's pins
A100 = {"device": "cuda", "versions": VERSIONS, "gpus": [{"name": "NVIDIA A100-SXM4-80GB", "capability": [8, 0]}]}
H100 = {"device": "cuda", "versions": VERSIONS, "gpus": [{"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]}]}


def w4a16(group_size: int) -> dict:
    return {"quant_method": "compressed-tensors", "version": "0.17.0", "config_groups": {"g": {
        "weights": {"type": "int", "num_bits": 4, "strategy": "group", "group_size": group_size, "symmetric": True},
        "input_activations": None}}}


FP8_DYNAMIC = {"quant_method": "compressed-tensors", "version": "0.17.0", "config_groups": {"g": {
    "weights": {"type": "float", "num_bits": 8, "strategy": "channel"},
    "input_activations": {"type": "float", "num_bits": 8, "dynamic": True, "strategy": "token"}}}}
WNA16 = ("mixed-precision linear", "CompressedTensorsWNA16")  # the two lines a weight-only layer type logs


def log_text(name: str) -> str:
    """The log lines of a data file, its header (the '#' lines citing vLLM's source) left out."""
    text = (LOGS / f"vllm-0.33.0-{name}.written-from-source.log").read_text()
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


def judge(name, config, probe, *, engine_args=None, allow=()):
    facts = parse_engine_log(log_text(name))
    expectation = check_compat(config, probe).kernel_expectation
    record = kernel_path(expectation, facts, mode="launch", allow=list(allow), engine_args=engine_args)
    return facts, record, verdicts(record, scope="primary")


@pytest.mark.parametrize("name, config, probe, kernel", [
    ("a100-w4a16-marlin", w4a16(128), A100, "MarlinLinearKernel"),
    ("h100-w4a16-machete", w4a16(128), H100, "MacheteLinearKernel"),
])
def test_weight_only_int4_gets_marlin_on_ampere_and_machete_on_hopper(name, config, probe, kernel):
    facts, record, [v] = judge(name, config, probe)
    assert facts["linear_kernels"] == {layer: [kernel] for layer in WNA16}
    assert v.verdict == "pass" and v.value == 0 and kernel in v.evidence and "vLLM 0.33.0" in v.evidence
    assert record["expected"] == (["MacheteLinearKernel", "HummingLinearKernel", "MarlinLinearKernel"]
                                  if probe is H100 else ["MarlinLinearKernel"])


def test_fp8_dynamic_on_hopper_gets_cutlass_and_the_fp8_kv_cache_asked():
    facts, record, [v] = judge("h100-fp8-dynamic-cutlass", FP8_DYNAMIC, H100, engine_args={"kv_cache_dtype": "fp8"})
    assert facts["linear_kernels"] == {"CompressedTensorsW8A8Fp8": ["CutlassFP8ScaledMMLinearKernel"]}
    assert facts["kv_cache_dtype"] == "fp8" and record["kv_cache_dtype"] == {"expected": "fp8", "actual": "fp8"}
    assert v.verdict == "pass" and "KV cache fp8 as asked" in v.evidence
    # no k/v scales in the checkpoint: vLLM's warning is recorded as uncalibrated scales
    assert [w["kind"] for w in facts["warnings"]] == ["uncalibrated_kv_scales"]


def test_a_weight_only_fallback_to_exllama_blocks_the_release():
    facts, record, [v] = judge("a100-w4a16-g256-exllama", w4a16(256), A100)
    assert facts["linear_kernels"] == {layer: ["ExllamaLinearKernel"] for layer in WNA16}
    assert v.verdict == "fail" and record["off_path"] == v.value == 1
    assert "CompressedTensorsWNA16 ran ExllamaLinearKernel (expected MarlinLinearKernel)" in v.evidence
    assert decide([v], DecisionPolicy()).record.failed_gates == ["serve.kernel_path@primary"]


def test_fp8_below_ada_falls_back_silently_so_the_gate_cannot_decide():
    """vLLM 0.33 serves W8A8-FP8 below compute capability 8.9 as weight-only FP8 on Humming
    and logs no kernel line nor Marlin's warning: nothing to judge, nothing an allow-list can
    accept."""
    facts, record, [v] = judge("a100-fp8-dynamic-humming-silent", FP8_DYNAMIC, A100)
    assert facts["linear_kernels"] == {} and facts["warnings"] == []
    assert v.verdict == "inconclusive" and record["why"] == "the log named no linear kernel"
    allowed = judge("a100-fp8-dynamic-humming-silent", FP8_DYNAMIC, A100, allow=["MarlinFP8ScaledMMLinearKernel"])
    assert allowed[2][0].verdict == "inconclusive"
    assert expected_but_missing(facts, quantized=True, kv_cache_quantized=False, device="cuda") == [
        "linear kernel selection (no 'Selected/Using ...Kernel for ...' line)"]


@pytest.mark.parametrize("name", ["a100-w4a16-marlin", "h100-w4a16-machete", "h100-fp8-dynamic-cutlass",
                                  "a100-w4a16-g256-exllama", "a100-fp8-dynamic-humming-silent"])
def test_the_engine_facts_of_a_cuda_start(name):
    facts = parse_engine_log(log_text(name))
    assert facts["vllm_version"] == "0.33.0" and facts["attention_backend"] == "FLASH_ATTN"
    assert facts["kv_cache_pool"] == "GPU" and facts["kv_cache_tokens"] > 100_000
    assert facts["max_concurrency_at_tokens"] == facts["max_model_len"] == 4096
    # the V2 model runner's "Loading model from scratch..." starts the loading phase
    phases = facts["startup_phases_s"]
    assert list(phases) == ["before the engine", "initializing the engine", "loading weights",
                            "allocating the KV cache", "starting the API server"]
    assert phases["initializing the engine"] == 1.0 and phases["loading weights"] > 30
    assert startup_phase(log_text(name)) == "API server up"
    head = log_text(name).split("Loading model from scratch")[0] + "Loading model from scratch..."
    assert startup_phase(head) == "loading weights"


def test_every_log_line_is_a_statement_its_header_cites():
    """Each line's [file:line] is one of the vLLM statements cited in the headers."""
    cited = set()
    for path in LOGS.glob("*.written-from-source.log"):
        cited |= {(Path(p).name, n) for p, n in re.findall(r"^#\s+(vllm/[\w/.]+\.py):(\d+)", path.read_text(), re.M)}
    lines = [line for path in LOGS.glob("*.log") for line in path.read_text().splitlines() if line[:1] != "#"]
    assert len(lines) >= 50
    for line in lines:
        m = re.match(r"^\((?:APIServer|EngineCore) pid=\d+\) (?:INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d "
                     r"\[([\w.]+):(\d+)\] \S", line)
        assert m and m.groups() in cited, line[:120]
