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

_SCORER = """
import json, sys
sys.path.insert(0, sys.argv[1])
module = __import__(sys.argv[2], fromlist=[sys.argv[3]])
data = json.loads(sys.stdin.read())
verdict = getattr(module, sys.argv[3])(data["answer"], data["row"])
if not isinstance(verdict, bool):
    raise SystemExit(f"the scorer returned {type(verdict).__name__}, not a bool")
print(json.dumps(verdict))
"""


def first_json(text: str) -> Any:
    """The first JSON object or array in a generated answer (models wrap it in prose and
    code fences), or None."""
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "{[":
            try:
                return decoder.raw_decode(text[i:])[0]
            except ValueError:
                continue
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
        return cls(value).is_valid(found), None
    if kind == "python":
        payload = json.dumps({"answer": answer, "row": row})
        out = run_python(_SCORER, timeout_s=check["timeout_s"], stdin=payload,
                         args=(value["folder"], value["module"], value["function"]))
        if out.timed_out:
            return False, f"scorer {value['module']}:{value['function']} took over {check['timeout_s']:g} s"
        if not out.ok:
            last = (out.stderr.strip().splitlines() or ["exited non-zero"])[-1]
            return False, f"scorer {value['module']}:{value['function']} failed: {last[:200]}"
        return json.loads(out.stdout.strip().splitlines()[-1]), None
    raise ValueError(f"unknown check kind {kind!r}")


def score_checked(doc: dict[str, Any], results: list[str]) -> dict[str, int]:
    passed, error = check_answer(doc["check"], results[0], doc["row"])
    return {"passed": int(passed and error is None), "errored": int(error is not None)}


def score_unchecked(doc: dict[str, Any], results: list[str]) -> dict[str, int]:
    return {"answered": int(bool(results[0].strip()))}
