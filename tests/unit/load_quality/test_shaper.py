"""The load shaper's own mechanics (its cap, its Poisson clock, the streamed answer it
assembles, what it passes through, refuses and times out) against a small upstream started
here: what is tested is the proxy's discipline, so the upstream is ours to shape."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import pytest

from quantlab.load_quality.discipline import Discipline
from quantlab.load_quality.shaper import Shaper
from quantlab.performance import metrics
from quantlab.quality.request_keys import PAYLOAD_FIELD
from quantlab.serving import api_keys

LOGLIK = b'{"id":"cmpl-1","choices":[{"index":0,"text":"x","logprobs":{"token_logprobs":[null,-0.5]}}],' \
         b'"usage":{"prompt_tokens":2,"completion_tokens":1}}'
USAGE = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


class Upstream:
    """An OpenAI-shaped server in its own thread: loglikelihood answers LOGLIK, generate
    streams "a", "b", "c"; the prompt "fail" gets a 500, "stuck" no answer. It keeps the
    bodies it got and the most requests it had at once, and wants its own key."""

    def __init__(self, delay_s: float = 0.0, gap_s: float = 0.0) -> None:
        self.delay_s, self.gap_s = delay_s, gap_s
        self.bodies: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.key = api_keys.new_key()

    async def complete(self, request):
        from aiohttp import web

        if request.headers.get("Authorization") != f"Bearer {self.key}":
            return web.Response(status=401, text="wrong key")
        body = await request.json()
        self.bodies.append(body)
        prompt = body.get("prompt") or body.get("messages", [{}])[-1].get("content")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(30 if prompt == "stuck" else self.delay_s)
            if prompt == "fail":
                return web.Response(status=500, text="upstream broke")
            if body.get("echo"):
                return web.Response(body=LOGLIK, content_type="application/json")
            return await self.stream(request, chat="messages" in body)
        finally:
            self.in_flight -= 1

    async def stream(self, request, chat: bool):
        from aiohttp import web

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        head = {"id": "cmpl-2", "created": 1, "model": "m"}
        if chat:
            await send(resp, {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for i, piece in enumerate("abc"):
            await asyncio.sleep(self.gap_s)
            done = "stop" if i == 2 else None
            choice = {"delta": {"content": piece}} if chat else {"text": piece}
            await send(resp, {**head, "choices": [{"index": 0, **choice, "finish_reason": done}]})
        await send(resp, {**head, "choices": [], "usage": USAGE})
        await resp.write(b"data: [DONE]\n\n")
        return resp


async def send(resp, chunk: dict) -> None:
    await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")


@pytest.fixture
def upstream(request):
    """(Upstream, its base URL), its key registered as a server's would be."""
    from aiohttp import web

    up = Upstream(**getattr(request, "param", {}))
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/completions", up.complete)
    app.router.add_post("/v1/chat/completions", up.complete)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    api_keys.register(url, up.key)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield up, url
    finally:
        api_keys.forget(url, up.key)
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def post_all(shaper: Shaper, bodies: list[dict], path: str = "/v1/completions", key: str | None = None,
             timeout_s: float = 20) -> list[tuple[int, bytes]]:
    """Every body sent at once, as lm-eval with a high num_concurrent sends them."""
    import aiohttp

    key = key or api_keys.key_for(shaper.base_url)

    async def run():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         headers={"Authorization": f"Bearer {key}"}) as s:
            async def one(body):
                async with s.post(shaper.base_url + path, json=body, timeout=aiohttp.ClientTimeout(timeout_s)) as r:
                    return r.status, await r.read()
            return await asyncio.gather(*(one(b) for b in bodies))

    return asyncio.run(run())


def gen(prompt: str = "p", **more) -> dict:
    return {"model": "m", "prompt": prompt, "max_tokens": 3, "temperature": 0, **more}


