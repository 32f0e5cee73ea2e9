"""The user's own traffic (`quality.traffic`): a JSONL of real prompts replayed on the
baseline and the candidate through lm-eval, with no task YAML for the user to write.

Each row: `{"id": ..., "prompt": "..."}` (sent as is to the completions API) or
`{"id": ..., "messages": [...]}` (rendered with the model's chat template, as the chat
endpoint would), with optional `slice`, `reference`, `critical` and `check` (one of
exact, contains, regex, json_schema: a file relative to the traffic file, python:
"module:function" found next to the traffic file). `load_rows` checks every row (used by
`quantlab recipes check` too); `build_suite` writes an ordinary suite folder (suite.yaml,
one task YAML per slice of checked rows and one for the unchecked rows, data, a utils.py
calling `traffic_checks`) under the cache, named by its content's hash, so the suite's
identity and the baseline cache follow the file. `compare_unchecked` and `critical_verdicts`
read the two roles' samples afterwards."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from quantlab.core.digest import json_sha256
from quantlab.core.errors import RecipeError
from quantlab.core.verdicts import GateVerdict
from quantlab.quality.traffic_checks import MAX_JSON_DEPTH, json_depth
from quantlab.recipe.quality import TrafficFile

FORMAT = 1  # bump when the generated suite's meaning changes (its hash keys the baseline cache)
CHECK_KINDS = ("exact", "contains", "regex", "json_schema", "python")
SLICE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
DEFAULT_SLICE = "traffic"
MOST_CHANGED = 5


@dataclass
class TrafficRow:
    line: int
    id: str
    prompt: str | None
    messages: list[dict[str, Any]] | None
    slice: str
    reference: str | None
    critical: bool
    check: dict[str, Any] | None  # {"kind", "value"}, the value read (schema) and resolved (python)


def _fail(path: Path, line: int, what: str) -> RecipeError:
    return RecipeError(what, file=f"{path}:{line}")  # file:line, as editors and compilers say it


def _reason(err: Exception) -> str:
    return "nested too deeply to read" if isinstance(err, RecursionError) else str(err)[:200]


def _check(raw: Any, path: Path, line: int) -> dict[str, Any]:
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in CHECK_KINDS:
        raise _fail(path, line, f"check {json.dumps(raw)[:80]}: expected one of {{'exact': ...}}, {{'contains': ...}}, "
                    "{'regex': ...}, {'json_schema': 'schema.json'}, {'python': 'module:function'}")
    kind, value = next(iter(raw.items()))
    if not isinstance(value, str) or not value:
        raise _fail(path, line, f"check.{kind} must be a non-empty string, got {json.dumps(value)[:60]}")
    if kind == "regex":
        try:
            re.compile(value)
        except re.error as err:
            raise _fail(path, line, f"check.regex {value!r} does not compile: {err}") from None
    if kind == "json_schema":
        schema_path = (path.parent / value).resolve()
        try:
            schema = json.loads(schema_path.read_text())
        except OSError:
            raise _fail(path, line, f"check.json_schema: {schema_path} not found (paths are relative to the "
                        "traffic file)") from None
        except (ValueError, RecursionError) as err:  # not JSON, an integer past the digit limit, too deep
            raise _fail(path, line, f"check.json_schema: {schema_path} is not JSON: {_reason(err)}") from None
        if json_depth(schema, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:  # its validator recurses once a level
            raise _fail(path, line, f"check.json_schema: {schema_path} nests more than {MAX_JSON_DEPTH} levels deep; "
                        "flatten it (a $ref to a definition reads the same)")
        from jsonschema import Draft202012Validator, validators
        from jsonschema.exceptions import SchemaError

        try:
            validators.validator_for(schema, default=Draft202012Validator).check_schema(schema)
        except SchemaError as err:
            raise _fail(path, line, f"check.json_schema: {schema_path} is not a valid JSON schema: "
                        f"{err.message}") from None
        return {"kind": kind, "value": schema, "source": value}
    if kind == "python":
        module, _, function = value.partition(":")
        if not module or not function or not all(p.isidentifier() for p in module.split(".") + [function]):
            raise _fail(path, line, f"check.python {value!r}: expected 'module:function' (a module next to the "
                        "traffic file)")
        file = path.parent.resolve() / (module.replace(".", "/") + ".py")
        if not file.is_file():
            raise _fail(path, line, f"check.python: {file} not found (modules are looked up next to the traffic "
                        "file)")
        return {"kind": kind, "value": {"folder": str(path.parent.resolve()), "module": module,
                                        "function": function}, "source": value,
                "code_sha256": hashlib.sha256(file.read_bytes()).hexdigest()}
    return {"kind": kind, "value": value}


def _messages(raw: Any, path: Path, line: int) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise _fail(path, line, "messages must be a non-empty list of {role, content}")
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or \
                not isinstance(m.get("content"), str):
            raise _fail(path, line, f"messages[{i}]: expected {{'role': system|user|assistant, 'content': str}}, "
                        f"got {json.dumps(m)[:80]}")
    if raw[-1]["role"] != "user":
        raise _fail(path, line, "the last message must be the user's: the answer to it is what is compared")
    return raw


def load_rows(path: Path) -> list[TrafficRow]:
    """Every row of a traffic file, checked; RecipeError naming the file and line."""
    if not path.is_file():
        raise RecipeError(f"traffic file {path} not found", file=str(path), field="quality.traffic")
    rows: list[TrafficRow] = []
    seen: set[str] = set()
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as err:  # not JSON, an integer past the digit limit, too deep
            raise _fail(path, n, f"not JSON: {_reason(err)}") from None
        if json_depth(raw, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:  # every record and hash of it recurses once a level
            raise _fail(path, n, f"the row nests more than {MAX_JSON_DEPTH} levels deep")
        if not isinstance(raw, dict):
            raise _fail(path, n, "expected a JSON object per line")
        unknown = set(raw) - {"id", "prompt", "messages", "slice", "reference", "critical", "check"}
        if unknown:
            raise _fail(path, n, f"unknown field(s) {', '.join(sorted(unknown))}; a row has id, prompt or messages, "
                        "and optionally slice, reference, critical, check")
        rid = raw.get("id")
        if not isinstance(rid, (str, int)) or str(rid) == "":
            raise _fail(path, n, "id: every row needs an id (string)")
        if str(rid) in seen:
            raise _fail(path, n, f"id {rid!r} appears twice")
        seen.add(str(rid))
        has_prompt, has_messages = "prompt" in raw, "messages" in raw
        if has_prompt == has_messages:
            found = "both prompt and messages" if has_prompt else "neither prompt nor messages"
            raise _fail(path, n, f"row {rid!r} has {found}; give exactly one")
        if has_prompt and (not isinstance(raw["prompt"], str) or not raw["prompt"]):
            raise _fail(path, n, "prompt must be a non-empty string")
        slice_ = raw.get("slice", DEFAULT_SLICE)
        if not isinstance(slice_, str) or not SLICE.match(slice_):
            raise _fail(path, n, f"slice {slice_!r}: lower-case letters, digits, '-' or '_', at most 32")
        if "reference" in raw and not isinstance(raw["reference"], str):
            raise _fail(path, n, "reference must be a string")
        critical = raw.get("critical", False)
        if not isinstance(critical, bool):
            raise _fail(path, n, "critical must be true or false")
        check = _check(raw["check"], path, n) if "check" in raw else None
        if critical and check is None:
            raise _fail(path, n, f"row {rid!r} is critical but has no check: a critical row needs a check that "
                        "says when it fails")
        rows.append(TrafficRow(n, str(rid), raw.get("prompt"), _messages(raw["messages"], path, n)
                               if has_messages else None, slice_, raw.get("reference"), critical, check))
    if not rows:
        raise RecipeError(f"traffic file {path} has no rows", file=str(path), field="quality.traffic")
    return rows


def file_name(spec: TrafficFile, path: Path) -> str:
    return spec.name or re.sub(r"[^a-z0-9_]", "_", path.stem.lower())[:24] or "traffic"


def task_prefix(name: str) -> str:
    """What a traffic file's tasks are named by: traffic_<name>, or the name itself when it
    already says traffic (traffic.jsonl's tasks are traffic_facts, not traffic_traffic_facts)."""
    return name if name == "traffic" or name.startswith("traffic_") else f"traffic_{name}"


UTILS = '''"""Generated by quantlab from a traffic file: the scorers are quantlab's own."""
from quantlab.quality.traffic_checks import score_checked, score_unchecked  # noqa: F401
'''


def _task_yaml(task: str, data: str, scorer: str, metrics: list[str], max_tokens: int, unsafe: bool = False) -> str:
    body = yaml.safe_dump({
        "task": task, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": data}},
        "test_split": "test", "output_type": "generate_until",
        # a python check hands the model's answer to the user's scorer: code execution, opted into
        **({"unsafe_code": True} if unsafe else {}), "doc_to_text": "{{prompt}}",
        "doc_to_target": "{{reference}}",
        "generation_kwargs": {"until": [], "max_gen_toks": max_tokens, "do_sample": False, "temperature": 0.0},
        "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in metrics],
        "metadata": {"version": FORMAT}}, sort_keys=False)
    return body + f"process_results: !function utils.{scorer}\n"


def build_suite(spec: TrafficFile, path: Path, tokenizer, root: Path) -> Path:
    """The suite folder for one traffic file (made once per content, under `root`)."""
    from quantlab.core.fsutil import atomic_directory

    rows = load_rows(path)
    name = file_name(spec, path)
    groups: dict[str, list[dict[str, Any]]] = {}
    slices: dict[str, str] = {}
    for r in sorted(rows, key=lambda r: not r.critical):  # critical rows first: the first look answers them
        prompt = r.prompt if r.messages is None else \
            tokenizer.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=False)
        prefix = task_prefix(name)
        task = f"{prefix}_{r.slice.replace('-', '_')}" if r.check else f"{prefix}_unchecked"
        slices[task] = r.slice if r.check else DEFAULT_SLICE
        groups.setdefault(task, []).append({
            "id": r.id, "prompt": prompt, "reference": r.reference or "", "critical": r.critical,
            "check": None if r.check is None else {**r.check, "timeout_s": spec.scorer_timeout_s},
            "row": {"id": r.id, "slice": r.slice, "reference": r.reference, "line": r.line}})
    files: dict[str, str] = {"utils.py": UTILS}
    tasks = []
    for task, docs in sorted(groups.items()):
        checked = docs[0]["check"] is not None
        files[f"data/{task}.jsonl"] = "".join(json.dumps(d, sort_keys=True) + "\n" for d in docs)
        files[f"{task}.yaml"] = _task_yaml(task, f"data/{task}.jsonl", "score_checked" if checked else
                                           "score_unchecked", ["passed", "errored"] if checked else ["answered"],
                                           spec.max_tokens, unsafe=any((d["check"] or {}).get("kind") == "python"
                                                                       for d in docs))
        tasks.append({"task": task, "api": "completions", "metric": "passed" if checked else "answered",
                      "slice": slices[task], **({} if checked else {"gated": False})})
    files["suite.yaml"] = yaml.safe_dump({"name": f"traffic-{name}", "description": f"Replay of {path.name}",
                                          "tasks": tasks}, sort_keys=False)
    digest = json_sha256(files)[:16]
    folder = root / f"{name}-{digest}"
    if (folder / "suite.yaml").is_file():
        return folder
    try:
        with atomic_directory(folder) as tmp:
            for rel, text in files.items():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_text(text)
    except FileExistsError:  # another run made the same suite meanwhile
        pass
    return folder


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", "", text.lower()).split())


