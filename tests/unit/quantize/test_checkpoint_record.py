"""The quantize stage's record of its checkpoint: every file of the export (quantize.json
and subfolders included), the export's own digests where it hashed them, no links."""

from __future__ import annotations

import json

import pytest

from quantlab.core import folder_record
from quantlab.core.errors import EngineError
from quantlab.quantize.stage import record_checkpoint


def export(folder):
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * 32)
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer" / "tokenizer.json").write_text("{}")
    (folder / "quantize.json").write_text(json.dumps({"checkpoint": {}}))
    return folder


def test_every_file_is_recorded_the_exports_digests_kept(tmp_path):
    folder = export(tmp_path / "checkpoint")
    exported = {"model.safetensors": {"size": 32, "sha256": "a" * 64}}  # as summarize_checkpoint hashed it
    record = record_checkpoint(folder, exported)
    assert sorted(record) == ["config.json", "model.safetensors", "quantize.json", "tokenizer/tokenizer.json"]
    assert record["model.safetensors"] == exported["model.safetensors"]
    assert record["quantize.json"] == folder_record.file_digest(folder / "quantize.json")


def test_a_link_in_the_export_is_refused(tmp_path):
    folder = export(tmp_path / "checkpoint")
    (folder / "added_tokens.json").symlink_to(tmp_path)
    with pytest.raises(EngineError, match="added_tokens.json"):
        record_checkpoint(folder, {})
