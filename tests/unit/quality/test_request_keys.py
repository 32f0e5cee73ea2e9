"""One key per lm-eval request, equal on the payload lm-eval sends and on the sample it logs
(lm-eval 0.4.13's own request path, against a recording HTTP server)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from quantlab.quality.request_keys import PAYLOAD_FIELD, key_of, keys_of_arguments

GEN = {"until": ["\n"], "max_gen_toks": 8, "do_sample": False, "temperature": 0.0}


def test_a_key_is_the_sha256_of_the_canonical_cache_key():
    k = key_of(("Q: 2 + 3\nA:", GEN))
    assert len(k) == 64 and int(k, 16) >= 0
    assert k == key_of(["Q: 2 + 3\nA:", dict(reversed(list(GEN.items())))])  # tuples as lists, keys sorted
    assert k != key_of(("Q: 2 + 3\nA:", {**GEN, "max_gen_toks": 9}))
    assert key_of(("Q: 2 + 3\nA:", " 5")) != key_of(("Q: 2 + 3\nA:", " 6"))
    assert key_of(("naïve — 東京", " x")) == key_of(["naïve — 東京", " x"])


def test_a_chat_context_keys_as_the_logged_sample_holds_it_and_apart_from_plain_text():
    from lm_eval.models.api_models import JsonChatStr

    chat = JsonChatStr(json.dumps([{"role": "user", "content": "hi"}]))
    assert key_of((chat, GEN)) == key_of(((chat.prompt,), dict(GEN)))  # lm-eval logs it as a plain 1-tuple
    assert key_of((chat, GEN)) != key_of((chat.prompt, GEN))


def test_keys_of_a_samples_arguments():
    mc = [("Question: 19 x 4?\nAnswer:", c) for c in (" 75", " 76", " 78")]
    assert keys_of_arguments(mc) == [key_of(a) for a in mc]
    assert keys_of_arguments([["Q: 1 + 1\nA:", GEN]]) == [key_of(("Q: 1 + 1\nA:", GEN))]
    assert keys_of_arguments([("a whole document of prose",)]) == []  # perplexity windows carry no key
    assert keys_of_arguments(None) == []


class Recorder(BaseHTTPRequestHandler):
    """Answers every POST with `answer` and keeps the payloads."""

    payloads: list[dict] = []
    answer: dict = {}

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).payloads.append(body)
        out = json.dumps(type(self).answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture
def recorder():
    Recorder.payloads = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", Recorder
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_chat_generations_carry_the_keys_of_their_samples(recorder):
    from lm_eval.api.instance import Instance
    from lm_eval.models.api_models import JsonChatStr
    from lm_eval.models.openai_completions import LocalChatCompletion

    from quantlab.quality.lmeval import tag_payloads

    url, rec = recorder
    rec.answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
    lm = tag_payloads(LocalChatCompletion(base_url=f"{url}/v1/chat/completions", model="m", num_concurrent=2,
                                          max_retries=1))
    reqs = [Instance("generate_until", {}, (JsonChatStr(json.dumps([{"role": "user", "content": q}])), dict(GEN)),
                     i) for i, q in enumerate(["2 + 3?", "10 - 4?", "7 + 8?"])]
    assert lm.generate_until(reqs) == ["ok"] * 3
    sent = sorted(key for p in rec.payloads for key in p[PAYLOAD_FIELD])
    assert len(rec.payloads) == 3 and all(len(p[PAYLOAD_FIELD]) == 1 for p in rec.payloads)
    assert sent == sorted(k for r in reqs for k in keys_of_arguments([r.args]))


def test_loglikelihoods_carry_the_keys_of_their_samples_and_windows_none(recorder):
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from quantlab.quality.lmeval import tag_payloads

    url, rec = recorder
    rec.answer = {"choices": [{"index": 0, "logprobs": {"token_logprobs": [None, -1.0, -0.5, -0.1],
                                                        "top_logprobs": [None, {"a": -1.0}, {"b": -0.5}, {"c": 0}]}}]}
    lm = tag_payloads(LocalCompletionsAPI(base_url=f"{url}/v1/completions", model="m", num_concurrent=2,
                                          max_retries=1, tokenizer_backend=None))
    lm.tokenizer, lm.tokenized_requests = object(), True  # lm-eval asks for one; the ids below stand for its output
    args = [("Question: 19 x 4?\nAnswer:", " 76"), ("Question: 19 x 4?\nAnswer:", " 78")]
    window = (None, [1, 2], [3, 4])  # a perplexity window (quality/lmeval_rolling): no cache key
    out = lm._loglikelihood_tokens([(a, [1, 2], [3, 4]) for a in args] + [window])
    assert len(out) == 3 and all(p["echo"] is True for p in rec.payloads)
    assert sorted(k for p in rec.payloads for k in p[PAYLOAD_FIELD]) == sorted(keys_of_arguments(args))
    assert [] in [p[PAYLOAD_FIELD] for p in rec.payloads]


def test_tagging_needs_the_concurrent_path(tmp_path):
    from quantlab.quality.lmeval import run_tasks

    with pytest.raises(ValueError, match="num_concurrent >= 2"):
        run_tasks(tasks=["t"], base_url="http://127.0.0.1:9", served_name="m", tokenizer=None, suite_dir=None,
                  out_dir=tmp_path, log_path=tmp_path / "log", seed=0, num_concurrent=1, request_timeout_s=1,
                  max_retries=1, deadline_s=1, offline=True, trust_remote_code=False, progress=print,
                  tag_requests=True)
    assert not (tmp_path / "lmeval-spec.json").exists()
