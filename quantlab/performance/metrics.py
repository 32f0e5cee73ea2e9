"""Latency and throughput arithmetic over per-request records (pure, numpy only).

Definitions (the same as vLLM's own `vllm bench serve`):
  TTFT  time from sending the request to the first streamed token
  ITL   gaps between consecutive streamed tokens of one request
  TPOT  (E2E - TTFT) / (output tokens - 1), per request with more than one token
  E2E   time from sending to the last byte
Percentiles are numpy's linear interpolation. Throughput divides by the wall time of
the measured window (first request sent to last response finished).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 95, 99)
OUTCOMES = ("ok", "error", "timeout")


@dataclass
class RequestRecord:
    """One request as the load generator saw it. Times are seconds."""

    index: int
    outcome: str  # ok | error | timeout
    sent_at: float  # seconds since the point started
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None  # from the server's usage
    output_tokens: int | None = None  # from the server's usage
    requested_output_tokens: int | None = None
    status: int | None = None
    error: str | None = None
    text: str = ""

    @property
    def tpot(self) -> float | None:
        if self.outcome != "ok" or not self.output_tokens or self.output_tokens < 2 or self.ttft is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def as_row(self) -> dict[str, Any]:
        return {"index": self.index, "outcome": self.outcome, "sent_at": round(self.sent_at, 6),
                "ttft": self.ttft, "e2e": self.e2e, "tpot": self.tpot, "itl": [round(x, 6) for x in self.itl],
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "requested_output_tokens": self.requested_output_tokens, "status": self.status,
                "error": self.error, "text": self.text[:200]}


def distribution(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """mean, median, P90, P95, P99 (milliseconds with the default scale); None when empty."""
    if not values:
        return {"mean": None, "median": None, **{f"p{p}": None for p in PERCENTILES[1:]}}
    arr = np.asarray(values, dtype=float) * scale
    out: dict[str, float | None] = {"mean": float(arr.mean())}
    for p, value in zip(PERCENTILES, np.percentile(arr, PERCENTILES), strict=True):
        out["median" if p == 50 else f"p{p}"] = float(value)
    return out


def meets_slo(r: RequestRecord, slo: dict[str, float | None]) -> bool:
    if r.outcome != "ok":
        return False
    checks = {"ttft_ms": r.ttft, "tpot_ms": r.tpot, "e2e_ms": r.e2e}
    for key, limit in slo.items():
        if limit is None:
            continue
        value = checks[key]
        if value is not None and value * 1000.0 > limit:
            return False
    return True


def summarize(records: list[RequestRecord], *, wall_s: float, slo: dict[str, float | None],
              price_per_hour: float | None = None) -> dict[str, Any]:
    """Metrics of one workload point for one server."""
    ok = [r for r in records if r.outcome == "ok"]
    counts = {o: sum(r.outcome == o for r in records) for o in OUTCOMES}
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    good = sum(meets_slo(r, slo) for r in records)
    wall = max(wall_s, 1e-9)
    m: dict[str, Any] = {
        "requests": len(records),
        **{f"{o}_requests": n for o, n in counts.items()},
        "error_rate": (counts["error"] + counts["timeout"]) / len(records) if records else 0.0,
        "wall_s": wall_s,
        "request_throughput": len(ok) / wall,
        "output_tokens_per_s": out_tokens / wall,
        "total_tokens_per_s": (out_tokens + in_tokens) / wall,
        "goodput_requests_per_s": good / wall,
        "slo_attainment": good / len(records) if records else 0.0,
        "output_tokens": out_tokens,
        "prompt_tokens": in_tokens,
        "ttft_ms": distribution([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": distribution([t for r in ok if (t := r.tpot) is not None]),
        "itl_ms": distribution([x for r in ok for x in r.itl]),
        "e2e_ms": distribution([r.e2e for r in ok if r.e2e is not None]),
    }
    m.update(costs(price_per_hour, wall_s=wall, output_tokens=out_tokens, good_requests=good))
    return m


def costs(price_per_hour: float | None, *, wall_s: float, output_tokens: int, good_requests: int) -> dict[str, Any]:
    """Cost of the window's machine time, spread over what it delivered. Failed, timed-out
    and out-of-SLO requests cost machine time but are not answers."""
    if price_per_hour is None:
        return {"cost_per_million_output_tokens": None, "cost_per_successful_request": None}
    spent = price_per_hour * wall_s / 3600.0
    return {
        "cost_per_million_output_tokens": spent / output_tokens * 1e6 if output_tokens else None,
        "cost_per_successful_request": spent / good_requests if good_requests else None,
    }


# Metrics compared candidate / baseline, and which direction is better.
COMPARED = {
    "output_tokens_per_s": "higher",
    "request_throughput": "higher",
    "goodput_requests_per_s": "higher",
    "ttft_ms.median": "lower",
    "ttft_ms.p99": "lower",
    "tpot_ms.median": "lower",
    "tpot_ms.p99": "lower",
    "e2e_ms.p99": "lower",
}


def metric(m: dict[str, Any], dotted: str) -> float | None:
    value: Any = m
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def spread(values: list[float]) -> float | None:
    """Relative run-to-run spread: (max - min) / median; None with fewer than two values."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2:
        return None
    mid = statistics.median(vals)
    return (max(vals) - min(vals)) / mid if mid else None


def compare(baseline_reps: list[dict[str, Any]], candidate_reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Candidate / baseline ratios per compared metric, from repeats measured alternately.

    ratio: median of the per-repeat ratios (repeat i of the candidate against repeat i
    of the baseline, measured next to each other); ratio_min / ratio_max: their range;
    noise: the larger of the two sides' own run-to-run spreads; beyond_noise: whether
    |ratio - 1| exceeds it (None when there are too few repeats to tell)."""
    out = {}
    for key, better in COMPARED.items():
        ratios = []
        for b, c in zip(baseline_reps, candidate_reps, strict=False):
            bv, cv = metric(b, key), metric(c, key)
            if bv and cv is not None:
                ratios.append(cv / bv)
        if not ratios:
            out[key] = {"ratio": None, "better": better}
            continue
        noise_parts = [s for s in (spread([metric(b, key) for b in baseline_reps]),
                                   spread([metric(c, key) for c in candidate_reps])) if s is not None]
        noise = max(noise_parts) if noise_parts else None
        ratio = statistics.median(ratios)
        out[key] = {"ratio": ratio, "ratio_min": min(ratios), "ratio_max": max(ratios), "noise": noise,
                    "beyond_noise": (abs(ratio - 1) > noise) if noise is not None else None, "better": better}
    return out


def median_metrics(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over repeats of every numeric metric (nested dicts kept)."""
    if not reps:
        return {}
    out: dict[str, Any] = {}
    for key, first in reps[0].items():
        if isinstance(first, dict):
            out[key] = median_metrics([r[key] for r in reps])
        elif isinstance(first, (int, float)) or first is None:
            vals = [r[key] for r in reps if isinstance(r.get(key), (int, float))]
            out[key] = statistics.median(vals) if vals else None
        else:
            out[key] = first
    return out
