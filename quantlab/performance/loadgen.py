"""A lean async load generator for OpenAI-compatible streaming endpoints (aiohttp).

Closed loop (N requests, C in flight) or open loop (Poisson arrivals at R per second).
Per request: TTFT, inter-token gaps, end-to-end time, the server's own token counts
(`stream_options.include_usage`), HTTP status and error text. Every request sent ends
as ok, error or timeout; nothing is dropped, and the whole point has a deadline.
Why our own client: it records per-request data with little CPU (on a 2-core machine
the client competes with a CPU engine), and runs in quantlab's environment without a
second vLLM install. scripts/crosscheck_vllm_bench.py compares it with `vllm bench serve`.
Requests carry the server's API key (serving/api_keys).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any

from quantlab.performance.metrics import RequestRecord
from quantlab.serving import api_keys


@dataclass
class PreparedRequest:
    path: str  # /v1/completions or /v1/chat/completions
    body: dict[str, Any]
    requested_output_tokens: int


@dataclass
class PointRun:
    records: list[RequestRecord]
    wall_s: float
    client_cpu_s: float
    not_sent: int  # requests left unsent because duration_s ran out


def streaming_body(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


async def _one(session, base_url: str, req: PreparedRequest, index: int, t_start: float,
               timeout_s: float) -> RequestRecord:
    import aiohttp

    rec = RequestRecord(index=index, outcome="ok", sent_at=time.perf_counter() - t_start,
                        requested_output_tokens=req.requested_output_tokens)
    t0 = time.perf_counter()
    last = None
    parts: list[str] = []
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(base_url + req.path, json=streaming_body(req.body)) as resp:
                rec.status = resp.status
                if resp.status != 200:
                    rec.outcome, rec.error = "error", (await resp.text())[:500]
                    return rec
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    chunk = json.loads(data)
                    if chunk.get("usage"):
                        rec.prompt_tokens = chunk["usage"].get("prompt_tokens")
                        rec.output_tokens = chunk["usage"].get("completion_tokens")
                    for choice in chunk.get("choices") or []:
                        piece = choice.get("text")
                        if piece is None:
                            piece = (choice.get("delta") or {}).get("content") or ""
                        if piece:
                            now = time.perf_counter()
                            if rec.ttft is None:
                                rec.ttft = now - t0
                            else:
                                rec.itl.append(now - last)
                            last = now
                            parts.append(piece)
        rec.e2e = time.perf_counter() - t0
        if rec.ttft is None:
            rec.outcome, rec.error = "error", "the stream ended without a token"
        elif rec.output_tokens is None:
            rec.outcome, rec.error = "error", "the stream carried no usage (token counts unknown)"
    except TimeoutError:
        rec.outcome, rec.error = "timeout", f"no complete answer within {timeout_s:g} s"
    except (aiohttp.ClientError, ConnectionError, json.JSONDecodeError) as err:
        rec.outcome, rec.error = "error", f"{type(err).__name__}: {err}"[:500]
    finally:
        rec.text = "".join(parts)
    return rec


async def _run(base_url: str, requests: list[PreparedRequest], *, concurrency: int | None, rate: float | None,
               duration_s: float | None, timeout_s: float, seed: int) -> PointRun:
    import aiohttp

    records: list[RequestRecord] = []
    not_sent = 0
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    cpu0, t_start = time.process_time(), time.perf_counter()
    stop_sending_at = t_start + duration_s if duration_s else None
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None),
                                     headers=api_keys.headers(base_url)) as session:
        if rate is None:  # closed loop: `concurrency` workers pull from one queue
            queue: asyncio.Queue = asyncio.Queue()
            for item in enumerate(requests):
                queue.put_nowait(item)

            async def worker():
                nonlocal not_sent
                while not queue.empty():
                    i, req = queue.get_nowait()
                    if stop_sending_at and time.perf_counter() > stop_sending_at:
                        not_sent += 1
                        continue
                    records.append(await _one(session, base_url, req, i, t_start, timeout_s))

            await asyncio.gather(*(worker() for _ in range(max(1, concurrency or 1))))
        else:  # open loop: Poisson arrivals, whatever is in flight
            rng = random.Random(seed)
            tasks = []
            next_at = t_start
            for i, req in enumerate(requests):
                next_at += rng.expovariate(rate)
                if stop_sending_at and next_at > stop_sending_at:
                    not_sent = len(requests) - i
                    break
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                tasks.append(asyncio.create_task(_one(session, base_url, req, i, t_start, timeout_s)))
            records.extend(await asyncio.gather(*tasks))
    wall = time.perf_counter() - t_start
    records.sort(key=lambda r: r.index)
    return PointRun(records, wall, time.process_time() - cpu0, not_sent)


def run_point(base_url: str, requests: list[PreparedRequest], *, concurrency: int | None = None,
              rate: float | None = None, duration_s: float | None = None, timeout_s: float = 300,
              seed: int = 0) -> PointRun:
    """Send `requests` and return every one's record. Each request has `timeout_s`; as
    each ends by then, the point ends by (number of rounds) x timeout_s at the latest."""
    return asyncio.run(_run(base_url.rstrip("/"), requests, concurrency=concurrency, rate=rate,
                            duration_s=duration_s, timeout_s=timeout_s, seed=seed))


def measure_client_ceiling(*, requests: int = 200, tokens: int = 16, concurrency: int = 16,
                           startup_timeout_s: float = 30) -> dict[str, Any]:
    """The load generator against a stub that answers instantly: the most requests and
    tokens per second it can drive here, and the latency it adds by itself (median E2E
    of a single request stream). A measured point near these numbers measures the client."""
    import statistics
    import subprocess
    import sys

    import httpx

    from quantlab.serving.vllm_server import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "quantlab.performance.stream_stub", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the load-generator stub server did not start within {startup_timeout_s:g} s")
            time.sleep(0.1)
        req = PreparedRequest("/v1/completions", {"model": "stub", "prompt": [1, 2, 3], "max_tokens": tokens},
                              tokens)
        run_point(base, [req] * 5, concurrency=1, timeout_s=30)  # warm-up
        busy = run_point(base, [req] * requests, concurrency=concurrency, timeout_s=30)
        single = run_point(base, [req] * 50, concurrency=1, timeout_s=30)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    ok = [r for r in busy.records if r.outcome == "ok"]
    return {
        "requests_per_s": len(ok) / busy.wall_s,
        "tokens_per_s": sum(r.output_tokens or 0 for r in ok) / busy.wall_s,
        "added_latency_ms": statistics.median(r.e2e for r in single.records if r.e2e is not None) * 1000,
        "client_cpu_share": busy.client_cpu_s / busy.wall_s,
        "ok_requests": len(ok),
        "sent_requests": len(busy.records),
        "workload": f"{requests} requests x {tokens} streamed tokens at concurrency {concurrency}; "
                    "added latency: median E2E of 50 sequential requests",
    }
