"""The checks of a traffic row, applied to one generated answer (runs inside lm-eval's
`process_results`, in the evaluating child process): exact, contains, regex, json_schema,
or the user's own scorer, which runs in a separate Python process with a time limit.

A row's check arrives normalised by `traffic.py` (a schema already read, a regex already
compiled once there). Returns per-sample metrics: `passed` (0/1) and `errored` (1 when
the user's scorer raised, hung or said something that is not a bool: the row counts as
not passed, and the run goes on)."""

from __future__ import annotations

import json
import re
from typing import Any

from quantlab.quality.sandbox import run_python

# run in the code sandbox with the scorer's folder shown read-only; its verdict is the last
# line it prints, and counts only if the program ran to its end (a scorer that exits says nothing)
_SCORER = """
import json, sys
sys.path.insert(0, sys.argv[1])
module = __import__(sys.argv[2], fromlist=[sys.argv[3]])
data = json.loads(sys.stdin.read())
verdict = getattr(module, sys.argv[3])(data["answer"], data["row"])
if not isinstance(verdict, bool):
    raise TypeError(f"the scorer returned {type(verdict).__name__}, not a bool")
print(json.dumps(verdict))
"""


# A generated answer is untrusted: whatever it holds, its check is a row that fails, never
# an exception that ends the quality stage.
MAX_JSON_DEPTH = 100  # deeper fails: no real answer nests so, and a schema's validator recurses per level
# characters the decoder and its errors scan over all the starts tried (a failed start at
# position p costs about p: the error counts the lines before it): a few ms of C, then give up
MAX_DECODE_WORK = 4_000_000
_START = re.compile(r"[{\[]")


def _finite_only(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Python's decoder would read NaN/Infinity, which pass range checks


def _finite_float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):  # 1e999: too large for any JSON reader
        raise ValueError(f"{text[:20]} is out of range")
    return value


def json_depth(value: Any, limit: int) -> int:
    """How deep a decoded JSON value nests (a scalar: 0), counted without recursion;
    counting stops past `limit` (returns limit + 1)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return limit + 1
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def first_json(text: str) -> Any:
    """The first JSON object or array in a generated answer (models wrap it in prose and
    code fences), or None: none there, or none within bounds (nested deeper than
    MAX_JSON_DEPTH, NaN or an out-of-range number, more than MAX_DECODE_WORK of decoding
    to find it), which the check counts as a failed answer."""
    decoder = json.JSONDecoder(parse_constant=_finite_only, parse_float=_finite_float)
    looked = 0
    for start in _START.finditer(text):
        i = start.start()
        try:
            found = decoder.raw_decode(text, i)[0]
        except json.JSONDecodeError as err:
            looked += err.pos + 1
        except ValueError:  # NaN, 1e999, an integer past Python's digit limit: read to there, or further
            looked += len(text)
        except RecursionError:  # nested past what Python can decode: far past MAX_JSON_DEPTH
            return None
        else:
            return found if json_depth(found, MAX_JSON_DEPTH) <= MAX_JSON_DEPTH else None
        if looked > MAX_DECODE_WORK:
            return None
    return None


def check_answer(check: dict[str, Any], answer: str, row: dict[str, Any]) -> tuple[bool, str | None]:
    """(passed, error): error is a short reason when the check itself could not run."""
    kind, value = check["kind"], check["value"]
    if kind == "exact":
        return answer.strip() == value.strip(), None
    if kind == "contains":
        return value in answer, None
    if kind == "regex":
        return re.search(value, answer) is not None, None
    if kind == "json_schema":
        from jsonschema import Draft202012Validator, validators

        found = first_json(answer)
        if found is None:
            return False, None
        cls = validators.validator_for(value, default=Draft202012Validator)
        try:
            return cls(value).is_valid(found), None
        except (RecursionError, ArithmeticError, ValueError, TypeError) as err:  # e.g. a 4,000-digit multipleOf
            return False, f"json_schema could not be checked on this answer: {type(err).__name__}: {str(err)[:120]}"
    if kind == "python":
        payload = json.dumps({"answer": answer, "row": row})
        out = run_python(_SCORER, timeout_s=check["timeout_s"], stdin=payload, readable=(value["folder"],),
                         args=(value["folder"], value["module"], value["function"]))
        name = f"scorer {value['module']}:{value['function']}"
        if out.timed_out:
            return False, f"{name} took over {check['timeout_s']:g} s"
        said = (out.stdout.strip().splitlines() or [""])[-1]
        if not out.ok or said not in ("true", "false"):
            return False, f"{name} failed: {out.reason or 'it printed after its verdict'}"
        return said == "true", None
    raise ValueError(f"unknown check kind {kind!r}")


def score_checked(doc: dict[str, Any], results: list[str]) -> dict[str, int]:
    passed, error = check_answer(doc["check"], results[0], doc["row"])
    return {"passed": int(passed and error is None), "errored": int(error is not None)}


def score_unchecked(doc: dict[str, Any], results: list[str]) -> dict[str, int]:
    return {"answered": int(bool(results[0].strip()))}
