"""JSON from a model is untrusted: a traffic row's json_schema check of any answer
(brackets by the thousand, deep objects, huge or non-finite numbers) is a failed row,
never an exception that ends the quality stage; and a traffic file or schema file that
nests too deeply is bad input naming the file and line, not a crash."""

from __future__ import annotations

import json
import time

import jsonschema  # noqa: F401 (imported here, once: the check imports it on first use, not timed below)
import pytest

from quantlab.core.errors import RecipeError
from quantlab.quality.traffic import load_rows
from quantlab.quality.traffic_checks import MAX_JSON_DEPTH, check_answer, first_json, json_depth, score_checked

SCHEMA = {"type": "object", "required": ["age"],
          "properties": {"age": {"type": "number", "minimum": 0, "maximum": 150, "multipleOf": 0.5}}}
CHECK = {"kind": "json_schema", "value": SCHEMA}


def nested(depth: int) -> str:
    return '{"age": 30, "x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


HOSTILE = {
    "3000 open brackets": "[" * 3000,
    "5000 open objects": '{"a":' * 5000,
    "3000 balanced brackets": "[" * 3000 + "]" * 3000,
    "an object 2000 deep": '{"a":' * 2000 + "1" + "}" * 2000,
    "one level past the limit": nested(MAX_JSON_DEPTH + 1),
    "a 5000-digit integer": '{"age": ' + "9" * 5000 + "}",
    "1e999999": '{"age": 1e999999}',
    "NaN": '{"age": NaN}',
    "-Infinity": '{"age": -Infinity}',
    "unterminated nests, 200 KB": '{"age": [1, 2' * 20_000,
    "half a million starts": "[x" * 250_000,
    "deep then long": "[" * 500 + "1," * 50_000,
}


@pytest.mark.parametrize("answer", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_answer_is_a_failed_row_without_hanging(answer):
    start = time.perf_counter()
    metrics = score_checked({"check": CHECK, "row": {}}, [answer])  # what lm-eval's process_results calls
    # a hang guard, not a speed claim (each takes milliseconds): a quadratic or exponential
    # parse of these inputs takes minutes; 10 s leaves room for a loaded 2-core machine
    assert time.perf_counter() - start < 10.0
    assert metrics["passed"] == 0


def test_well_formed_answers_still_pass_and_fail_on_their_merits():
    assert score_checked({"check": CHECK, "row": {}}, ['Here it is:\n```json\n{"age": 30.5}\n```'])["passed"] == 1
    assert score_checked({"check": CHECK, "row": {}}, ['{"age": 30.25}'])["passed"] == 0  # not a multiple of 0.5
    assert score_checked({"check": CHECK, "row": {}}, [nested(MAX_JSON_DEPTH)])["passed"] == 1  # at the limit
    # prose with brackets before the answer: each failed start is cheap
    assert score_checked({"check": CHECK, "row": {}}, ["see [x] " * 300 + '{"age": 3}'])["passed"] == 1


def test_a_validator_that_cannot_apply_the_schema_errs_with_a_reason():
    # 4,000 digits parse as an int, and jsonschema's multipleOf overflows converting it to a float
    check = {"kind": "json_schema", "value": {"properties": {"age": {"multipleOf": 0.5}}}}
    passed, error = check_answer(check, '{"age": ' + "9" * 4000 + "}", {})
    assert not passed and "OverflowError" in error
    assert score_checked({"check": check, "row": {}}, ['{"age": ' + "9" * 4000 + "}"]) == {"passed": 0, "errored": 1}


def test_first_json_bounds():
    assert first_json('x {"a": [1, {"b": null}]} y') == {"a": [1, {"b": None}]}
    assert first_json("[" * 3000) is None
    assert first_json('{"a": NaN}') is None and first_json("[1e400]") is None
    assert json_depth({"a": [[1]]}, 10) == 3 and json_depth(5, 10) == 0
    assert json_depth(json.loads("[" * 50 + "]" * 50), 10) == 11  # stops counting past the limit


def _traffic(tmp_path, row: str, schema: str | None = None):
    if schema is not None:
        (tmp_path / "s.json").write_text(schema)
    path = tmp_path / "traffic.jsonl"
    path.write_text('{"id": "ok", "prompt": "x"}\n' + row + "\n")
    return path


@pytest.mark.parametrize("row, schema, message", [
    ('{"id": "a", "prompt": "x", "extra": ' + "[" * 3000 + "]" * 3000 + "}", None, "not JSON: nested too deeply"),
    ('{"id": "a", "prompt": "x", "n": ' + "9" * 5000 + "}", None, "not JSON: .*digits"),
    ('{"id": "a", "prompt": "x", "reference": ' + "[" * 200 + "]" * 200 + "}", None, "nests more than 100"),
    ('{"id": "a", "prompt": "x", "check": {"json_schema": "s.json"}}', "[" * 3000 + "]" * 3000,
     "s.json is not JSON: nested too deeply"),
    ('{"id": "a", "prompt": "x", "check": {"json_schema": "s.json"}}',
     '{"items": ' * 150 + "{}" + "}" * 150, "s.json nests more than 100 levels"),
])
def test_a_deep_traffic_row_or_schema_is_bad_input_naming_the_line(tmp_path, row, schema, message):
    path = _traffic(tmp_path, row, schema)
    with pytest.raises(RecipeError, match=message) as err:
        load_rows(path)
    assert err.value.file == f"{path}:2" and err.value.exit_code == 2
