"""What quantlab keeps of an lm-eval sample (shapes as lm-eval 0.4.13 logs them)."""

from __future__ import annotations

from quantlab.quality.lmeval import MAX_PROMPT_CHARS, compact_sample


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
