"""The same check on baseline and candidate at once, while both servers are up.

Each job runs in a thread of its own and is given a stop event: the first failure sets
it, and so does an interruption of the caller (Ctrl-C, SIGTERM), so a job that polls it
(an lm-eval child) ends within seconds instead of finishing work nobody will read. The
caller gets the first failure as it was raised; a job's `Stopped` is never the cause.

Measured on the 2-core Intel Xeon with AMX (scripts/bench_concurrent_roles.py: default
model bf16, four default-suite tasks x 30 samples on each of two servers): one after the
other 91.3 s, at once 70.7 s (1.29x).
The engine is not the only thing at work: lm-eval's client and vLLM's front-end take a
good part of the other core, which is why two at once beat one after the other.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any


class Stopped(Exception):
    """A job gave up because another one failed or the run was interrupted."""


def run_together(jobs: dict[str, Callable[[threading.Event], Any]], *, grace_s: float = 60) -> dict[str, Any]:
    """Run every job at once; returns {name: result}. After a failure the others get
    `grace_s` to notice the stop event; threads still running then are left to end with
    their servers (they are daemons: they never hold the process open)."""
    stop = threading.Event()
    results: dict[str, Any] = {}
    failures: list[BaseException] = []
    finished: queue.Queue[str] = queue.Queue()

    def work(name: str, job: Callable[[threading.Event], Any]) -> None:
        try:
            results[name] = job(stop)
        except BaseException as err:  # noqa: BLE001 - handed to the caller below
            failures.append(err)
            stop.set()
        finally:
            finished.put(name)

    for name, job in jobs.items():
        threading.Thread(target=work, args=(name, job), name=f"quantlab-{name}", daemon=True).start()
    pending = len(jobs)
    try:
        deadline = None
        while pending:
            if deadline is None and stop.is_set():
                deadline = time.monotonic() + grace_s
            if deadline is not None and time.monotonic() > deadline:
                break
            try:
                finished.get(timeout=0.5)
                pending -= 1
            except queue.Empty:
                continue
    except BaseException:
        stop.set()
        raise
    causes = [f for f in failures if not isinstance(f, Stopped)] or failures
    if causes:
        raise causes[0]
    return results
