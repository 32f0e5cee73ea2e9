"""Secrets out of records: which names and values are secrets, what a record keeps of them."""

from __future__ import annotations

import hashlib

import pytest

from quantlab.core import redact

TOKEN = "hf_" + "Q" * 34


@pytest.mark.parametrize("name", ["api_key", "hf_token", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "db_password",
                                  "OPENAI_API_KEY", "auth", "authorization", "client_credentials", "privatekey"])
def test_secret_names(name):
    assert redact.secret_name(name)


@pytest.mark.parametrize("name", ["max_num_batched_tokens", "tokenizer", "tokenizer_mode", "skip_tokenizer_init",
                                  "kv_cache_dtype", "max_model_len", "VLLM_CPU_KVCACHE_SPACE", "author",
                                  "enable_auto_tool_choice", "ssl_keyfile", "keys_per_shard"])
def test_ordinary_names(name):
    assert not redact.secret_name(name)


@pytest.mark.parametrize("value", ["Bearer abcdefghijklmnop", "https://user:pa55@hub.example/org/model", TOKEN,
                                   "sk-" + "a" * 40, "ghp_" + "b" * 36, "AKIAABCDEFGHIJKLMNOP",
                                   '{"backend": "x", "token": "abc"}', '{"a": {"password": "p"}}'])
def test_secret_values(value):
    assert redact.secret_value(value)


@pytest.mark.parametrize("value", ["fp8", "bfloat16", "http://127.0.0.1:8000", '{"mode": 3}', "2048", "/data/hf",
                                   '{"token": null}', redact.digest("x")])
def test_ordinary_values(value):
    assert not redact.secret_value(value)


def test_a_value_becomes_its_sha256_so_records_compare_without_revealing_it():
    assert redact.value("s3cret") == "sha256:" + hashlib.sha256(b"s3cret").hexdigest()
    assert redact.value("s3cret") == redact.value("s3cret") != redact.value("other")
    assert redact.value(True) is True and redact.value(None) is None  # a flag is no secret
    assert redact.value(redact.value("s3cret")) == redact.value("s3cret")  # redacting twice changes nothing


def test_engine_args_keep_ordinary_values_and_hide_secret_ones():
    args = {"max_model_len": 512, "dtype": "bfloat16", "hf_token": "abc123", "tokenizer": "/m",
            "kv_transfer_config": '{"kv_connector": "X", "auth_token": "zzz"}', "otlp_traces_endpoint": TOKEN}
    out = redact.engine_args(args)
    assert out["max_model_len"] == 512 and out["dtype"] == "bfloat16" and out["tokenizer"] == "/m"
    assert out["hf_token"] == redact.digest("abc123")
    assert out["kv_transfer_config"] == redact.digest(args["kv_transfer_config"])
    assert out["otlp_traces_endpoint"] == redact.digest(TOKEN)
    assert redact.engine_args(None) is None


def test_every_env_value_is_hidden_names_kept():
    assert redact.env({"HF_TOKEN": "abc", "OMP_NUM_THREADS": "2"}) == \
        {"HF_TOKEN": redact.digest("abc"), "OMP_NUM_THREADS": redact.digest("2")}


def test_urls_lose_their_password_and_keep_their_host():
    assert redact.url("http://u:p@10.0.0.5:8000/v1") == "http://<redacted>@10.0.0.5:8000/v1"
    assert redact.url("http://10.0.0.5:8000") == "http://10.0.0.5:8000"


def test_launch_commands():
    argv = ["docker", "run", "-e", "HF_TOKEN=abc", "-e", "VLLM_API_KEY", "img", "--api-key", "xyz", "--port",
            "{port}", f"--hf-token={TOKEN}"]
    out = redact.command(argv)
    assert out[:3] == ["docker", "run", "-e"] and out[3] == f"HF_TOKEN={redact.digest('abc')}"
    assert out[5] == "VLLM_API_KEY"  # a name alone (docker passes the variable on) is no secret
    assert out[8] == redact.digest("xyz") and out[9:11] == ["--port", "{port}"]
    assert out[11] == f"--hf-token={redact.digest(TOKEN)}"


def test_a_recipe_as_records_keep_it():
    data = {"name": "r", "model": {"source": "https://u:p@hub.example/m"},
            "serve": {"env": {"HF_TOKEN": "abc"}, "engine_args": {"hf_token": "def", "max_model_len": 64},
                      "mode": "endpoint", "endpoint": "http://u:p@h:1", "command": None,
                      "targets": [{"name": "gpu", "env": {"X": "1"}, "engine_args": {"api_key_file": "k"}}]},
            "quality": {"notes": f"Authorization: Bearer {TOKEN}"}}
    out = redact.recipe(data)
    text = repr(out)
    assert "'abc'" not in text and "'def'" not in text and "u:p@" not in text and TOKEN not in text
    assert out["serve"]["engine_args"]["max_model_len"] == 64
    assert out["serve"]["targets"][0]["env"] == {"X": redact.digest("1")}
    assert out["model"]["source"] == "https://<redacted>@hub.example/m" and out["name"] == "r"
    assert data["serve"]["env"] == {"HF_TOKEN": "abc"}  # the recipe itself is untouched


def test_a_log_loses_the_values_and_keeps_the_rest():
    text = "args: {'hf_token': 'abcdef'} key=abcdef; port 8000"
    assert redact.scrub_text(text, ["abcdef", "x"]) == \
        f"args: {{'hf_token': '{redact.digest('abcdef')}'}} key={redact.digest('abcdef')}; port 8000"


def test_a_bad_secret_value_is_not_echoed_in_the_recipe_error():
    from quantlab.core.errors import RecipeError
    from quantlab.recipe.file import parse_recipe

    base = {"name": "x", "quantization": {"method": "rtn", "scheme": "W4A16"}}
    for serve in ({"env": {"HF_TOKEN": 98765432}}, {"engine_args": {"hf_token": ["abcdefgh"]}}):
        with pytest.raises(RecipeError) as err:
            parse_recipe({**base, "serve": serve})
        assert "98765432" not in str(err.value) and "abcdefgh" not in str(err.value)
    with pytest.raises(RecipeError, match=r"\(got 'abc'\)"):  # an ordinary field still shows what it got
        parse_recipe({**base, "serve": {"port": "abc"}})
