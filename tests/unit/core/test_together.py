"""Jobs run at once: results by name, the first real failure raised, the others told to stop."""

from __future__ import annotations

import threading
import time

import pytest

from quantlab.core.together import Stopped, run_together


def test_every_result_by_name_and_the_jobs_overlap():
    barrier = threading.Barrier(2, timeout=5)  # each job waits for the other: they must run at once

    def job(value):
        def run(stop):
            barrier.wait()
            return value
        return run

    assert run_together({"baseline": job(1), "candidate": job(2)}) == {"baseline": 1, "candidate": 2}


def test_the_first_failure_is_raised_and_the_other_job_is_told_to_stop():
    saw_stop = threading.Event()

    def fails(stop):
        raise ValueError("the candidate server died")

    def polls(stop):
        if stop.wait(timeout=10):
            saw_stop.set()
            raise Stopped("gave up")
        return "finished"

    started = time.monotonic()
    with pytest.raises(ValueError, match="candidate server died"):
        run_together({"baseline": polls, "candidate": fails})
    assert saw_stop.is_set() and time.monotonic() - started < 5


def test_a_job_that_ignores_stop_is_left_after_the_grace_period():
    release = threading.Event()

    def fails(stop):
        raise RuntimeError("boom")

    def stubborn(stop):
        release.wait(timeout=30)
        return "late"

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="boom"):
        run_together({"a": fails, "b": stubborn}, grace_s=0.5)
    assert time.monotonic() - started < 5
    release.set()


def test_stopped_alone_is_raised_when_nothing_else_failed():
    with pytest.raises(Stopped):
        run_together({"only": lambda stop: (_ for _ in ()).throw(Stopped("interrupted"))})
