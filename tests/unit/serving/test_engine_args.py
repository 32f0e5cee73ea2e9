"""serve.engine_args as vLLM's parser reads them: argparse's prefix rule over the option
table, the options quantlab sets itself refused by the schema (no serving environment
needed) and at the preflight (the serving environment's own parser, from its probe)."""

from __future__ import annotations

import pytest

from quantlab.core.errors import RecipeError
from quantlab.recipe.file import parse_recipe
from quantlab.serving.engine_args import check_engine_args, resolve
from quantlab.serving.plan import EngineTarget, plan_serving

# a slice of vLLM 0.32's api_server table (option string -> dest), as the probe dumps it
TABLE = {"allow_abbrev": True, "options": {
    "--host": "host", "--port": "port", "--uds": "uds", "--api-key": "api_key", "--model": "model",
    "--model-impl": "model_impl", "--max-model-len": "max_model_len", "--max-num-seqs": "max_num_seqs",
    "--trust-remote-code": "trust_remote_code", "--no-trust-remote-code": "trust_remote_code",
    "--served-model-name": "served_model_name", "--config": "config", "--config-format": "config_format",
    "--dtype": "dtype", "--hf-token": "hf_token", "--compilation-config": "compilation_config",
    "-cc": "compilation_config", "-tp": "tensor_parallel_size", "--tensor-parallel-size": "tensor_parallel_size",
    "--enforce-eager": "enforce_eager", "--no-enforce-eager": "enforce_eager"}}
CPU_PROBE = {"device": "cpu", "versions": {"vllm": "0.32.0"}, "gpus": [], "engine_options": TABLE}


def recipe(serve: dict):
    return parse_recipe({"name": "x", "quantization": {"method": "rtn", "scheme": "W4A16"}, "serve": serve})


def test_argparse_prefix_rule():
    options = TABLE["options"]
    assert resolve("max_model_len", options) == (["--max-model-len"], ["max_model_len"])
    assert resolve("hos", options) == (["--host"], ["host"])
    assert resolve("max_model", options) == (["--max-model-len"], ["max_model_len"])
    assert resolve("max", options) == (["--max-model-len", "--max-num-seqs"], ["max_model_len", "max_num_seqs"])
    assert resolve("model", options) == (["--model"], ["model"])  # exact wins over --model-impl
    assert resolve("compilation_config.mode", options) == (["--compilation-config"], ["compilation_config"])
    assert resolve("nothing", options) == ([], [])
    assert resolve("hos", options, allow_abbrev=False) == ([], [])


@pytest.mark.parametrize("key, field", [
    ("hos", "serve.host"), ("ho", "serve.host"), ("host", "serve.host"), ("por", "serve.port"),
    ("served_model_nam", "serve.served_model_name"), ("served-model-name", "serve.served_model_name"),
    ("api_key", "a random key"), ("trust_remote_code", "model.trust_remote_code"),
    ("no_trust_remote_code", "model.trust_remote_code"), ("config", "serve.engine_args itself"),
    ("model", "model.source"), ("host.x", "serve.host"),
])
def test_the_schema_refuses_what_quantlab_sets_and_its_abbreviations(key, field):
    """`recipes check` without the serving environment already catches `hos`."""
    with pytest.raises(RecipeError) as err:
        recipe({"engine_args": {key: "0.0.0.0"}})
    assert f"serve.engine_args.{key}" in str(err.value) and field in str(err.value)


@pytest.mark.parametrize("key", ["max_model_len=1", "a b", "-x", "--max-model-len", ""])
def test_the_schema_refuses_what_is_no_option_name(key):
    with pytest.raises(RecipeError, match="not an engine argument name"):
        recipe({"engine_args": {key: 1}})


@pytest.mark.parametrize("key, needle", [
    ("uds", None),  # a real option, not quantlab's: allowed
    ("max_model", "abbreviates --max-model-len: write it in full \\(max_model_len\\)"),
    ("max", "ambiguous.*--max-model-len, --max-num-seqs"),
    ("tp", "no option --tp; -tp is vLLM 0.32.0's short form of --tensor-parallel-size: write tensor_parallel_size"),
    ("nothing_like_it", "no option --nothing-like-it"),
    ("con", "--con is a prefix of --config, --config-format.*an option quantlab sets itself"),
])
def test_the_preflight_resolves_with_the_parser_table(key, needle):
    spec = recipe({"engine_args": {key: 1}}).serve if key != "con" else None
    if spec is None:  # the schema already refuses --con (a prefix of --config); the table says the same
        with pytest.raises(RecipeError, match=needle):
            check_engine_args({key: 1}, TABLE, engine="vLLM 0.32.0")
        return
    if needle is None:
        plan_serving(spec, [EngineTarget("baseline", None, "b")], dtype="bfloat16", probe=CPU_PROBE)
        return
    with pytest.raises(RecipeError, match=needle) as err:
        plan_serving(spec, [EngineTarget("baseline", None, "b")], dtype="bfloat16", probe=CPU_PROBE)
    assert err.value.field == f"serve.engine_args.{key}" and err.value.exit_code == 2


