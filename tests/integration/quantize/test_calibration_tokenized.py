"""Calibration sets tokenized with the default model's tokenizer: sampling, templating,
truncation and the hash of exactly what is calibrated on."""

from __future__ import annotations

import pytest
from conftest import CALIB

from quantlab.quantize.calibration import build_calibration_set
from quantlab.recipe.quantize import CalibrationSpec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def spec(**kw):
    base = {"datasets": [{"path": str(CALIB / "chat.jsonl")}, {"path": str(CALIB / "prose.jsonl")}],
            "num_samples": 10, "max_seq_length": 64}
    return CalibrationSpec.model_validate({**base, **kw})


def paths(s):
    from pathlib import Path

    return [Path(d.path) for d in s.datasets]


def test_set_is_deterministic_truncated_and_hashed(tokenizer):
    s = spec()
    a = build_calibration_set(s, paths(s), tokenizer)
    b = build_calibration_set(s, paths(s), tokenizer)
    assert a.sha256 == b.sha256 and a.input_ids == b.input_ids
    assert a.num_samples == 10 and max(map(len, a.input_ids)) <= 64
    assert a.num_tokens == sum(map(len, a.input_ids))
    c = build_calibration_set(spec(seed=1), paths(s), tokenizer)
    assert c.sha256 != a.sha256
    summary = a.summary(s)
    assert summary["files"][0]["used"] == 5 and summary["files"][1]["used"] == 5


def test_chat_template_is_applied_only_when_asked(tokenizer):
    s = spec(datasets=[{"path": str(CALIB / "chat.jsonl")}], max_seq_length=512)
    on = build_calibration_set(s, paths(s), tokenizer)
    off_spec = spec(datasets=[{"path": str(CALIB / "chat.jsonl")}], max_seq_length=512, chat_template=False)
    off = build_calibration_set(off_spec, paths(off_spec), tokenizer)
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert all(ids[0] == start for ids in on.input_ids)
    assert not any(start in ids for ids in off.input_ids)


def test_asking_for_more_than_a_file_holds_is_noted(tmp_path, tokenizer):
    f = tmp_path / "small.jsonl"
    f.write_text('{"text": "one"}\n{"text": "two"}\n')
    s = CalibrationSpec.model_validate({"datasets": [{"path": str(f)}], "num_samples": 5})
    cs = build_calibration_set(s, [f], tokenizer)
    assert cs.num_samples == 2 and "used all" in cs.notes[0]
