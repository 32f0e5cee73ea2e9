"""Servers compared for performance are measured from alike histories.

A server's history (what it has answered since it started) moves its speed. Measured in
an A/A run of the full W8A8 recipe (docs/performance.md, "A server's history"): with the
baseline's quality answers from the cache, only the candidate's server had answered the
quality evaluation (4,503 requests against the baseline's 0); the performance stage then
found it about 6% slower in throughput and 8-19% in median TTFT than the baseline's
untouched server, in every repeat and on either core, where A/A runs with nothing before
the load measured 0.97-1.04. So before it measures, the stage reads how many requests
each server has answered (vLLM's own counter, `vllm:request_success` on /metrics) and
restarts each that answered more than SLACK requests, and more than a tenth of its own
count, beyond the least used one: all are then measured from a fresh start (a cached baseline's run pays one server start, about
30-40 s on 2 cores). Servers whose histories are alike (both evaluated, or neither) are
left as they are. Where a count cannot be read, or a server is not this run's to restart
(an external endpoint, a comparison's shared baseline), the record says the histories
were not made alike.
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


def to_restart(counts: dict[str, int | None], slack: int = SLACK) -> list[str]:
    """The roles whose servers answered more than `slack` requests, and more than a tenth of
    their own count, beyond the least used one; none when a count is unknown (nothing is
    judged on a count not read)."""
    if any(c is None for c in counts.values()) or len(counts) < 2:
        return []
    least = min(c for c in counts.values() if c is not None)
    return [role for role, c in counts.items()
            if c is not None and c - least > max(slack, RELATIVE_SLACK * c)]


def make_alike(ctx: StageContext, roles: tuple[str, ...] = ROLES) -> list[str]:
    """Restart the servers whose history is unlike the others' (a role with no server up
    counts 0 requests: it starts fresh). Returns the notes for the stage's record."""
    servers = {role: ctx.engine_if_running(role) for role in roles}
    counts = {role: (0 if server is None else answered(server)) for role, server in servers.items()}
    unknown = [role for role, c in counts.items() if c is None]
    if unknown:
        return [f"server history not compared: how many requests the {' and '.join(unknown)} server(s) had "
                "answered could not be read from /metrics, so the servers were measured as found"]
    busier = to_restart(counts)
    if not busier:
        return []
    said = ", ".join(f"{role} {counts[role]}" for role in roles)
    restarted = [role for role in busier if ctx.retire_engine(role)]
    kept = [role for role in busier if role not in restarted]
    notes = []
    if restarted:
        ctx.progress(f"performance: restarting the {' and '.join(restarted)} server(s) first, so that both are "
                     f"measured from a fresh start (requests answered so far: {said})")
        notes.append(f"server history: requests answered before the load ({said}) were unlike, "
                     f"so the {' and '.join(restarted)} server(s) were restarted and every server measured from "
                     "a fresh start (a server that had answered the quality evaluation alone measured 6% slower "
                     "than an untouched one of the same weights: docs/performance.md)")
    if kept:
        notes.append(f"server history not made alike: the {' and '.join(kept)} server(s) had answered more "
                     f"requests than the others ({said}) and are not this run's to restart (an external "
                     "endpoint or a shared baseline): their figures carry that history")
    return notes
