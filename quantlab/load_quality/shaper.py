"""The load shaper: a local proxy (aiohttp, in its own thread) between lm-eval and one server.

lm-eval sends with a high `num_concurrent`; the shaper lets its requests upstream closed loop
(at most C in flight, in arrival order) or open loop (at Poisson arrival times, R/s), and
times each. Generate requests go upstream streamed (timed as performance/loadgen times them)
and lm-eval gets the non-streaming JSON it expects, assembled; loglikelihood ones (`echo`) go
as they are, their answer verbatim. The payload's request keys (quality/request_keys) are
kept on the record, which joins each timing to the document lm-eval scored. Only the
shaper's own key (serving/api_keys, by its URL) is served; upstream goes the server's key.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from quantlab.load_quality.discipline import ClosedGate, Discipline, PoissonGate, ShapedRecord
from quantlab.performance.loadgen import streaming_body
from quantlab.quality.request_keys import PAYLOAD_FIELD
from quantlab.serving import api_keys

PATHS = ("/v1/completions", "/v1/chat/completions")
START_TIMEOUT_S = 30.0  # listening by then, or the shaper says why not
STOP_TIMEOUT_S = 10.0  # every request cancelled and the thread ended by then
MAX_BODY = 64 << 20  # a long prompt's token ids as JSON, with room to spare
ERROR_CHARS = 500


class StreamAssembly:
    """A streamed answer read line by line: each choice's text and finish reason, the usage;
    TTFT at the first text, the gaps between texts after it."""

    def __init__(self, *, chat: bool, t0: float) -> None:
        self.chat, self.t0 = chat, t0
        self.texts: dict[int, list[str]] = {}
        self.finish: dict[int, Any] = {}
        self.head: dict[str, Any] = {}
        self.usage, self.first, self.last, self.error, self.itl, self.done = None, None, None, None, [], False

    def feed_line(self, raw: bytes, now: float) -> bool:
        """One line of server-sent events; True at the stream's end ([DONE]) or an error event."""
        line = raw.strip()
        if not line.startswith(b"data:"):
            return False
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return True
        chunk = json.loads(data)
        if "error" in chunk or chunk.get("object") == "error":
            self.error = f"the server's stream carried an error: {json.dumps(chunk)[:ERROR_CHARS]}"
            return True
        self.head = self.head or {k: chunk.get(k) for k in ("id", "created", "model")}
        self.usage = chunk.get("usage") or self.usage
        for choice in chunk.get("choices") or []:
            i = int(choice.get("index") or 0)
            piece = ((choice.get("delta") or {}).get("content") if self.chat else choice.get("text")) or ""
            self.texts.setdefault(i, []).append(piece)
            if choice.get("finish_reason") is not None:
                self.finish[i] = choice["finish_reason"]
            if piece:
                if self.first is not None:
                    self.itl.append(now - self.last)
                self.first, self.last = self.first or now, now
        return False

    def fill(self, rec: ShapedRecord) -> None:
        """The record's timings and tokens; a stream cut short is an error."""
        rec.ttft = self.first - self.t0 if self.first is not None else rec.e2e  # no text: the answer was its end
        rec.itl = self.itl
        rec.read_usage(self.usage)
        if self.error is None and not self.done:
            self.error = "the server's stream ended before [DONE]"

    def answer(self) -> dict[str, Any]:
        """The non-streaming JSON the server would have sent (what lm-eval parses)."""
        choices = []
        for i in sorted(self.texts):
            text = "".join(self.texts[i])
            content = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
            choices.append({"index": i, **content, "logprobs": None, "finish_reason": self.finish.get(i)})
        return {**self.head, "object": "chat.completion" if self.chat else "text_completion", "choices": choices,
                "usage": self.usage}


def refusal(status: int, message: str) -> Any:
    from aiohttp import web

    return web.json_response({"error": {"message": message, "type": "load_shaper", "code": status}}, status=status)


async def not_found(request: Any) -> Any:
    return refusal(404, f"the load shaper serves POST {' and '.join(PATHS)} only")


