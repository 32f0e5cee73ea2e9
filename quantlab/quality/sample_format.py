"""What quantlab keeps of one lm-eval sample (identity, prompt, answer, metrics): written
by the quality stage's lm-eval child, read by the flips report and by sensitivity's
answers reader. Pure: no lm-eval import."""

from __future__ import annotations

from typing import Any

MAX_PROMPT_CHARS = 4000  # what the flips report can show of a prompt; a prompt this long may be cut


def compact_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """What quantlab keeps of one lm-eval sample: identity, prompt, answer, metrics."""
    args = sample.get("arguments") or []
    first = args[0] if args else None
    prompt = first[0] if isinstance(first, (list, tuple)) and first else first
    choices = [a[1] for a in args[1:]] if isinstance(first, (list, tuple)) and len(first) > 1 and \
        isinstance(first[1], str) else None
    if choices is not None and isinstance(first[1], str):
        choices = [first[1]] + choices
    filtered = sample.get("filtered_resps")
    answer: Any = filtered
    if isinstance(filtered, list) and filtered and isinstance(filtered[0], (list, tuple)) and \
            len(filtered[0]) == 2 and isinstance(filtered[0][1], bool):
        # loglikelihood answers: (logprob, is_greedy) per choice -> the chosen choice
        lls = [f[0] for f in filtered]
        if len(lls) == 1:  # one continuation (last word): was it the greedy one, and how likely
            answer = f"{'greedy' if filtered[0][1] else 'not greedy'}, logprob {lls[0]:.3f}"
        else:
            best = max(range(len(lls)), key=lls.__getitem__)
            answer = choices[best] if choices and len(choices) == len(lls) else best
    elif isinstance(filtered, list) and len(filtered) == 1:
        answer = filtered[0]
    raw = sample.get("resps")
    raw_text = raw[0][0] if isinstance(raw, list) and raw and isinstance(raw[0], list) and raw[0] and \
        isinstance(raw[0][0], str) else None
    return {
        "doc_id": sample.get("doc_id"),
        "filter": sample.get("filter"),
        "prompt_hash": sample.get("prompt_hash"),
        "prompt": (str(prompt)[:MAX_PROMPT_CHARS] if prompt is not None else None),
        "target": sample.get("target"),
        "answer": answer,
        "raw": raw_text,
        "metrics": {m: sample.get(m) for m in sample.get("metrics") or []},
    }
