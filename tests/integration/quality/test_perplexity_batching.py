"""Perplexity documents scored together (`quality/lmeval_rolling`, wired in by the lm-eval
child's `api_model`) give lm-eval's own per-document scores, against the session's real
tiny server: documents of one window and of several (a 64-token window), in an order the
batching reorders by length; one scoring call where lm-eval makes one per document."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

TEXTS = [
    "The river ran past the mill.",
    " ".join(f"Line {i}: the keeper counted {i * 7} boats before the storm." for i in range(12)),
    "Short.",
    " ".join(f"word{i}" for i in range(90)),
]


def counted(lm):
    """Count the model's scoring calls (each sends its windows num_concurrent at a time)."""
    calls, score = [], lm._loglikelihood_tokens
    lm._loglikelihood_tokens = lambda windows, **kw: calls.append(len(windows)) or score(windows, **kw)
    return lm, calls


def test_batched_rolling_scores_equal_lm_evals_own(tiny_server, tiny_served_checkpoint, monkeypatch):
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    from quantlab.quality.lmeval import api_model
    from quantlab.quality.lmeval_rolling import document_windows

    server, _, _ = tiny_server
    monkeypatch.setenv("OPENAI_API_KEY", server.api_key)  # lm-eval's local-completions sends it, as the child does
    args = {"base_url": f"{server.base_url}/v1/completions", "model": server.served_name, "num_concurrent": 4,
            "max_retries": 1, "timeout": 120, "max_length": 64, "tokenizer": str(tiny_served_checkpoint),
            "tokenizer_backend": "huggingface"}
    requests = [Instance("loglikelihood_rolling", {}, (text,), i) for i, text in enumerate(TEXTS)]
    own, own_calls = counted(get_model("local-completions").create_from_arg_obj(args))
    windows = [len(document_windows(own, t)) for t in TEXTS]
    assert windows[1] >= 3  # several windows in one document
    expected = own.loglikelihood_rolling(requests, disable_tqdm=True)
    batched_lm, calls = counted(api_model({"model": "local-completions", "model_args": args, "chat": False}))
    batched = batched_lm.loglikelihood_rolling(requests, disable_tqdm=True)
    assert own_calls == windows and calls == [sum(windows)]  # one call per document against one for all
    assert len(batched) == len(TEXTS) and all(score < 0 for score in batched)
    assert batched == pytest.approx(expected, rel=1e-4)  # the server's batching may move the last digits
