"""Wall time during which quantlab waits on an engine at work: llm-compressor calibrating
and saving, a vLLM server starting or answering, lm-eval evaluating. Everything else in
a run (planning, tokenising, comparing, statistics, plots, hashing, signing, reports) is
quantlab's own, and the run record keeps both so that the share is measured, not guessed.

Waits may overlap (two servers starting at once, probes in threads): the clock counts the
union of the intervals, never the same second twice."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_active = 0
_since = 0.0
_total = 0.0


@contextmanager
def engine_busy() -> Iterator[None]:
    """Count the wall time of this block as an engine's."""
    global _active, _since, _total
    with _lock:
        if _active == 0:
            _since = time.perf_counter()
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                _total += time.perf_counter() - _since


def engine_seconds() -> float:
    """Engine seconds since the process started (an open interval counts up to now)."""
    with _lock:
        return _total + (time.perf_counter() - _since if _active else 0.0)
