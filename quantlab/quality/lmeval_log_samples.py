"""One lm-eval 0.4.x samples file (samples_<task>_<date>.jsonl) read back into the shapes
lm-eval held in memory before its tracker flattened them for writing
(lm_eval/loggers/evaluation_tracker.py, save_results_samples, in 0.4.13):
- `arguments` (one tuple per request) was written {"gen_args_<i>": {"arg_<j>": ...}};
- every leaf of `resps` and `filtered_resps` was written as a string (`(-1.5, False)` as
  ["-1.5", "False"]): a loglikelihood answer is a (float, bool) pair again and a rolling
  one a float, by the task's output_type, never by the look of the text (a generated "12"
  stays the string "12");
- `target` was written str(target): an all-digit target of a task with choices is the
  index lm-eval made of it (lm_eval/api/task.py, doc_to_target), "[...]" the list it parsed; any other
  target stays text (lm-eval's own target_hash is of that text, and only the flips report
  shows a target).
Pure: no lm-eval import."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from quantlab.core.errors import RecipeError

LOGLIKELIHOOD = ("loglikelihood", "multiple_choice")
OUTPUT_TYPES = (*LOGLIKELIHOOD, "loglikelihood_rolling", "generate_until")
NEEDED = ("doc_id", "arguments", "resps", "filtered_resps", "prompt_hash")
HOW = ("run lm-eval with --output_path DIR --log_samples and give DIR (or the results_<date>.json in its model "
       "sub-folder)")


def read_samples_file(path: Path, output_type: str, has_choices: bool) -> list[dict[str, Any]]:
    """Each line of a samples file, restored to the shapes lm-eval held in memory."""
    text = path.read_text(encoding="utf-8")
    samples, seen = [], set()
    for number, line in enumerate(text.split("\n"), 1):  # only "\n": a sample's text may hold U+2028
        if not line.strip():
            continue
        try:
            sample = json.loads(line)
        except ValueError as err:
            raise RecipeError(f"line {number} is not JSON ({err}); a samples file holds one JSON object a line",
                              file=str(path), field=f"line {number}") from None
        missing = [k for k in NEEDED if not isinstance(sample, dict) or k not in sample]
        if missing:
            note = " (older lm-eval versions record no prompt_hash; 0.4.13 does)" \
                if missing == ["prompt_hash"] else ""
            raise RecipeError(f"line {number} is not an lm-eval sample: it lacks {', '.join(missing)}{note}; {HOW}",
                              file=str(path), field=f"line {number}.{missing[0]}")
        key = (sample["doc_id"], sample.get("filter"))
        if key in seen:  # two runs appended to one file: which answer counts cannot be told
            raise RecipeError(f"doc_id {key[0]} (filter {key[1]}) is on more than one line (line {number} again): "
                              "two runs were appended to this file; run lm-eval again into an empty folder",
                              file=str(path), field=f"line {number}.doc_id")
        seen.add(key)
        samples.append(restore_sample(sample, output_type, has_choices, where=(path, number)))
    if not samples:
        raise RecipeError(f"the samples file is empty; {HOW}", file=str(path))
    return samples


def restore_sample(sample: dict[str, Any], output_type: str, has_choices: bool, *,
                   where: tuple[Path, int] | None = None) -> dict[str, Any]:
    """One logged sample with the shapes lm-eval's tracker flattened given back. `where`:
    the file and line it came from, for the error."""
    file, line = where or (None, 0)

    def refuse(field: str, what: str) -> RecipeError:
        return RecipeError(f"line {line}: {field} {what}", file=str(file) if file else None,
                           field=f"line {line}.{field}")

    out = dict(sample)
    out["arguments"] = _arguments(sample["arguments"], refuse)
    restore = {**dict.fromkeys(LOGLIKELIHOOD, _pair), "loglikelihood_rolling": float}.get(output_type)
    for field, depth in (("resps", 2), ("filtered_resps", 1)):  # per request (and per repeat) -> one answer
        if restore is not None:
            try:
                out[field] = _mapped(sample[field], depth, restore)
            except (TypeError, ValueError) as err:
                raise refuse(field, f"does not have the shape of {output_type} answers ({err})") from None
    if isinstance(sample.get("target"), str):
        out["target"] = _target(sample["target"], has_choices)
    return out


def _mapped(value: Any, depth: int, restore) -> Any:
    if depth == 0:
        return restore(value)
    if not isinstance(value, list):
        raise TypeError(f"{value!r} is not a list")
    return [_mapped(v, depth - 1, restore) for v in value]


def _arguments(args: Any, refuse) -> list[list[Any]]:
    """{"gen_args_<i>": {"arg_<j>": ...}} -> one list of arguments per request, in order."""
    if isinstance(args, list):  # not flattened: kept
        return args
    if not isinstance(args, dict) or not all(
            re.fullmatch(r"gen_args_\d+", k) and isinstance(v, dict) and all(re.fullmatch(r"arg_\d+", j) for j in v)
            for k, v in args.items()):
        raise refuse("arguments", "is neither lm-eval's {\"gen_args_<i>\": {\"arg_<j>\": ...}} nor a list")

    def index(key: str) -> int:  # gen_args_10 after gen_args_9
        return int(key.rsplit("_", 1)[1])

    return [[req[k] for k in sorted(req, key=index)] for _, req in sorted(args.items(), key=lambda kv: index(kv[0]))]


def _pair(value: Any) -> tuple[float, bool]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"{value!r} is not a (logprob, is_greedy) pair")
    greedy = value[1]
    if isinstance(greedy, str):
        if greedy not in ("True", "False"):
            raise ValueError(f"is_greedy {greedy!r} is neither True nor False")
        greedy = greedy == "True"
    return float(value[0]), bool(greedy)


def _target(text: str, has_choices: bool) -> Any:
    if text.isdigit() and has_choices:
        return int(text)
    if len(text) >= 2 and text[0] == "[" and text[-1] == "]":
        try:
            return ast.literal_eval(text)
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            return text
    return text
