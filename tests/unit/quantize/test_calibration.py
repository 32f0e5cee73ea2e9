from __future__ import annotations

import json

import pytest
from conftest import CALIB

from quantlab.quantize.calibration import allocate, read_rows
from quantlab.core.errors import RecipeError


@pytest.mark.parametrize("line, needle", [
    ("not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"text": "a", "messages": []}', "exactly one of 'text' or 'messages'"),
    ('{"prompt": "a"}', "exactly one of 'text' or 'messages'"),
    ('{"text": ""}', "non-empty string"),
    ('{"messages": [{"role": "wizard", "content": "x"}]}', "messages[0] must be"),
])
def test_bad_rows_name_file_and_line(tmp_path, line, needle):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(RecipeError) as e:
        read_rows(f)
    assert f"{f}:2" in str(e.value) and needle in str(e.value)


def test_empty_file(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text("\n")
    with pytest.raises(RecipeError, match="holds no rows"):
        read_rows(f)


@pytest.mark.parametrize("name", ["prose", "chat", "code"])
def test_shipped_sets_are_valid(name):
    rows = read_rows(CALIB / f"{name}.jsonl")
    assert len(rows) >= 256
    assert all(json.loads(l).get("source") for l in (CALIB / f"{name}.jsonl").read_text().splitlines())


def test_allocate_sums_exactly():
    assert allocate(64, [2, 1, 1]) == [32, 16, 16]
    assert sum(allocate(7, [1, 1, 1])) == 7
    assert allocate(5, [1]) == [5]
