"""Scorers for support.jsonl's `python` checks: each takes (answer, row) and returns a bool.
quantlab runs them in a separate Python process with a time limit (quality.traffic[].
scorer_timeout_s); one that raises or hangs counts that row as errored and not passed."""


def keeps_the_new_day(answer: str, row: dict) -> bool:
    """The summary says the meeting is now on Wednesday and does not drop the reason."""
    text = answer.lower()
    return "wednesday" in text and ("book" in text or "room" in text)


def explains_a_cpu(answer: str, row: dict) -> bool:
    text = answer.lower()
    return "instruction" in text and ("process" in text or "execut" in text)
