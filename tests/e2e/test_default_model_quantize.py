"""The embedded default model through a shipped recipe, via the CLI, loaded back."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import RECIPES, REPO

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_rtn_w8a16_on_default_model_loads_back_and_agrees(tmp_path, default_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "ckpt"
    r = subprocess.run([sys.executable, "-m", "quantlab", "quantize", RECIPES / "rtn-w8a16.yaml", "--output", out],
                       capture_output=True, text=True, cwd=REPO, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith(str(out.resolve()))
    result = json.loads((out / "quantize.json").read_text())
    assert result["model"]["kind"] == "default" and result["layers_quantized"] == 210  # 30 layers x 7
    # int8 weights: well under the bf16 checkpoint's 269 MB (embeddings stay bf16)
    assert result["checkpoint"]["size_bytes"] < 0.8 * (default_model_dir / "model.safetensors").stat().st_size

    tok = AutoTokenizer.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.bfloat16)
    quant = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)  # compressed-tensors decompresses
    text = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
            "must be in want of a wife.")
    ids = tok(text, return_tensors="pt")
    with torch.no_grad():
        lb = base(**ids).logits[0].float()
        lq = quant(**ids).logits[0].float()
    agree = (lb.argmax(-1) == lq.argmax(-1)).float().mean().item()
    assert agree >= 0.9, f"int8 per-channel weights changed {1 - agree:.0%} of next-token argmaxes"
    assert not torch.equal(lb, lq), "the loaded model must actually be the quantized one"
