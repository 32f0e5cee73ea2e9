"""Requests for a performance workload, built with the served model's own tokenizer.

Synthetic prompts are windows of public-domain prose (calib_data/prose.jsonl: text,
not random token ids, so the model's attention and sampling behave as on real text)
cut to the exact token count. `completions` sends them as token ids, so the engine
sees exactly the asked length; `chat` decodes them into one user message (the chat
template adds its own tokens; the server's usage says how many). Everything is seeded.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from quantlab.performance.loadgen import PreparedRequest
from quantlab.core.shipped import CALIB_DATA
from quantlab.core.errors import RecipeError
from quantlab.recipe.performance import Length, Workload

PROSE = CALIB_DATA / "prose.jsonl"


def _draw(rng: random.Random, length: Length) -> int:
    return length if isinstance(length, int) else rng.randint(length[0], length[1])


def _corpus_ids(tokenizer, limit_tokens: int) -> list[int]:
    ids: list[int] = []
    with open(PROSE, encoding="utf-8") as f:
        for line in f:
            ids += tokenizer(json.loads(line)["text"], add_special_tokens=False)["input_ids"]
            if len(ids) >= limit_tokens:
                break
    return ids


def _dataset_rows(path: Path, field: str) -> list[dict]:
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as err:
        raise RecipeError(f"cannot read prompts from {path}: {err}", field=field) from None
    if not rows or not all(isinstance(r, dict) and ("text" in r or "messages" in r) for r in rows):
        raise RecipeError(f"{path}: every row must be a JSON object with 'text' or 'messages'", field=field)
    return rows


def build_requests(w: Workload, tokenizer, *, served_name: str, count: int, dataset: Path | None = None,
                   field: str = "performance.workloads") -> list[PreparedRequest]:
    rng = random.Random(w.seed)
    out: list[PreparedRequest] = []
    rows = _dataset_rows(dataset, f"{field}.dataset") if dataset is not None else None
    corpus = None if rows else _corpus_ids(tokenizer, 4 * max(_draw(random.Random(0), w.prompt_tokens), 4096))
    for i in range(count):
        n_out = _draw(rng, w.output_tokens)
        n_in = _draw(rng, w.prompt_tokens)
        common = {"model": served_name, "max_tokens": n_out, "min_tokens": n_out, "ignore_eos": True,
                  "temperature": 0.0}
        if rows is not None:
            row = rows[i % len(rows)]
            messages = row.get("messages") or [{"role": "user", "content": row["text"]}]
            if w.api == "chat":
                out.append(PreparedRequest("/v1/chat/completions", {**common, "messages": messages}, n_out))
            else:
                text = row.get("text") or tokenizer.apply_chat_template(messages, tokenize=False,
                                                                        add_generation_prompt=True)
                ids = tokenizer(text, add_special_tokens=False)["input_ids"][:n_in]
                out.append(PreparedRequest("/v1/completions", {**common, "prompt": ids}, n_out))
            continue
        if n_in > len(corpus):
            raise RecipeError(f"workload '{w.name}': {n_in} prompt tokens is more than the shipped prose holds "
                              f"({len(corpus)} tokens); use a dataset", field=f"{field}.prompt_tokens")
        start = rng.randrange(0, len(corpus) - n_in + 1)
        window = corpus[start:start + n_in]
        if w.api == "chat":
            text = tokenizer.decode(window)
            out.append(PreparedRequest("/v1/chat/completions",
                                       {**common, "messages": [{"role": "user", "content": text}]}, n_out))
        else:
            out.append(PreparedRequest("/v1/completions", {**common, "prompt": window}, n_out))
    return out
