"""The load shaper's discipline and records (pure): a point's closed loop (at most C in flight,
in arrival order) or open loop (Poisson arrivals at R/s), and what is kept of each request it
forwarded (ShapedRecord), in the form performance/metrics judges (RequestRecord)."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from quantlab.performance.metrics import RequestRecord


@dataclass
class Discipline:
    """Closed loop (`concurrency`: at most that many upstream at once) or open loop (`rate`:
    Poisson arrivals per second, drawn from random.Random(seed)); exactly one of the two."""

    concurrency: int | None = None
    rate: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError(f"a discipline has a concurrency or a rate, exactly one (got {self})")
        if self.concurrency is not None and (not isinstance(self.concurrency, int) or self.concurrency < 1):
            raise ValueError(f"concurrency must be a whole number of at least 1, got {self.concurrency!r}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be a positive number of requests per second, got {self.rate!r}")


@dataclass
class ShapedRecord:
    """One request sent upstream. Seconds; queued_at and sent_at from the shaper's start;
    late_s: how far past its Poisson arrival time it went (nothing was queued then);
    in_flight_at_send counts itself."""

    keys: list[str]
    kind: str  # loglikelihood | generate | chat
    queued_at: float
    sent_at: float
    late_s: float
    in_flight_at_send: int
    outcome: str = "ok"  # ok | error | timeout | abandoned (given up while queued) | orphaned (after)
    status: int | None = None
    error: str | None = None
    ttft: float | None = None  # loglikelihood: = e2e (one answer); generate: its first text, else e2e
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    requested_output_tokens: int | None = None

    def as_request_record(self, index: int) -> RequestRecord:
        """The load generator's record of it, for performance/metrics (meets_slo, summarize)."""
        return RequestRecord(index=index, outcome=self.outcome, sent_at=self.sent_at, ttft=self.ttft, e2e=self.e2e,
                             itl=list(self.itl), prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens,
                             requested_output_tokens=self.requested_output_tokens, status=self.status,
                             error=self.error)

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        return {**row, **{k: round(v, 6) for k, v in row.items() if isinstance(v, float)},
                "itl": [round(x, 6) for x in self.itl]}

    def read_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            self.output_tokens = usage.get("completion_tokens", self.output_tokens)


class ClosedGate:
    """At most n requests past it at once, let through in the order they came (asyncio's
    semaphore wakes its waiters first come, first served, and a cancelled one passes its turn on)."""

    def __init__(self, n: int) -> None:
        self.slots = asyncio.Semaphore(n)

    async def enter(self) -> float:
        await self.slots.acquire()
        return 0.0

    def leave(self) -> None:
        self.slots.release()


class PoissonGate:
    """Each request let through at the next arrival time of a Poisson process at `rate`/s, in
    the order they came. One that comes after its arrival time (nothing was queued then)
    goes at once, late by the difference, and the process goes on from then: a pause in
    lm-eval's sending is not made up by a burst."""

    def __init__(self, rate: float, seed: int, t0: float) -> None:
        self.rate, self.rng = rate, random.Random(seed)
        self.next_at = t0 + self.rng.expovariate(rate)

    async def enter(self) -> float:
        now = time.perf_counter()
        at, late = (self.next_at, 0.0) if self.next_at >= now else (now, now - self.next_at)
        self.next_at = at + self.rng.expovariate(self.rate)  # claimed in arrival order, before any wait
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        return late

    def leave(self) -> None:
        pass