@pytest.mark.parametrize("upstream", [{"delay_s": 0.15}], indirect=True)
def test_closed_loop_holds_the_cap_and_the_arrival_order(upstream):
    up, url = upstream
    with Shaper(url, Discipline(concurrency=3), timeout_s=10) as shaper:
        answers = post_all(shaper, [gen(echo=True, logprobs=1, **{PAYLOAD_FIELD: [f"k{i}"]}) for i in range(12)])
        records = shaper.records()
    assert [status for status, _ in answers] == [200] * 12
    assert shaper.max_in_flight == 3 and up.max_in_flight == 3
    assert len(records) == 12 and all(1 <= r.in_flight_at_send <= 3 for r in records)
    by_send = sorted(records, key=lambda r: r.sent_at)
    assert [r.queued_at for r in by_send] == sorted(r.queued_at for r in by_send)  # first come, first sent
    assert sorted(k for r in records for k in r.keys) == sorted(f"k{i}" for i in range(12))
    assert all(r.kind == "loglikelihood" and r.outcome == "ok" and r.late_s == 0 for r in records)


def test_open_loop_releases_at_poisson_times(upstream):
    _, url = upstream
    rate, n, seed = 100.0, 200, 7
    with Shaper(url, Discipline(rate=rate, seed=seed), timeout_s=10) as shaper:
        answers = post_all(shaper, [gen(echo=True, logprobs=1) for _ in range(n)])
        records = sorted(shaper.records(), key=lambda r: r.sent_at)
    assert len(records) == n and all(status == 200 for status, _ in answers)
    rng = random.Random(seed)
    draws = [rng.expovariate(rate) for _ in range(n)]
    span = records[-1].sent_at - records[0].sent_at
    late = sum(r.late_s for r in records[1:])  # time lost to requests that came after their arrival time
    assert abs((span - late) / (n - 1) - 1 / rate) < 0.25 / rate  # the mean gap: 1/rate
    # each request goes at the one before's time plus the seeded clock's next draw, plus how late it came
    assert span == pytest.approx(sum(draws[1:]) + late, abs=0.1)
    assert all(r.late_s >= 0 for r in records)


@pytest.mark.parametrize("upstream", [{"gap_s": 0.02}], indirect=True)
def test_streamed_generations_come_back_whole_and_timed(upstream):
    up, url = upstream
    with Shaper(url, Discipline(concurrency=2), timeout_s=10) as shaper:
        [(status, raw)] = post_all(shaper, [gen(**{PAYLOAD_FIELD: ["g1"]})])
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, PAYLOAD_FIELD: ["c1"]}
        [(chat_status, chat_raw)] = post_all(shaper, [chat], path="/v1/chat/completions")
        records = {r.keys[0]: r for r in shaper.records()}
    answer, chat_answer = json.loads(raw), json.loads(chat_raw)
    assert status == chat_status == 200
    assert answer["choices"] == [{"index": 0, "text": "abc", "logprobs": None, "finish_reason": "stop"}]
    assert chat_answer["choices"][0]["message"] == {"role": "assistant", "content": "abc"}
    assert answer["usage"] == chat_answer["usage"] == USAGE and answer["object"] == "text_completion"
    assert all(b["stream"] is True and b["stream_options"] == {"include_usage": True} for b in up.bodies)
    g, c = records["g1"], records["c1"]
    assert (g.kind, c.kind) == ("generate", "chat")
    for r in (g, c):
        assert r.outcome == "ok" and 0 < r.ttft < r.e2e and len(r.itl) == 2 and r.output_tokens == 3
        assert r.prompt_tokens == 4 and r.requested_output_tokens == 3
    rr = g.as_request_record(0)
    assert metrics.meets_slo(rr, {"ttft_ms": 10_000, "tpot_ms": 10_000, "e2e_ms": 10_000})
    assert not metrics.meets_slo(rr, {"ttft_ms": 0.001, "tpot_ms": None, "e2e_ms": None})
    assert metrics.summarize([rr, c.as_request_record(1)], wall_s=1.0, slo={"ttft_ms": 10_000})["ok_requests"] == 2
    assert json.loads(json.dumps(g.as_row()))["keys"] == ["g1"]


def test_loglikelihoods_pass_through_verbatim_with_the_keys_stripped(upstream):
    up, url = upstream
    body = gen(echo=True, logprobs=1, max_tokens=1, **{PAYLOAD_FIELD: ["k1", "k2"]})
    with Shaper(url, Discipline(concurrency=1), timeout_s=10) as shaper:
        [(status, raw)] = post_all(shaper, [body])
        [rec] = shaper.records()
    assert status == 200 and raw == LOGLIK
    assert up.bodies == [{k: v for k, v in body.items() if k != PAYLOAD_FIELD}]
    assert rec.keys == ["k1", "k2"] and rec.ttft == rec.e2e and (rec.prompt_tokens, rec.output_tokens) == (2, 1)


