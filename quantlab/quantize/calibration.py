"""Calibration data: read JSONL sets, sample, render the chat template, truncate, hash.

A row is a JSON object with either
  {"text": "..."}                                        plain text, or
  {"messages": [{"role": "user", "content": "..."}, ...]}  a conversation
and any other keys (e.g. "source") are kept for provenance but not used.
The hash covers the exact token ids the model sees, so two runs with the same hash
calibrated on identical inputs.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import sha256_file
from quantlab.recipe.quantize import CalibrationSpec

CHAT_ROLES = {"system", "user", "assistant", "tool"}


@dataclass(frozen=True)
class Row:
    file: Path
    line: int
    text: str | None = None
    messages: list[dict[str, str]] | None = None


def read_rows(path: Path, *, field_path: str = "calibration.datasets") -> list[Row]:
    """Read and validate one JSONL file. Errors name the file and line."""
    rows: list[Row] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise RecipeError(f"calibration file {path} is not UTF-8 text", field=field_path) from None
    for n, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as err:
            raise RecipeError(f"{where}: not valid JSON ({err.msg}); each line must be one JSON object",
                              field=field_path) from None
        if not isinstance(obj, dict):
            raise RecipeError(f"{where}: expected a JSON object, found {type(obj).__name__}", field=field_path)
        text, messages = obj.get("text"), obj.get("messages")
        if (text is None) == (messages is None):
            raise RecipeError(f"{where}: expected exactly one of 'text' or 'messages', found keys "
                              f"{sorted(obj)}", field=field_path)
        if text is not None:
            if not isinstance(text, str) or not text.strip():
                raise RecipeError(f"{where}: 'text' must be a non-empty string", field=field_path)
            rows.append(Row(path, n, text=text))
            continue
        if not isinstance(messages, list) or not messages:
            raise RecipeError(f"{where}: 'messages' must be a non-empty list", field=field_path)
        for i, m in enumerate(messages):
            if not (isinstance(m, dict) and m.get("role") in CHAT_ROLES and isinstance(m.get("content"), str)):
                raise RecipeError(
                    f"{where}: messages[{i}] must be {{'role': one of {sorted(CHAT_ROLES)}, 'content': str}}, "
                    f"found {m!r:.80}", field=field_path)
        rows.append(Row(path, n, messages=messages))
    if not rows:
        raise RecipeError(f"calibration file {path} holds no rows", field=field_path)
    return rows


def allocate(total: int, weights: list[float]) -> list[int]:
    """Split `total` samples over datasets by weight (largest remainder, sums exactly)."""
    s = sum(weights)
    exact = [total * w / s for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


@dataclass
class CalibrationSet:
    input_ids: list[list[int]]
    origins: list[str]
    files: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        return len(self.input_ids)

    @property
    def num_tokens(self) -> int:
        return sum(map(len, self.input_ids))

    @property
    def sha256(self) -> str:
        h = hashlib.sha256()
        for ids in self.input_ids:
            h.update(json.dumps(ids, separators=(",", ":")).encode())
            h.update(b"\n")
        return h.hexdigest()

    def summary(self, spec: CalibrationSpec) -> dict[str, Any]:
        lengths = sorted(map(len, self.input_ids))
        return {
            "sha256": self.sha256,
            "num_samples": self.num_samples,
            "num_tokens": self.num_tokens,
            "min_tokens": lengths[0] if lengths else 0,
            "max_tokens": lengths[-1] if lengths else 0,
            "max_seq_length": spec.max_seq_length,
            "seed": spec.seed,
            "chat_template": spec.chat_template,
            "files": self.files,
            "notes": self.notes,
        }

    def to_dataset(self):
        from datasets import Dataset

        return Dataset.from_dict({
            "input_ids": self.input_ids,
            "attention_mask": [[1] * len(ids) for ids in self.input_ids],
        })


def _render(row: Row, tokenizer, chat_template: bool) -> list[int]:
    if row.text is not None:
        return tokenizer(row.text, add_special_tokens=True)["input_ids"]
    if chat_template:
        text = tokenizer.apply_chat_template(row.messages, tokenize=False)
        # the template already holds the special tokens it wants
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer("\n\n".join(m["content"] for m in row.messages), add_special_tokens=True)["input_ids"]


def build_calibration_set(spec: CalibrationSpec, paths: list[Path], tokenizer) -> CalibrationSet:
    if spec.chat_template and not getattr(tokenizer, "chat_template", None):
        has_messages = any(r.messages for p in paths for r in read_rows(p))
        if has_messages:
            raise RecipeError(
                "the tokenizer has no chat template but calibration.chat_template is true and the "
                "data holds 'messages' rows: set chat_template: false or use a chat model",
                field="calibration.chat_template",
            )
    ids: list[list[int]] = []
    origins: list[str] = []
    files: list[dict[str, Any]] = []
    notes: list[str] = []
    for path, want, rows, chosen in _sampled(spec, paths):
        if want > len(rows):
            notes.append(f"{path.name}: asked for {want} samples, file has {len(rows)}; used all")
        for row in chosen:
            tokens = _render(row, tokenizer, spec.chat_template)[: spec.max_seq_length]
            if tokens:
                ids.append(tokens)
                origins.append(f"{path.name}:{row.line}")
        files.append({"path": str(path), "sha256": sha256_file(path), "rows": len(rows), "used": len(chosen)})
    return CalibrationSet(ids, origins, files, notes)


def _sampled(spec: CalibrationSpec, paths: list[Path]):
    """(file, samples wanted, its rows, the rows calibration samples) per dataset: one
    seeded draw, so the held-out text below is exactly the rows calibration never saw."""
    rng = random.Random(spec.seed)
    counts = allocate(spec.num_samples, [d.weight for d in spec.datasets])
    for i, (path, want) in enumerate(zip(paths, counts, strict=True)):
        rows = read_rows(path, field_path=f"calibration.datasets.{i}.path")
        yield path, want, rows, rng.sample(rows, min(want, len(rows)))


def held_out_chunks(spec: CalibrationSpec, paths: list[Path], tokenizer, *, count: int, tokens: int,
                    seed: int) -> tuple[list[list[int]], str]:
    """`count` sequences of `tokens` tokens from the calibration files' rows that the
    calibration does not sample (rendered as calibration renders them, joined, cut into
    equal chunks), and where they came from. RecipeError when the files hold too few."""
    unseen = []
    for _, _, rows, chosen in _sampled(spec, paths):
        used = {r.line for r in chosen}
        unseen += [r for r in rows if r.line not in used]
    random.Random(seed).shuffle(unseen)
    stream: list[int] = []
    read = 0
    for row in unseen:
        if len(stream) >= count * tokens:
            break
        stream += _render(row, tokenizer, spec.chat_template)[:tokens]  # no one row fills every sequence
        read += 1
    chunks = [stream[i * tokens:(i + 1) * tokens] for i in range(min(count, len(stream) // tokens))]
    if not chunks:
        raise RecipeError(f"the calibration files hold {len(unseen)} rows calibration does not use, "
                          f"{len(stream)} tokens: fewer than one sequence of {tokens}; add rows or ask for fewer "
                          "tokens", field="calibration.datasets")
    names = ", ".join(sorted({p.name for p in paths}))
    return chunks, f"{read} rows of {names} not sampled for calibration"
