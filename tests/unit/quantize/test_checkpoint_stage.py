"""`quantlab validate`'s checkpoint stage: the whole checkpoint is copied in (subfolders
included), hashed, and pickle weights anywhere in it are refused."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from quantlab.core.errors import RecipeError
from quantlab.quantize import checkpoint_stage


def checkpoint(folder):
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq"}}))
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer" / "tokenizer.json").write_text("{}")
    (folder / "quantlab-manifest.json").write_text("{}")  # an earlier release's: not carried over
    return folder


def context(tmp_path, src):
    artifacts = []
    return SimpleNamespace(import_from=src, checkpoint_dir=tmp_path / "run" / "checkpoint",
                           progress=lambda msg: None, add_artifact=lambda path, role: artifacts.append(path),
                           artifacts=artifacts)


def test_a_checkpoint_is_copied_whole_subfolders_included(tmp_path):
    src = checkpoint(tmp_path / "src")
    ctx = context(tmp_path, src)
    (tmp_path / "run").mkdir()
    checkpoint_stage.preflight(ctx)
    result = checkpoint_stage.run(ctx)
    assert sorted(result.files) == ["config.json", "model.safetensors", "tokenizer/tokenizer.json"]
    assert (ctx.checkpoint_dir / "tokenizer" / "tokenizer.json").read_text() == "{}"
    assert not (ctx.checkpoint_dir / "quantlab-manifest.json").exists()
    assert result.format == "gptq" and ctx.artifacts == ["checkpoint/model.safetensors"]
    assert "tokenizer/tokenizer.json" in checkpoint_stage.inputs(ctx)["files"]  # a change there redoes the stage


def test_pickle_weights_in_a_subfolder_are_refused(tmp_path):
    src = checkpoint(tmp_path / "src")
    (src / "tokenizer" / "extra.bin").write_bytes(b"pickle")
    with pytest.raises(RecipeError, match="pickle weight files"):
        checkpoint_stage.preflight(context(tmp_path, src))
