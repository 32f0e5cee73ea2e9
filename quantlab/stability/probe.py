"""Robustness probes against one served model over its OpenAI-compatible HTTP API:
the same greedy prompts alone and in batches, prompts up to and past the context limit,
repeated greedy and seeded requests, malformed requests, and a soak. Each probe returns
plain dicts with every request accounted for; judging them is the stability stage's job.
Every request, the malformed ones too, carries the server's API key (serving/api_keys):
a bad request must be judged by the model server, not refused at its door.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from quantlab.core.engine_time import engine_busy
from quantlab.serving import api_keys

MAX_EXAMPLES = 5  # mismatch examples kept per probe


@dataclass
class Reply:
    status: int | None  # None: no HTTP answer (connection dropped, timeout)
    text: str | None = None
    finish_reason: str | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.text is not None


def post(client: httpx.Client, url: str, *, body: Any = None, raw: bytes | None = None, timeout_s: float) -> Reply:
    t0 = time.perf_counter()
    try:
        with engine_busy():
            if raw is not None:
                r = client.post(url, content=raw, headers={"content-type": "application/json"}, timeout=timeout_s)
            else:
                r = client.post(url, json=body, timeout=timeout_s)
    except httpx.HTTPError as err:
        return Reply(None, error=f"{type(err).__name__}: {err}"[:300], seconds=time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    if r.status_code != 200:
        return Reply(r.status_code, error=r.text[:300], seconds=seconds)
    try:
        choice = r.json()["choices"][0]
        text = choice.get("text") if "text" in choice else (choice.get("message") or {}).get("content")
        return Reply(200, text=text, finish_reason=choice.get("finish_reason"), seconds=seconds)
    except (ValueError, KeyError, IndexError) as err:
        return Reply(200, error=f"unreadable answer: {err}", seconds=seconds)


def healthy(client: httpx.Client, base_url: str, timeout_s: float = 10) -> bool:
    try:
        with engine_busy():
            return client.get(f"{base_url}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def completion(served: str, prompt: list[int] | str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": served, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}


def _parallel(client: httpx.Client, url: str, bodies: list[dict], concurrency: int, timeout_s: float) -> list[Reply]:
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda b: post(client, url, body=b, timeout_s=timeout_s), bodies))


def batch_sweep(base_url: str, served: str, prompts: list[list[int]], *, max_tokens: int, levels: list[int],
                timeout_s: float) -> dict[str, Any]:
    """Each prompt alone (the reference), then all prompts in flight together at each
    level (repeated to fill the batch); the mismatch rate is against the reference."""
    url = f"{base_url}/v1/completions"
    with httpx.Client(headers=api_keys.headers(base_url)) as client:
        ref = [post(client, url, body=completion(served, p, max_tokens), timeout_s=timeout_s) for p in prompts]
        out: dict[str, Any] = {"reference_errors": sum(not r.ok for r in ref), "levels": {}, "examples": [],
                               "requests": len(ref)}
        for level in levels:
            idx = [i % len(prompts) for i in range(max(level, len(prompts)))]
            replies = _parallel(client, url, [completion(served, prompts[i], max_tokens) for i in idx], level,
                                timeout_s)
            mism = [(i, r) for i, r in zip(idx, replies, strict=True) if r.ok and ref[i].ok and r.text != ref[i].text]
            errors = sum(not r.ok for r in replies)
            out["levels"][str(level)] = {"requests": len(replies), "mismatched": len(mism), "errors": errors,
                                         "compared": sum(1 for i, r in zip(idx, replies, strict=True)
                                                         if r.ok and ref[i].ok)}
            out["requests"] += len(replies)
            for i, r in mism[: MAX_EXAMPLES - len(out["examples"])]:
                out["examples"].append({"level": level, "prompt": i, "alone": ref[i].text, "in_batch": r.text})
        compared = sum(v["compared"] for v in out["levels"].values())
        out["mismatch_rate"] = (sum(v["mismatched"] for v in out["levels"].values()) / compared) if compared else None
        out["errors"] = out["reference_errors"] + sum(v["errors"] for v in out["levels"].values())
        out["greedy_texts"] = [r.text for r in ref]
    return out


def length_sweep(base_url: str, served: str, token_pool: list[int], *, max_model_len: int, fractions: list[float],
                 past_limit: bool, max_tokens: int, timeout_s: float) -> dict[str, Any]:
    """Prompts whose prompt + output length is each fraction of max_model_len (within
    the limit every request must succeed with some output), then one past it (a 4xx
    is right, a 5xx or a dead server is a finding)."""
    url = f"{base_url}/v1/completions"
    rows = []
    with httpx.Client(headers=api_keys.headers(base_url)) as client:
        for f in fractions:
            total = max(2, int(f * max_model_len))
            out_tokens = min(max_tokens, total - 1)
            prompt = (token_pool * (total // max(1, len(token_pool)) + 1))[: total - out_tokens]
            r = post(client, url, body=completion(served, prompt, out_tokens), timeout_s=timeout_s)
            ok = r.ok and bool(r.text) and r.finish_reason in ("length", "stop")
            rows.append({"fraction": f, "prompt_tokens": len(prompt), "max_tokens": out_tokens, "status": r.status,
                         "ok": ok, "finish_reason": r.finish_reason, "error": r.error, "seconds": round(r.seconds, 3)})
        if past_limit:
            prompt = (token_pool * (max_model_len // max(1, len(token_pool)) + 2))[: max_model_len + 1]
            r = post(client, url, body=completion(served, prompt, 1), timeout_s=timeout_s)
            alive = healthy(client, base_url)
            rows.append({"fraction": None, "prompt_tokens": len(prompt), "max_tokens": 1, "status": r.status,
                         "ok": r.status is not None and 400 <= r.status < 500 and alive, "healthy_after": alive,
                         "error": r.error, "seconds": round(r.seconds, 3)})
    return {"max_model_len": max_model_len, "rows": rows, "failures": sum(not x["ok"] for x in rows)}


def determinism(base_url: str, served: str, prompts: list[list[int]], *, max_tokens: int, repeats: int,
                temperature: float, seed: int, timeout_s: float) -> dict[str, Any]:
    """Repeated greedy requests and repeated seeded sampled requests, one at a time."""
    url = f"{base_url}/v1/completions"
    out: dict[str, Any] = {}
    with httpx.Client(headers=api_keys.headers(base_url)) as client:
        for mode, extra in (("greedy", {}), ("seeded", {"temperature": temperature, "seed": seed})):
            mismatched = compared = errors = 0
            examples = []
            for i, p in enumerate(prompts):
                replies = [post(client, url, body=completion(served, p, max_tokens, **extra), timeout_s=timeout_s)
                           for _ in range(repeats)]
                errors += sum(not r.ok for r in replies)
                good = [r for r in replies if r.ok]
                for r in good[1:]:
                    compared += 1
                    if r.text != good[0].text:
                        mismatched += 1
                        if len(examples) < MAX_EXAMPLES:
                            examples.append({"prompt": i, "first": good[0].text, "later": r.text})
            out[mode] = {"compared": compared, "mismatched": mismatched, "errors": errors,
                         "mismatch_rate": mismatched / compared if compared else None, "examples": examples}
    return out


def bad_request_cases(served: str, vocab_size: int) -> list[tuple[str, str, Any]]:
    """(name, endpoint, body or raw bytes): requests a server must refuse with a 4xx."""
    c, chat = "/v1/completions", "/v1/chat/completions"
    return [
        ("empty prompt", c, {"model": served, "prompt": "", "max_tokens": 8}),
        ("empty token list", c, {"model": served, "prompt": [], "max_tokens": 8}),
        ("invalid UTF-8 in the body", c, b'{"model": "' + served.encode() + b'", "prompt": "\xff\xfe\xfa", '
                                          b'"max_tokens": 8}'),
        ("malformed JSON", c, b'{"model": "' + served.encode() + b'", "prompt": "hi",'),
        ("JSON that is not an object", c, b'[1, 2, 3]'),
        ("missing prompt", c, {"model": served, "max_tokens": 8}),
        ("prompt of the wrong type", c, {"model": served, "prompt": {"text": "hi"}, "max_tokens": 8}),
        ("unknown model name", c, {"model": "no-such-model", "prompt": "hi", "max_tokens": 8}),
        ("absurd max_tokens", c, {"model": served, "prompt": "hi", "max_tokens": 10**12}),
        ("negative max_tokens", c, {"model": served, "prompt": "hi", "max_tokens": -5}),
        ("negative temperature", c, {"model": served, "prompt": "hi", "max_tokens": 8, "temperature": -1}),
        ("NaN temperature", c, b'{"model": "' + served.encode() + b'", "prompt": "hi", "max_tokens": 8, '
                                b'"temperature": NaN}'),
        ("top_p above 1", c, {"model": served, "prompt": "hi", "max_tokens": 8, "top_p": 2.0}),
        ("oversized stop list", c, {"model": served, "prompt": "hi", "max_tokens": 8,
                                    "stop": [f"s{i}" for i in range(200)]}),
        ("token id outside the vocabulary", c, {"model": served, "prompt": [1, vocab_size + 1000], "max_tokens": 8}),
        ("negative token id", c, {"model": served, "prompt": [1, -7], "max_tokens": 8}),
        ("too many logprobs", c, {"model": served, "prompt": "hi", "max_tokens": 8, "logprobs": 10_000}),
        ("n of zero", c, {"model": served, "prompt": "hi", "max_tokens": 8, "n": 0}),
        ("max_tokens of the wrong type", c, {"model": served, "prompt": "hi", "max_tokens": "ten"}),
        ("a 2 MB prompt", c, {"model": served, "prompt": "word " * 400_000, "max_tokens": 8}),
        ("chat message without a role", chat, {"model": served, "messages": [{"content": "hi"}], "max_tokens": 8}),
        ("chat with an empty message list", chat, {"model": served, "messages": [], "max_tokens": 8}),
    ]


def bad_requests(base_url: str, served: str, *, vocab_size: int, timeout_s: float) -> dict[str, Any]:
    """Each malformed request: its status (a 4xx is right; a 5xx or a dropped
    connection is a finding), and whether the server still answers /health and a
    small greedy request afterwards."""
    rows = []
    with httpx.Client(headers=api_keys.headers(base_url)) as client:
        for name, path, body in bad_request_cases(served, vocab_size):
            raw = body if isinstance(body, bytes) else None
            r = post(client, f"{base_url}{path}", body=None if raw else body, raw=raw, timeout_s=timeout_s)
            alive = healthy(client, base_url)
            works = post(client, f"{base_url}/v1/completions", body=completion(served, "Hello", 2),
                         timeout_s=timeout_s).ok if alive else False
            refused = r.status is not None and 400 <= r.status < 500
            rows.append({"case": name, "status": r.status, "refused_with_4xx": refused, "healthy_after": alive,
                         "serving_after": works, "server_error": not refused and r.status != 200,
                         "accepted": r.status == 200, "error": (r.error or "")[:200]})
    return {"rows": rows,
            "server_errors": sum(1 for x in rows if x["server_error"] or not x["healthy_after"]
                                 or not x["serving_after"]),
            "accepted": [x["case"] for x in rows if x["accepted"]]}


def soak(base_url: str, served: str, prompts: list[list[int]], *, requests: int, concurrency: int, max_tokens: int,
         timeout_s: float, sample_rss: Callable[[], int | None]) -> dict[str, Any]:
    """`requests` requests at `concurrency`, every one accounted for, with the server's
    resident memory sampled before, during and after."""
    url = f"{base_url}/v1/completions"
    rss: list[tuple[float, int]] = []
    t0 = time.perf_counter()
    gone = _GoneServer()

    def one(i: int) -> Reply:
        if gone.now:  # the rest would each fail in a millisecond, for minutes: counted, not sent
            return Reply(None, error=NOT_SENT)
        if i % max(1, concurrency) == 0:
            value = sample_rss()
            if value:
                rss.append((time.perf_counter() - t0, value))
        reply = post(client, url, body=completion(served, prompts[i % len(prompts)], max_tokens, ignore_eos=True),
                     timeout_s=timeout_s)
        gone.saw(reply)
        return reply

    with httpx.Client(headers=api_keys.headers(base_url)) as client:
        first = sample_rss()
        if first:
            rss.append((0.0, first))
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            replies = list(pool.map(one, range(requests)))
        last = sample_rss()
        if last:
            rss.append((time.perf_counter() - t0, last))
    wall = time.perf_counter() - t0
    errors = [r for r in replies if not r.ok]
    empty = [r for r in replies if r.ok and not r.text]
    growth = None
    if len(rss) >= 2:
        half = [v for t, v in rss if t >= wall / 2] or [rss[-1][1]]
        growth = (max(half) - rss[0][1]) / 1e6
    not_sent = sum(r.error == NOT_SENT for r in replies)
    return {"requests": requests, "answered": len(replies) - not_sent, "not_sent": not_sent,
            "ok": len(replies) - len(errors) - len(empty),
            "errors": len(errors), "empty": len(empty), "error_rate": (len(errors) + len(empty)) / requests,
            "error_examples": [asdict(r) for r in errors[:MAX_EXAMPLES]], "wall_s": round(wall, 2),
            "rss_samples_mb": [(round(t, 1), round(v / 1e6, 1)) for t, v in rss], "rss_growth_mb": growth,
            "p50_s": _median([r.seconds for r in replies if r.ok])}


NOT_SENT = "not sent: the server had stopped accepting connections"
REFUSED_IN_A_ROW = 16  # connection refusals in a row that mean the server is gone, not busy


class _GoneServer:
    """Whether a load's server has stopped accepting connections (refused many times in a
    row, across the load's threads)."""

    def __init__(self) -> None:
        self._refused = 0
        self._lock = threading.Lock()
        self.now = False

    def saw(self, reply: Reply) -> None:
        with self._lock:
            refused = reply.status is None and (reply.error or "").startswith("ConnectError")
            self._refused = self._refused + 1 if refused else 0
            self.now = self.now or self._refused >= REFUSED_IN_A_ROW


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
