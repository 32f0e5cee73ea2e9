"""Perplexity tasks (lm-eval's `loglikelihood_rolling`) scored across documents at once.

lm-eval 0.4's API models score them one document at a time: each document's windows go to
the server as a batch of their own, so `num_concurrent` never applies across documents (the
demo suite's 40 prose samples were 40 requests in turn, the server idle between them). Here
every document's windows go through one `_loglikelihood_tokens` call, which keeps
`num_concurrent` requests in flight, and each document's score is the sum of its windows'
log-likelihoods in window order, as lm-eval computes it. Each window is its own request, so
what changes is the order requests arrive in and which ones the server batches together
(vLLM is not batch-invariant: a score may move in its last digits). Runs in the lm-eval child.
"""

from __future__ import annotations

from typing import Any


def document_windows(lm: Any, text: str) -> list[tuple]:
    """lm-eval's own windows of one document (`loglikelihood_rolling` in its API models)."""
    from lm_eval import utils

    windows = utils.get_rolling_token_windows(token_list=lm.tok_encode(text), prefix_token=lm.prefix_token_id,
                                              max_seq_len=lm.max_length - 1, context_len=1)
    return [(None, *utils.make_disjoint_window(w)) for w in windows]


def batched_loglikelihood_rolling(lm: Any, requests: list, disable_tqdm: bool = False) -> list[float]:
    if not requests:
        return []
    windows: list[tuple] = []
    owner: list[int] = []
    for i, req in enumerate(requests):
        (text,) = req.args
        doc_windows = document_windows(lm, text)
        windows += doc_windows
        owner += [i] * len(doc_windows)
    scored = lm._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
    if len(scored) != len(windows):  # a dropped answer must not shorten a document's sum silently
        raise RuntimeError(f"the server scored {len(scored)} of {len(windows)} perplexity windows")
    totals = [0.0] * len(requests)
    for i, (logprob, _is_greedy) in zip(owner, scored, strict=True):
        totals[i] += logprob
    for req, total in zip(requests, totals, strict=True):
        lm.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
    return totals


def batch_rolling_requests(lm: Any) -> Any:
    """Make this lm-eval API model score perplexity documents together (see above)."""
    lm.loglikelihood_rolling = lambda requests, disable_tqdm=False: batched_loglikelihood_rolling(
        lm, requests, disable_tqdm)
    return lm
