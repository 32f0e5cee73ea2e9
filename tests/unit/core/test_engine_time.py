"""The engine clock counts the union of overlapping waits, never a second twice."""

from __future__ import annotations

import pytest

from quantlab.core import engine_time


@pytest.fixture
def fake_clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(engine_time.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(engine_time, "_total", 0.0)
    monkeypatch.setattr(engine_time, "_active", 0)
    return now


def test_nested_and_overlapping_waits_count_once(fake_clock):
    first, second = engine_time.engine_busy(), engine_time.engine_busy()
    first.__enter__()
    fake_clock[0] += 2                       # one wait: 2 s
    second.__enter__()
    fake_clock[0] += 3                       # both waits: 3 s, counted once
    assert engine_time.engine_seconds() == pytest.approx(5)  # an open interval counts up to now
    first.__exit__(None, None, None)
    fake_clock[0] += 1                       # the second alone: 1 s
    second.__exit__(None, None, None)
    fake_clock[0] += 10                      # nobody waits: quantlab's own time
    assert engine_time.engine_seconds() == pytest.approx(6)


def test_a_failing_wait_still_stops_the_clock(fake_clock):
    with pytest.raises(RuntimeError), engine_time.engine_busy():
        fake_clock[0] += 4
        raise RuntimeError("engine died")
    fake_clock[0] += 100
    assert engine_time.engine_seconds() == pytest.approx(4)
