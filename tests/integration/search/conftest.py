"""The tiny model with one layer broken on purpose for 4-bit rounding, shared by the
sensitivity and search tests."""

from __future__ import annotations

import shutil

import pytest

BROKEN = "model.layers.0.mlp.down_proj"


@pytest.fixture(scope="session")
def outlier_model(tiny_model_dir, tmp_path_factory):
    """The tiny model with one outlier per 64 weights in one module: fine in bf16, wrecked by
    4-bit round-to-nearest with group size 64 (the outlier sets every group's scale)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("tiny-outlier")
    shutil.copytree(tiny_model_dir, folder, dirs_exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    weight = dict(model.named_modules())[BROKEN].weight.data
    weight[:, ::64] = 0.5  # 25x the init's std: every group of 64 along the input holds one
    model.save_pretrained(folder, safe_serialization=True)
    return folder
