"""Held-out text for sensitivity from a run's own evaluation: the prompts of the slices a
candidate failed, each followed by the unquantized model's answer to it, as the baseline
server gave it. Scoring KL on those answer tokens asks "which layer, quantized alone,
moves the baseline off the answers the gates check", where held-out calibration text asks
it of prose and chat in general (on the default model the two disagree: docs/candidates-and-search.md).

Reads `run.json` (the failed gates) and `quality/baseline/<task>.jsonl` (prompt and raw
answer of each sample); needs the tokenizer for rendering, nothing else."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantlab.core.layout import QUALITY_DIR  # noqa: F401 (also read from here)
from quantlab.core.errors import RecipeError
from quantlab.core.run import RECORD_FILE
from quantlab.quality.sample_format import MAX_PROMPT_CHARS

SAMPLES_DIR = Path(QUALITY_DIR) / "baseline"


@dataclass(frozen=True)
class Sequence:
    """Token ids and the positions scored: position t predicts token t + 1."""

    ids: list[int]
    start: int
    end: int


def whole(chunks: list[list[int]]) -> list[Sequence]:
    """Held-out chunks of calibration text, every position scored."""
    return [Sequence(c, 0, len(c)) for c in chunks]


def _messages(prompt: str) -> list[dict[str, Any]] | None:
    """A chat sample's prompt as lm-eval logs it (the repr of a tuple holding the JSON of
    the messages) -> the messages; None for a plain completion prompt."""
    text: Any = prompt
    if prompt.startswith("("):
        try:
            text = ast.literal_eval(prompt)
        except (ValueError, SyntaxError):
            return None
        text = text[0] if isinstance(text, tuple) and text else text
    if isinstance(text, str) and text.startswith("[{"):
        try:
            messages = json.loads(text)
        except json.JSONDecodeError:
            return None
        if isinstance(messages, list) and all(isinstance(m, dict) and "role" in m for m in messages):
            return messages
    return None


def failed_tasks(run_dir: Path) -> list[str]:
    """The quality tasks whose gates failed in the run, in the record's order."""
    record = json.loads((run_dir / RECORD_FILE).read_text())
    gates = (((record.get("stages") or {}).get("quality") or {}).get("result") or {}).get("gates") or []
    seen: list[str] = []
    for g in gates:
        if g.get("verdict") == "fail" and g.get("scope") and g["scope"] not in seen and \
                (run_dir / SAMPLES_DIR / f"{g['scope']}.jsonl").is_file():
            seen.append(g["scope"])
    return seen


def _encode(sample: dict[str, Any], tokenizer, tokens: int) -> Sequence | None:
    prompt, answer = sample.get("prompt"), sample.get("raw")
    if not isinstance(prompt, str) or not isinstance(answer, str) or not answer.strip() or \
            len(prompt) >= MAX_PROMPT_CHARS:
        return None  # a loglikelihood sample (no answer), an empty answer, or a prompt the record cut
    messages = _messages(prompt)
    if messages is not None:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        head = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        head = tokenizer(prompt)["input_ids"]
    tail = tokenizer(answer, add_special_tokens=False)["input_ids"][:tokens // 2]
    head = head[-(tokens - len(tail)):]  # a long prompt loses its start, never the answer
    if not head or not tail:
        return None
    ids = head + tail
    return Sequence(ids, len(head) - 1, len(ids) - 1)


def answer_tasks(run_dir: Path, tasks: list[str] | None) -> tuple[list[str], str]:
    """The tasks whose answers are scored (`tasks`, else the run's failed ones, else every
    task with samples) and why; RecipeError on a folder that is not a run with quality
    samples. Reads only the record and the sample file names: `quantlab sensitivity` asks
    before it creates anything."""
    where = "--answers-from"
    if not (run_dir / RECORD_FILE).is_file():
        raise RecipeError(f"{where} {run_dir}: no {RECORD_FILE} there; pass a run folder "
                          "(runs/<recipe>/<id>/) whose quality stage ran", field=where)
    present = sorted(p.stem for p in (run_dir / SAMPLES_DIR).glob("*.jsonl"))
    if not present:
        raise RecipeError(f"{where} {run_dir}: no baseline samples under {SAMPLES_DIR}/; the run's quality stage "
                          "did not run or kept no samples", field=where)
    if tasks:
        unknown = [t for t in tasks if t not in present]
        if unknown:
            raise RecipeError(f"--tasks: {', '.join(unknown)} not evaluated in {run_dir}; it has {', '.join(present)}",
                              field="--tasks")
        return list(tasks), "named"
    chosen = failed_tasks(run_dir)
    return (chosen, "failed there") if chosen else (present, "no gate failed there: every task")


def run_answers(run_dir: Path, tokenizer, *, tasks: list[str] | None, count: int,
                tokens: int) -> tuple[list[Sequence], str]:
    """Up to `count` sequences (prompt + the baseline's answer, at most `tokens` tokens),
    taken in turn from each task's samples: `tasks`, else the run's failed ones, else every
    task with generated answers. Only the answer positions are scored. RecipeError on a
    folder that is not a run with quality samples."""
    run_dir = Path(run_dir)
    where = "--answers-from"
    chosen, why = answer_tasks(run_dir, tasks)
    per_task: dict[str, list[Sequence]] = {}
    for task in chosen:
        rows = [json.loads(line) for line in (run_dir / SAMPLES_DIR / f"{task}.jsonl").read_text().splitlines()
                if line.strip()]
        per_task[task] = [s for s in (_encode(r, tokenizer, tokens) for r in rows) if s is not None]
    usable = {t: seqs for t, seqs in per_task.items() if seqs}
    if not usable:
        raise RecipeError(f"{where} {run_dir}: tasks {', '.join(chosen)} hold no generated answers (loglikelihood "
                          "tasks score choices, not text); name generation tasks with --tasks", field=where)
    picked: list[Sequence] = []
    taken = dict.fromkeys(usable, 0)
    while len(picked) < count and any(taken[t] < len(usable[t]) for t in usable):
        for t in usable:  # in turn, so no one task fills the set
            if taken[t] < len(usable[t]) and len(picked) < count:
                picked.append(usable[t][taken[t]])
                taken[t] += 1
    parts = ", ".join(f"{t} {taken[t]}" for t in usable if taken[t])
    return picked, f"the baseline's answers in {run_dir.name} ({why}: {parts})"
