"""Launch planning: pure, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantlab.errors import RecipeError
from quantlab.recipe import ServeSpec, parse_recipe
from quantlab.stages.serve import effective_engine_args, engine_arg_list, plan_launch


def test_engine_args_become_flags():
    assert engine_arg_list({"max_model_len": 2048, "enforce_eager": True, "x": False, "y": None}) == \
        ["--max-model-len", "2048", "--enforce-eager"]


def test_cpu_defaults_can_be_overridden():
    spec = ServeSpec(engine_args={"gpu_memory_utilization": 0.2})
    assert effective_engine_args(spec, "cpu", "bfloat16") == {"dtype": "bfloat16", "gpu_memory_utilization": 0.2}
    assert effective_engine_args(ServeSpec(), "cuda", "float16") == {"dtype": "float16"}


def test_command_template_placeholders(tmp_path):
    spec = ServeSpec(mode="command", command=["run", "--m={model}", "{host}:{port}", "{served_model_name}"],
                     cpu_kv_cache_space_gib=2)
    plan = plan_launch(spec, Path("/m"), "cand", "cpu", {"max_model_len": 64}, port=1234)
    assert plan.argv == ["run", "--m=/m", "127.0.0.1:1234", "cand", "--max-model-len", "64"]
    assert plan.env["VLLM_CPU_KVCACHE_SPACE"] == "2" and plan.base_url == "http://127.0.0.1:1234"
    bad = ServeSpec(mode="command", command=["run", "{modle}"])
    with pytest.raises(RecipeError, match="unknown placeholder 'modle'"):
        plan_launch(bad, Path("/m"), "c", "cpu", {}, port=1)


@pytest.mark.parametrize("serve, needle", [
    ({"mode": "command"}, "needs 'command'"),
    ({"mode": "endpoint"}, "needs 'endpoint'"),
    ({"command": ["x"]}, "only used with mode 'command'"),
    ({"engine_args": {"port": 1}}, "sets model, port, host"),
    ({"engine_args": {"--max-model-len": 1}}, "without dashes"),
    ({"startup_timeout_s": 0}, "greater than 0"),
])
def test_bad_serve_sections(serve, needle):
    with pytest.raises(RecipeError, match=needle):
        parse_recipe({"name": "x", "quantization": {"method": "rtn", "scheme": "W4A16"}, "serve": serve})
