"""The per-scheme kernel microbenchmark (serving/kernel_bench.py) in the real serving
environment: vLLM's own scheme classes build, pack and run each layer of the tiny model."""

from __future__ import annotations

import pytest
from conftest import refusal

from quantlab.search.schemes import tensor_shapes
from quantlab.serving.kernel_bench import DECODE_TOKENS, PREFILL_TOKENS, layer_shapes, measure_kernels
from quantlab.serving.vllm_probe import serving_python
from quantlab.recipe.serve import ServeSpec

pytestmark = pytest.mark.slow

W4A16 = {"id": "w4a16_g64", "kind": "wna16", "bits": 4, "group_size": 64, "symmetric": True}
W8A8 = {"id": "w8a8_int8", "kind": "w8a8_int8"}


def test_each_servable_schemes_kernel_is_timed_against_the_16_bit_layer(tiny_model_dir, serving_probe, tmp_path,
                                                                         monkeypatch):
    if serving_probe.get("device") != "cpu":
        pytest.skip("the kernel microbenchmark runs on CPU targets")
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    shapes = layer_shapes(tensor_shapes(tiny_model_dir))
    assert len(shapes) == 7 and [256, 128] in shapes  # q, k, v, o, gate, up, down of one decoder layer
    servable = [s for s, recipe in ((W4A16, "gptq-w4a16"), (W8A8, "smoothquant-gptq-w8a8"))
                if refusal(serving_probe, recipe) is None]
    if not servable:
        pytest.skip("this host's engine build serves neither W4A16 nor W8A8 int8")
    python = serving_python(ServeSpec())
    result = measure_kernels(python, serving_probe, shapes, servable)
    assert result["measured"] and all(result["dense"][str(m)] > 0 for m in (DECODE_TOKENS, PREFILL_TOKENS))
    for scheme in servable:
        entry = result["schemes"][scheme["id"]]
        assert "error" not in entry, entry
        assert set(entry["ratio"]) == {str(DECODE_TOKENS), str(PREFILL_TOKENS)}
        assert all(0 < r < 100 for r in entry["ratio"].values())
    # kept on disk: the same environment, shapes and schemes are not measured twice
    assert list((tmp_path / "cache" / "kernel-bench").glob("*.json"))
    assert measure_kernels(python, serving_probe, shapes, servable) == result
    # a target that is not a CPU is not measured here, and says why
    gpu = {**serving_probe, "device": "cuda"}
    assert measure_kernels(python, gpu, shapes, servable)["measured"] is False
