"""What quantlab keeps of an lm-eval sample (shapes as lm-eval 0.4.13 logs them)."""

from __future__ import annotations

import threading
import time

import pytest

from quantlab.core.together import Stopped
from quantlab.quality.lmeval import run_tasks
from quantlab.quality.samples import Docs
from quantlab.quality.sample_format import MAX_PROMPT_CHARS, compact_sample
from quantlab.serving.vllm_server import free_port


def test_multiple_choice_answer_is_the_most_likely_choice():
    s = {"doc_id": 3, "filter": "none", "prompt_hash": "h", "target": 1, "metrics": ["acc", "acc_norm"],
         "acc": 0.0, "acc_norm": 1.0,
         "arguments": [["Question: 19 x 4?\nAnswer:", " 75"], ["Question: 19 x 4?\nAnswer:", " 76"],
                       ["Question: 19 x 4?\nAnswer:", " 78"]],
         "filtered_resps": [[-9.5, False], [-8.7, False], [-7.6, False]]}
    row = compact_sample(s)
    assert row["answer"] == " 78" and row["prompt"].startswith("Question") and row["metrics"] == {
        "acc": 0.0, "acc_norm": 1.0}


def test_single_continuation_says_whether_it_was_greedy():
    s = {"doc_id": 0, "filter": "none", "arguments": [["It was a dark and stormy", " night"]],
         "filtered_resps": [[-0.25, True]], "metrics": ["acc"], "acc": 1.0}
    assert compact_sample(s)["answer"] == "greedy, logprob -0.250"


def test_generation_keeps_the_filtered_and_the_raw_answer_and_cuts_long_prompts():
    s = {"doc_id": 7, "filter": "first-number", "arguments": [["Q: " + "x" * 10_000, {"until": ["\n"]}]],
         "resps": [[" 12 apples"]], "filtered_resps": ["12"], "metrics": ["exact_match"], "exact_match": 1.0}
    row = compact_sample(s)
    assert row["answer"] == "12" and row["raw"] == " 12 apples" and len(row["prompt"]) == MAX_PROMPT_CHARS


def test_a_stop_kills_the_lm_eval_child_within_seconds(tmp_path):
    """The other role's evaluation failed: this one's child is killed, `Stopped` raised,
    without waiting for lm-eval (nothing listens on the URL; it would retry for minutes)."""
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    started = time.monotonic()
    with pytest.raises(Stopped):
        run_tasks(tasks=["ql_lastword"], base_url=f"http://127.0.0.1:{free_port()}", served_name="m",
                  tokenizer=None, suite_dir=None, out_dir=tmp_path / "out", log_path=tmp_path / "lmeval.log",
                  seed=0, docs={"ql_lastword": Docs(0, 1)}, num_concurrent=1, request_timeout_s=60, max_retries=3,
                  deadline_s=600, offline=True, trust_remote_code=False, progress=lambda line: None, stop=stop)
    assert time.monotonic() - started < 10