def test_two_spellings_of_one_option_are_refused():
    with pytest.raises(RecipeError, match="max_model_len and serve.engine_args.max-model-len are both"):
        check_engine_args({"max_model_len": 1, "max-model-len": 2}, TABLE, engine="vLLM")
    check_engine_args({"compilation_config.mode": 3, "compilation_config.level": 3}, TABLE, engine="vLLM")


def test_without_a_table_only_the_schema_check_ran():
    check_engine_args({"max_model": 1}, None, engine="vLLM")
    check_engine_args({"max_model": 1}, {"error": "building vLLM's api_server parser: ImportError"}, engine="vLLM")


def test_the_option_table_is_not_recorded():
    spec = recipe({"engine_args": {"max_model_len": 64}}).serve
    plan = plan_serving(spec, [EngineTarget("baseline", None, "b")], dtype="bfloat16", probe=CPU_PROBE)
    assert "engine_options" not in plan.probe and plan.engine_args["max_model_len"] == 64


def test_model_trust_remote_code_reaches_the_servers():
    spec = recipe({}).serve
    targets = [EngineTarget("baseline", None, "b")]
    assert "trust_remote_code" not in plan_serving(spec, targets, dtype="bfloat16", probe=CPU_PROBE).engine_args
    trusted = plan_serving(spec, targets, dtype="bfloat16", probe=CPU_PROBE, trust_remote_code=True)
    assert trusted.engine_args["trust_remote_code"] is True


def test_a_target_with_a_refused_key_fails_even_when_optional():
    from quantlab.serving.plan import plan_extra_target

    spec = recipe({"targets": [{"name": "gpu", "required": False, "engine_args": {"uds": "/tmp/s"}}]}).serve
    ok = plan_extra_target(spec, spec.targets[0], baseline_dir=None, candidate_dir=None, dtype="bfloat16",
                           probe=CPU_PROBE)
    assert ok.plan is not None
    # a build whose only option starting --uds is one quantlab sets: the target is refused, optional or not
    table = {"allow_abbrev": True, "options": {**{k: v for k, v in TABLE["options"].items() if k != "--uds"},
                                               "--udsx": "host"}}
    with pytest.raises(RecipeError, match="serve target 'gpu'.*an option quantlab sets itself"):
        plan_extra_target(spec, spec.targets[0], baseline_dir=None, candidate_dir=None, dtype="bfloat16",
                          probe={**CPU_PROBE, "engine_options": table})


@pytest.mark.slow
def test_abbreviations_through_the_serving_environments_own_parser(serving_probe):
    """vLLM 0.32's api_server parser itself (dumped by the probe, cached per environment):
    every abbreviation of an option quantlab sets is refused, naming the field to use."""
    from quantlab.serving.vllm_probe import probe_serving_env, serving_python
    from quantlab.recipe.serve import ServeSpec

    table = serving_probe["engine_options"]
    assert table["allow_abbrev"] is True and len(table["options"]) > 300
    options = table["options"]
    assert options["--host"] == "host" and options["--api-key"] == "api_key"
    for key, dest in [("hos", "host"), ("ho", "host"), ("por", "port"), ("served_model_nam", "served_model_name"),
                      ("trust_remote_cod", "trust_remote_code"), ("api_ke", "api_key"), ("conf", None)]:
        matches, dests = resolve(key, options)
        assert (dests == [dest]) if dest else len(matches) > 1, (key, matches)
        with pytest.raises(RecipeError):
            check_engine_args({key: "x"}, table, engine="vLLM 0.32.0")
    check_engine_args({"max_model_len": 512, "enforce_eager": True, "compilation_config.mode": 3,
                       "kv_cache_dtype": "fp8", "hf_token": "x"}, table, engine="vLLM 0.32.0")
    assert probe_serving_env(serving_python(ServeSpec())) == serving_probe  # cached: no second vLLM import
