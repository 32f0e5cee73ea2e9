"""What each server had answered before the load, recorded with the performance results.

A server's history may move its speed, and nobody has shown by how much or why. In an A/A
run of the full W8A8 recipe with the baseline's quality answers cached (docs/performance.md,
"A server's history"), only the candidate's server had answered the quality evaluation
(4,503 requests, the baseline's 0) and it measured about 6% slower in throughput in every
repeat, on either core; A/A runs with nothing before the load measure 0.97-1.04. A second
run that restarted the busier server first (while other work loaded the host) found the
restarted one 30% slower: restarting is no remedy until the cause is known. So the stage
only records, from vLLM's own counter (`vllm:request_success` on /metrics), how many
requests each server had finished before the load, and says when the histories are unlike
(more than SLACK requests and a tenth of the busier count apart), so that the figures
carry that context and runs can be compared on it.
"""

from __future__ import annotations

from typing import Any

import httpx

from quantlab.core.roles import ROLES
from quantlab.core.stage_context import StageContext
from quantlab.performance.monitor import parse_metrics
from quantlab.serving import api_keys

SLACK = 64  # requests: a start's warm-up and a few probes differ by a handful, an evaluation by hundreds
RELATIVE_SLACK = 0.10  # two servers that answered the same evaluation differ by a few retries, not a tenth
ANSWERED = "vllm:request_success_total"  # vLLM's counter of finished requests (0.32/0.33), summed over reasons
METRICS_TIMEOUT_S = 5.0


def answered(server: Any) -> int | None:
    """How many requests this server has finished since it started, from its /metrics;
    None when that cannot be read (no such endpoint, another engine, no answer in time)."""
    base = server.base_url.rstrip("/")
    try:
        r = httpx.get(base + "/metrics", timeout=METRICS_TIMEOUT_S, headers=api_keys.headers(base))
        if r.status_code != 200:
            return None
        count = parse_metrics(r.text).get(ANSWERED)
    except (httpx.HTTPError, ValueError):
        return None
    return None if count is None else int(count)


def unlike(counts: dict[str, int | None], slack: int = SLACK) -> list[str]:
    """The roles whose servers answered more than `slack` requests, and more than a tenth of
    their own count, beyond the least used one; none when a count is unknown."""
    if any(c is None for c in counts.values()) or len(counts) < 2:
        return []
    least = min(c for c in counts.values() if c is not None)
    return [role for role, c in counts.items()
            if c is not None and c - least > max(slack, RELATIVE_SLACK * c)]


def notes(ctx: StageContext, roles: tuple[str, ...] = ROLES) -> list[str]:
    """The stage's notes on the servers' histories (a role with no server up yet counts 0:
    it starts fresh); nothing when no count can be read."""
    servers = {role: ctx.engine_if_running(role) for role in roles}
    counts = {role: (0 if server is None else answered(server)) for role, server in servers.items()}
    if all(c is None for c in counts.values()):
        return []
    said = ", ".join(f"{role} {'not read' if c is None else c}" for role, c in counts.items())
    busier = unlike(counts)
    if not busier:
        return [f"server history: requests each server had answered before the load: {said}"]
    return [f"server history: requests each server had answered before the load: {said}; unlike histories "
            f"(the {' and '.join(busier)} server answered far more): an A/A run measured a server that had "
            "answered the quality evaluation alone about 6% slower than an untouched one of the same weights "
            "(docs/performance.md, \"A server's history\"), so these ratios may carry that"]