def test_upstream_errors_are_answered_with_their_status_and_recorded(upstream):
    _, url = upstream
    lines = []
    with Shaper(url, Discipline(concurrency=2), timeout_s=10, log=lines.append) as shaper:
        [(status, raw)] = post_all(shaper, [gen("fail", **{PAYLOAD_FIELD: ["f"]})])
        [rec] = shaper.records()
    assert status == 500 and raw == b"upstream broke"
    assert (rec.outcome, rec.status, rec.error, rec.keys) == ("error", 500, "upstream broke", ["f"])
    assert not metrics.meets_slo(rec.as_request_record(0), {}) and len(lines) == 1


def test_only_its_own_key_and_its_two_paths_are_served(upstream):
    up, url = upstream
    with Shaper(url, Discipline(concurrency=2), timeout_s=10) as shaper:
        base = shaper.base_url
        assert api_keys.key_for(base) not in (None, up.key)
        [(bad, _)] = post_all(shaper, [gen()], key="not-the-key")
        [(elsewhere, _)] = post_all(shaper, [gen()], path="/v1/models")
        assert shaper.records() == [] and up.bodies == []
    assert (bad, elsewhere) == (401, 404)
    assert api_keys.key_for(base) is None  # its key goes with it


def test_a_stuck_upstream_is_timed_out(upstream):
    _, url = upstream
    with Shaper(url, Discipline(rate=50.0), timeout_s=0.5) as shaper:
        [(status, _)] = post_all(shaper, [gen("stuck")])
        [rec] = shaper.records()
    assert status == 504 and rec.outcome == "timeout" and "0.5 s" in rec.error and 0.5 <= rec.e2e < 2.0


def test_the_shaper_stops_promptly_with_a_request_in_flight(upstream):
    _, url = upstream

    def send_quietly(shaper):
        try:
            post_all(shaper, [gen("stuck")])
        except Exception:  # noqa: BLE001 (the shaper goes away under it: that is the test)
            pass

    with Shaper(url, Discipline(concurrency=1), timeout_s=60) as shaper:
        sender = threading.Thread(target=send_quietly, args=(shaper,), daemon=True)
        sender.start()
        deadline = time.monotonic() + 5
        while shaper.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert shaper.in_flight == 1
        started = time.monotonic()
    assert time.monotonic() - started < 5
    [rec] = shaper.records()
    assert rec.outcome == "error" and "stopped" in rec.error
    sender.join(10)


@pytest.mark.parametrize("upstream", [{"delay_s": 0.3}], indirect=True)
def test_a_request_its_client_gave_up_on_while_queued_is_recorded_not_sent(upstream):
    import aiohttp

    up, url = upstream

    async def run(shaper):
        headers = {"Authorization": f"Bearer {api_keys.key_for(shaper.base_url)}"}
        async with aiohttp.ClientSession(headers=headers) as s:
            async def one(body, timeout_s):
                try:
                    async with s.post(shaper.base_url + "/v1/completions", json=body,
                                      timeout=aiohttp.ClientTimeout(timeout_s)) as r:
                        return r.status
                except TimeoutError:
                    return "gave up"
            tasks = []
            for prompt, timeout_s in (("one", 10), ("two", 0.1), ("three", 10)):  # in that order, one at a time
                tasks.append(asyncio.create_task(one(gen(prompt, echo=True), timeout_s)))
                await asyncio.sleep(0.03)
            return await asyncio.gather(*tasks)

    with Shaper(url, Discipline(concurrency=1), timeout_s=10) as shaper:
        assert asyncio.run(run(shaper)) == [200, "gave up", 200]
        assert shaper.abandoned == 1
        # recorded, not sent: its document was asked again (answers.join makes it unscored)
        assert sorted(r.outcome for r in shaper.records()) == ["abandoned", "ok", "ok"]
    assert [b["prompt"] for b in up.bodies] == ["one", "three"]


def test_a_discipline_is_one_of_the_two():
    with pytest.raises(ValueError, match="exactly one"):
        Discipline()
    with pytest.raises(ValueError, match="exactly one"):
        Discipline(concurrency=2, rate=1.0)
    with pytest.raises(ValueError, match="at least 1"):
        Discipline(concurrency=0)
    with pytest.raises(ValueError, match="positive"):
        Discipline(rate=0.0)