class Shaper:
    """`with Shaper(upstream, Discipline(concurrency=4), timeout_s=300) as s:` point lm-eval at
    `s.base_url`; `s.records()`: the requests sent upstream, `s.max_in_flight`: the most
    upstream at once. `timeout_s` bounds each upstream request; `log` gets a line for each
    one that failed."""

    def __init__(self, upstream_base_url: str, discipline: Discipline, *, timeout_s: float,
                 log: Callable[[str], None] | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f"the shaper's timeout_s must be positive, got {timeout_s}")
        self.upstream, self.discipline = upstream_base_url.rstrip("/"), discipline
        self.timeout_s, self.log = float(timeout_s), log or (lambda line: None)
        self.base_url: str | None = None
        self.in_flight = self.max_in_flight = 0
        self.abandoned = 0  # requests whose client had gone when their turn came: not sent
        self._records: list[ShapedRecord] = []
        self._lock, self._tasks = threading.Lock(), set()
        self._loop: asyncio.AbstractEventLoop | None = None  # set on entering, with the thread running it
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Shaper:
        self._key = api_keys.new_key()
        self._upstream_headers = api_keys.headers(self.upstream)
        self._loop = asyncio.new_event_loop()
        ready, failed = threading.Event(), []
        self._thread = threading.Thread(target=self._serve, args=(ready, failed), name="load-shaper", daemon=True)
        self._thread.start()
        if not ready.wait(START_TIMEOUT_S) or failed:
            self.close()
            why = f"{type(failed[0]).__name__}: {failed[0]}" if failed else f"not listening after {START_TIMEOUT_S:g} s"
            raise RuntimeError(f"the load shaper did not start: {why}")
        api_keys.register(self.base_url, self._key)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop: queued and in-flight requests cancelled, the thread ended, within STOP_TIMEOUT_S."""
        if self.base_url:
            api_keys.forget(self.base_url, self._key)
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(STOP_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 (a timeout or a half-started app: stopping goes on regardless)
            self.log(f"load shaper: stopping did not end cleanly ({type(err).__name__}: {err})")
        finally:
            if not loop.is_closed():
                loop.call_soon_threadsafe(loop.stop)
            thread.join(STOP_TIMEOUT_S)

    def _serve(self, ready: threading.Event, failed: list) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as err:  # noqa: BLE001 (handed to __enter__, which raises it)
            failed.append(err)
        ready.set()
        try:
            if not failed:
                self._loop.run_forever()
        finally:
            self._loop.close()

    async def _start(self) -> None:
        import aiohttp
        from aiohttp import web

        self._t0 = time.perf_counter()
        d = self.discipline
        self._gate = ClosedGate(d.concurrency) if d.rate is None else PoissonGate(d.rate, d.seed, self._t0)
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                              timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=MAX_BODY)
        for path in PATHS:
            app.router.add_post(path, self._handle)
        app.router.add_route("*", "/{tail:.*}", not_found)  # every other path, or method
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=STOP_TIMEOUT_S / 2)
        await self._runner.cleanup()
        await self._session.close()

    def records(self) -> list[ShapedRecord]:
        """Every request sent upstream so far, in the order each ended."""
        with self._lock:
            return list(self._records)

    def now(self) -> float:
        """Seconds since the shaper started (the records' clock)."""
        return time.perf_counter() - self._t0

    async def _handle(self, request: Any) -> Any:
        given = request.headers.get("Authorization", "").encode()
        if not secrets.compare_digest(given, f"Bearer {self._key}".encode()):
            return refusal(401, "the load shaper's own key is required")
        try:
            body = await request.json()
        except ValueError as err:
            return refusal(400, f"the body is not JSON: {err}")
        if not isinstance(body, dict):
            return refusal(400, "the body is not a JSON object")
        keys = body.pop(PAYLOAD_FIELD, None)
        keys = [str(k) for k in keys] if isinstance(keys, list) else []
        kind = "chat" if request.path == PATHS[1] else "loglikelihood" if body.get("echo") else "generate"
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            return await self._shaped(request, body, keys, kind)
        finally:
            self._tasks.discard(task)

    async def _shaped(self, request: Any, body: dict[str, Any], keys: list[str], kind: str) -> Any:
        """The discipline's turn, then one upstream exchange, recorded."""
        from aiohttp import web

        queued_at = self.now()
        late_s = await self._gate.enter()
        try:
            if request.transport is None or request.transport.is_closing():
                self.abandoned += 1  # lm-eval gave up on it (its own timeout) and sends it again
                with self._lock:  # recorded: its document was asked more than once
                    self._records.append(ShapedRecord(keys=keys, kind=kind, queued_at=queued_at, sent_at=self.now(),
                                                      late_s=late_s, in_flight_at_send=self.in_flight,
                                                      outcome="abandoned"))
                return web.Response(status=499)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            asked = body.get("max_tokens")
            rec = ShapedRecord(keys=keys, kind=kind, queued_at=queued_at, sent_at=self.now(), late_s=late_s,
                               in_flight_at_send=self.in_flight,
                               requested_output_tokens=asked if isinstance(asked, int) else None)
            try:
                answer = await self._exchange(request.path, body, rec)
                if rec.outcome == "ok" and (request.transport is None or request.transport.is_closing()):
                    rec.outcome = "orphaned"  # answered after lm-eval gave up on it: it asks again
                return answer
            finally:
                self.in_flight -= 1
                with self._lock:
                    self._records.append(rec)
        finally:
            self._gate.leave()

    async def _exchange(self, path: str, body: dict[str, Any], rec: ShapedRecord) -> Any:
        """One upstream request within timeout_s; an answer that is not a 200 goes back with its
        status (a timeout as 504, a broken connection or answer as 502), recorded."""
        import aiohttp
        from aiohttp import web

        t0 = time.perf_counter()
        streamed = rec.kind != "loglikelihood"
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._session.post(self.upstream + path, json=streaming_body(body) if streamed else body,
                                              headers=self._upstream_headers) as resp:
                    rec.status = resp.status
                    if resp.status != 200:
                        text = await resp.text(errors="replace")
                        self._failed(rec, "error", text)
                        return web.Response(status=resp.status, text=text, content_type=resp.content_type)
                    return await (self._read_stream if streamed else self._read_verbatim)(resp, rec, t0)
        except TimeoutError:
            self._failed(rec, "timeout", f"no complete answer within {self.timeout_s:g} s")
            status = 504
        except (aiohttp.ClientError, ConnectionError, ValueError) as err:  # ValueError: an answer not as it should be
            self._failed(rec, "error", f"{type(err).__name__}: {err}")
            status = 502
        except asyncio.CancelledError:  # the shaper stops
            self._failed(rec, "error", "the load shaper stopped before the answer came")
            raise
        finally:
            rec.e2e = rec.e2e if rec.e2e is not None else time.perf_counter() - t0
        return refusal(status, rec.error or "")

    def _failed(self, rec: ShapedRecord, outcome: str, error: str) -> None:
        rec.outcome, rec.error = outcome, error[:ERROR_CHARS]
        self.log(f"load shaper: a {rec.kind} request failed upstream ({rec.status or outcome}): {rec.error[:200]}")

    async def _read_stream(self, resp: Any, rec: ShapedRecord, t0: float) -> Any:
        from aiohttp import web

        stream = StreamAssembly(chat=rec.kind == "chat", t0=t0)
        async for raw in resp.content:
            if stream.feed_line(raw, time.perf_counter()):
                break
        rec.e2e = time.perf_counter() - t0
        stream.fill(rec)
        if stream.error is not None:
            raise ValueError(stream.error)
        return web.json_response(stream.answer())

    async def _read_verbatim(self, resp: Any, rec: ShapedRecord, t0: float) -> Any:
        from aiohttp import web

        raw = await resp.read()
        rec.e2e = rec.ttft = time.perf_counter() - t0  # one answer: its first token comes with its last
        answer = json.loads(raw)
        rec.read_usage(answer.get("usage") if isinstance(answer, dict) else None)
        return web.Response(body=raw, status=200, content_type=resp.content_type)
