"""Perplexity documents scored together (`quality/lmeval_rolling`) give lm-eval's own
per-document scores, against the session's real tiny server: documents of one window and
of several (a 64-token window), in an order the batching reorders by length."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

TEXTS = [
    "The river ran past the mill.",
    " ".join(f"Line {i}: the keeper counted {i * 7} boats before the storm." for i in range(12)),
    "Short.",
    " ".join(f"word{i}" for i in range(90)),
]


def test_batched_rolling_scores_equal_lm_evals_own(tiny_server, tiny_served_checkpoint):
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    from quantlab.quality.lmeval_rolling import batch_rolling_requests, document_windows

    server, _, _ = tiny_server

    def lm():
        return get_model("local-completions").create_from_arg_obj({
            "base_url": f"{server.base_url}/v1/completions", "model": server.served_name, "num_concurrent": 4,
            "max_retries": 1, "timeout": 120, "max_length": 64, "tokenizer": str(tiny_served_checkpoint),
            "tokenizer_backend": "huggingface"})

    requests = [Instance("loglikelihood_rolling", {}, (text,), i) for i, text in enumerate(TEXTS)]
    own = lm()
    assert [len(document_windows(own, t)) for t in TEXTS][1] >= 3  # several windows in one document
    expected = own.loglikelihood_rolling(requests, disable_tqdm=True)
    batched = batch_rolling_requests(lm()).loglikelihood_rolling(requests, disable_tqdm=True)
    assert len(batched) == len(TEXTS) and all(score < 0 for score in batched)
    assert batched == pytest.approx(expected, rel=1e-4)
