"""What each server had answered before the load: read from vLLM's own counter, recorded
in the stage's notes, and unlike histories named."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace

import pytest

from quantlab.performance import server_history
from quantlab.performance.server_history import SLACK, answered, notes, unlike


def test_a_server_is_unlike_when_busier_than_the_least_used_by_more_than_the_slack_and_a_tenth():
    assert unlike({"baseline": 0, "candidate": 4503}) == ["candidate"]
    assert unlike({"baseline": 4503, "candidate": 4400}) == []  # both evaluated: alike (a few retries)
    assert unlike({"baseline": 4503, "candidate": 4000}) == ["baseline"]  # more than a tenth apart
    assert unlike({"baseline": 0, "candidate": SLACK}) == []
    assert unlike({"baseline": 0, "candidate": SLACK + 1}) == ["candidate"]
    assert unlike({"baseline": None, "candidate": 4503}) == []  # nothing judged on a count not read
    assert unlike({"candidate": 4503}) == []


@pytest.fixture
def counts(monkeypatch):
    table: dict[str, int | None] = {}
    monkeypatch.setattr(server_history, "answered", lambda server: table[server.base_url])
    return table


def context(*roles):
    running = {role: SimpleNamespace(base_url=f"http://127.0.0.1/{role}") for role in roles}
    return SimpleNamespace(engine_if_running=running.get)


def test_unlike_histories_are_named_with_their_counts(counts):
    counts.update({"http://127.0.0.1/baseline": 0, "http://127.0.0.1/candidate": 4503})
    [note] = notes(context("baseline", "candidate"))
    assert "baseline 0, candidate 4503" in note and "unlike" in note and "candidate server" in note


def test_alike_histories_a_role_not_up_and_counts_not_read(counts):
    counts.update({"http://127.0.0.1/baseline": 4400, "http://127.0.0.1/candidate": 4503})
    [note] = notes(context("baseline", "candidate"))
    assert "baseline 4400, candidate 4503" in note and "unlike" not in note
    # one at a time (side_by_side false): the role not up starts fresh, so it counts 0
    [note] = notes(context("candidate"))
    assert "baseline 0, candidate 4503" in note and "unlike" in note
    counts.update({"http://127.0.0.1/baseline": None})
    [note] = notes(context("baseline", "candidate"))
    assert "baseline not read" in note and "unlike" not in note
    counts.update({"http://127.0.0.1/candidate": None})
    assert notes(context("baseline", "candidate")) == []


def _serve(status: int, body: str):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(status if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, SimpleNamespace(base_url=f"http://127.0.0.1:{httpd.server_address[1]}")


METRICS = """# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 40.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 0.0
"""


def test_the_count_is_vllms_finished_requests_summed_over_reasons_and_none_without_it():
    httpd, server = _serve(200, METRICS)
    try:
        assert answered(server) == 42
    finally:
        httpd.shutdown()
    for status, body in ((200, "# no vllm series here\n"), (404, ""), (200, "not prometheus {{{")):
        httpd, server = _serve(status, body)
        try:
            assert answered(server) is None
        finally:
            httpd.shutdown()
    assert answered(SimpleNamespace(base_url="http://127.0.0.1:9")) is None  # nothing listening
