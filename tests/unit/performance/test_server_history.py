"""Servers measured from alike histories: which are restarted before the load, what the
record says, and that a count not read changes nothing."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace

import pytest

from quantlab.performance import server_history
from quantlab.performance.server_history import SLACK, answered, make_alike, to_restart


def test_only_a_server_busier_than_the_least_used_by_more_than_the_slack_is_restarted():
    assert to_restart({"baseline": 3, "candidate": 4503}) == ["candidate"]
    assert to_restart({"baseline": 4503, "candidate": 4400}) == []  # both evaluated: alike (a few retries)
    assert to_restart({"baseline": 4503, "candidate": 4000}) == ["baseline"]  # more than a tenth apart
    assert to_restart({"baseline": 0, "candidate": SLACK}) == []
    assert to_restart({"baseline": 0, "candidate": SLACK + 1}) == ["candidate"]
    assert to_restart({"baseline": 900, "candidate": 2}) == ["baseline"]
    assert to_restart({"baseline": None, "candidate": 4503}) == []  # nothing judged on a count not read
    assert to_restart({"candidate": 4503}) == []


class FakeContext:
    def __init__(self, running: dict, restartable: set[str]):
        self.running, self.restartable = running, restartable
        self.retired: list[str] = []
        self.said: list[str] = []

    def engine_if_running(self, role):
        return self.running.get(role)

    def retire_engine(self, role):
        if role not in self.restartable:
            return False
        self.retired.append(role)
        self.running.pop(role)
        return True

    def progress(self, line):
        self.said.append(line)


@pytest.fixture
def counts(monkeypatch):
    table: dict[str, int | None] = {}
    monkeypatch.setattr(server_history, "answered", lambda server: table[server.base_url])
    return table


def servers(*roles):
    return {role: SimpleNamespace(base_url=f"http://127.0.0.1/{role}") for role in roles}


def test_the_server_that_answered_the_evaluation_alone_is_restarted_and_the_record_says_why(counts):
    counts.update({"http://127.0.0.1/baseline": 2, "http://127.0.0.1/candidate": 4503})
    ctx = FakeContext(servers("baseline", "candidate"), {"baseline", "candidate"})
    notes = make_alike(ctx)
    assert ctx.retired == ["candidate"] and "baseline" in ctx.running
    assert len(notes) == 1 and "baseline 2, candidate 4503" in notes[0] and "fresh start" in notes[0]
    assert any("restarting the candidate server" in line for line in ctx.said)


def test_alike_histories_and_a_role_not_up_yet(counts):
    counts.update({"http://127.0.0.1/baseline": 4400, "http://127.0.0.1/candidate": 4503})
    ctx = FakeContext(servers("baseline", "candidate"), {"baseline", "candidate"})
    assert make_alike(ctx) == [] and ctx.retired == []
    # one at a time (side_by_side false): the role not up starts fresh, so it counts 0
    counts.update({"http://127.0.0.1/candidate": 4503})
    ctx = FakeContext(servers("candidate"), {"candidate"})
    assert make_alike(ctx) and ctx.retired == ["candidate"]


def test_a_server_not_this_runs_to_restart_is_measured_as_found_and_said(counts):
    counts.update({"http://127.0.0.1/baseline": 5000, "http://127.0.0.1/candidate": 0})
    ctx = FakeContext(servers("baseline", "candidate"), restartable={"candidate"})  # a shared baseline
    [note] = make_alike(ctx)
    assert ctx.retired == [] and "not made alike" in note and "baseline 5000" in note


def test_a_count_that_cannot_be_read_changes_nothing_and_is_said(counts):
    counts.update({"http://127.0.0.1/baseline": None, "http://127.0.0.1/candidate": 4503})
    ctx = FakeContext(servers("baseline", "candidate"), {"baseline", "candidate"})
    [note] = make_alike(ctx)
    assert ctx.retired == [] and "not compared" in note and "baseline" in note


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