def compare_unchecked(task: str, base_rows: list[dict[str, Any]], cand_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows without a check: how often the candidate's answer is the baseline's (normalised:
    case, punctuation, spacing) and how close (chrF, sacrebleu, 0-100), the most changed
    listed."""
    from sacrebleu.metrics import CHRF

    chrf = CHRF()
    base = {r["doc_id"]: r for r in base_rows}
    pairs = []
    for c in cand_rows:
        b = base.get(c["doc_id"])
        if b is None:
            continue
        a_b, a_c = b.get("raw") or "", c.get("raw") or ""
        pairs.append({"doc_id": c["doc_id"], "prompt": (c.get("prompt") or "")[-300:], "baseline": a_b,
                      "candidate": a_c, "same": _norm(a_b) == _norm(a_c),
                      "chrf": chrf.sentence_score(a_c, [a_b]).score if a_b or a_c else 100.0})
    if not pairs:
        return {"task": task, "n": 0}
    pairs.sort(key=lambda p: p["chrf"])
    return {"task": task, "n": len(pairs), "same_rate": sum(p["same"] for p in pairs) / len(pairs),
            "mean_chrf": sum(p["chrf"] for p in pairs) / len(pairs), "most_changed": pairs[:MOST_CHANGED]}


def critical_verdicts(task: str, docs: list[dict[str, Any]], base_rows: list[dict[str, Any]],
                      cand_rows: list[dict[str, Any]]) -> list[GateVerdict]:
    """One gate per critical row: fail when its check passes on the baseline and not on the
    candidate (whatever the averages say); pass when the candidate passes it, or both fail
    it (no regression); otherwise it could not be judged: the candidate did not answer it,
    its check errored on the candidate's answer, or the candidate fails it and the
    baseline's outcome is unknown. Such a row is not shown and not warnable: release.policy
    never lets an unjudged critical row through."""
    base = {r["doc_id"]: r["metrics"] for r in base_rows}
    cand = {r["doc_id"]: r["metrics"] for r in cand_rows}
    out = []
    for i, d in enumerate(docs):
        if not d.get("critical"):
            continue
        b, c = base.get(i), cand.get(i)
        scope = f"{task}:{d['id']}"
        fields = {"check": "quality", "gate": "critical_row", "scope": scope, "limit": 1.0, "samples": 1,
                  "metric": "passed", "test": "threshold"}
        b_state = "did not answer it" if b is None else "check errored" if b.get("errored") else \
            "passes" if b.get("passed") == 1 else "fails"
        unjudged = ("not answered by the candidate" if c is None else
                    "its check errored on the candidate's answer" if c.get("errored") else
                    f"the candidate fails it and the baseline's outcome is unknown (baseline {b_state})"
                    if c.get("passed") != 1 and b_state not in ("passes", "fails") else None)
        if unjudged:
            out.append(GateVerdict(verdict="inconclusive", value=None, warnable=False,
                                   evidence=f"critical row {d['id']!r}: {unjudged}; an unjudged critical row is never "
                                   "released (see the row's answers in the samples; fix the scorer or the row)",
                                   **fields))
            continue
        flipped = b_state == "passes" and c.get("passed") != 1
        detail = (f"critical row {d['id']!r}: passes on the baseline, fails on the candidate" if flipped else
                  f"critical row {d['id']!r}: candidate {'passes' if c.get('passed') == 1 else 'fails'}, baseline "
                  f"{b_state if c.get('passed') == 1 or b_state != 'fails' else 'fails too'}")
        out.append(GateVerdict(verdict="fail" if flipped else "pass", value=float(c.get("passed") or 0),
                               evidence=detail, **fields))
    return out
