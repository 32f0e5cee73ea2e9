from __future__ import annotations

import pytest

from quantlab.core.errors import RecipeError
from quantlab.models.source import resolve_model


def test_local_folder_without_config(tmp_path):
    with pytest.raises(RecipeError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_local_folder_with_pickle_weights_only(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(RecipeError, match="safetensors only"):
        resolve_model(str(tmp_path))


def test_not_a_folder_nor_hub_id(tmp_path):
    with pytest.raises(RecipeError, match="neither 'default', an existing folder"):
        resolve_model("./missing-folder", base_dir=tmp_path)


def test_uncached_hub_id_offline_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(RecipeError, match="not in the local Hugging Face cache"):
        resolve_model("someorg/some-model")
