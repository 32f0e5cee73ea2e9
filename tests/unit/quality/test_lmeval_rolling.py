"""How the batched perplexity scoring splits one call's answers back into documents: each
document's windows summed in order, an empty request list answered without a call, and a
call that answers fewer windows than it was sent refused rather than summed short. (The
scores against lm-eval's own, on a real server: tests/integration/quality.)"""

from types import SimpleNamespace

import pytest

from quantlab.quality.lmeval_rolling import batch_rolling_requests, batched_loglikelihood_rolling


class Scorer:
    """An lm-eval API model's surface that this needs: a tokenizer, a window length, a
    scoring call and a cache hook; each window scores minus its number of target tokens."""

    prefix_token_id = 0
    max_length = 5

    def __init__(self, drop: int = 0):
        self.drop, self.calls, self.cached = drop, [], []
        self.cache_hook = SimpleNamespace(add_partial=lambda kind, args, value: self.cached.append((args, value)))

    def tok_encode(self, text):
        return [ord(c) for c in text]

    def _loglikelihood_tokens(self, windows, disable_tqdm=False):
        self.calls.append(len(windows))
        scored = [(-float(len(target)), True) for _, _, target in windows]
        return scored[: len(scored) - self.drop]


def req(text):
    return SimpleNamespace(args=(text,))


def test_each_document_is_the_sum_of_its_windows_in_one_call():
    lm = Scorer()
    texts = ["abcdefghij", "ab", "abcdefghijklmnopq"]
    assert batched_loglikelihood_rolling(lm, [req(t) for t in texts]) == [-10.0, -2.0, -17.0]
    assert len(lm.calls) == 1 and lm.calls[0] > len(texts)  # several windows per long document, one call
    assert lm.cached == [((t,), -float(len(t))) for t in texts]


def test_no_requests_no_call():
    lm = Scorer()
    assert batched_loglikelihood_rolling(lm, []) == [] and lm.calls == []


def test_a_dropped_answer_is_refused():
    with pytest.raises(RuntimeError, match="scored 3 of 4 perplexity windows"):
        batched_loglikelihood_rolling(Scorer(drop=1), [req("abcdefghij"), req("ab")])


def test_the_model_is_made_to_score_together():
    lm = batch_rolling_requests(Scorer())
    assert lm.loglikelihood_rolling([req("abcdefghij"), req("ab")], disable_tqdm=True) == [-10.0, -2.0]
    assert lm.calls == [4]  # three windows and one, in one call
