"""Next-token distributions from a served model: the top-k log-probabilities at every
position of a text (vLLM's /v1/completions with echo and logprobs, token ids in and
out), for the KL-divergence check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from quantlab.core.engine_time import engine_busy
from quantlab.core.errors import CheckError
from quantlab.serving import api_keys


def texts_as_token_ids(path: Path, tokenizer, *, max_texts: int, max_tokens: int) -> list[list[int]]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    out = []
    for i, row in enumerate(rows[:max_texts]):
        if not isinstance(row.get("text"), str):
            raise CheckError(f"{path}: line {i + 1} has no 'text' string (KL texts are {{'text': ...}} rows)")
        out.append(tokenizer(row["text"], add_special_tokens=True).input_ids[:max_tokens])
    return out


def top_logprobs(base_url: str, served_name: str, token_ids: list[int], *, top_k: int, timeout_s: float,
                 retries: int = 2) -> list[dict[int, float]]:
    """One distribution per predicted position (positions 1..n of the text, then the
    token after it); the text's own token is listed too where it is outside the top k."""
    body = {"model": served_name, "prompt": token_ids, "max_tokens": 1, "echo": True, "logprobs": top_k,
            "return_tokens_as_token_ids": True, "temperature": 0}
    last: Exception | None = None
    for _ in range(retries + 1):
        try:
            r = httpx.post(f"{base_url}/v1/completions", json=body, timeout=timeout_s,
                           headers=api_keys.headers(base_url))
            if r.status_code != 200:
                raise CheckError(f"{base_url} answered {r.status_code} to a logprobs request: {r.text[:300]}")
            top = r.json()["choices"][0]["logprobs"]["top_logprobs"]
            return [{int(k.split(":", 1)[1]): float(v) for k, v in pos.items()} for pos in top[1:] if pos]
        except (httpx.HTTPError, KeyError, ValueError) as err:
            last = err
    raise CheckError(f"logprobs request to {base_url} failed {retries + 1} times: {type(last).__name__}: {last}")


def distributions(base_url: str, served_name: str, texts: list[list[int]], *, top_k: int, timeout_s: float
                  ) -> list[list[dict[int, float]]]:
    with engine_busy():
        return [top_logprobs(base_url, served_name, ids, top_k=top_k, timeout_s=timeout_s) for ids in texts]


def to_json(dists: list[list[dict[int, float]]]) -> list[list[dict[str, float]]]:
    return [[{str(k): v for k, v in pos.items()} for pos in text] for text in dists]


def from_json(data: list[list[dict[str, Any]]]) -> list[list[dict[int, float]]]:
    return [[{int(k): float(v) for k, v in pos.items()} for pos in text] for text in data]
