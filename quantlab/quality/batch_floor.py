"""The batch noise floor, kept in the cache: how often the same model's pass/fail answer
changes between concurrency 1 and a load point (its requests batched with others), measured
on each role by the load_quality check. It is what two servers of the same weights disagree
on here, so the quality gates' reports state it and the planner uses it as its discordance
instead of an assumed one (planner_discordance).

Keyed like the performance noise store (performance/noise_store.py) by what makes two flip
rates comparable: the host's hardware (core/cpu_emulation.cache_hardware), the engine's
version, the device, the engine args (redacted) and the model's weights digest
(`model_parts`); one folder per key, `<cache>/batch-floor/<key>/`. Each contribution is one
file there, written once and never rewritten, named by the point (c<N> or r<rate>), the role
and the run id: flips k over n shared documents. A point's floor pools every contribution
(sum k over sum n) with its Clopper-Pearson interval.

Each file carries an HMAC under this user's cache secret (core/cache_secret) over the store's
kind, the key, the file's name and its body: one written or edited by someone without the
secret is skipped with a CacheEntryWarning, never pooled.

Plain arguments only (no run context), so the quality planner can read it as the stage writes it.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quantlab.core import cpu_emulation, redact, result_cache, signed_entries
from quantlab.core.signed_entries import safe_name
from quantlab.core.run import now_iso

KIND = "batch-floor"  # the cache folder
FORMAT = 1
POINT = re.compile(r"^(c[1-9][0-9]*|r[0-9][0-9.e+-]*)$")


@dataclass(frozen=True)
class FlipRate:
    """k flips over n documents answered at both levels, and the rate's Clopper-Pearson
    interval at `confidence` (rate, low and high None when n is 0)."""

    k: int
    n: int
    rate: float | None
    low: float | None
    high: float | None
    confidence: float = 0.95

    @classmethod
    def of(cls, k: int, n: int, confidence: float = 0.95) -> FlipRate:
        if n == 0:
            return cls(0, 0, None, None, None, confidence)
        low, high = clopper_pearson(k, n, confidence)
        return cls(k, n, k / n, low, high, confidence)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        if self.rate is None:
            return "no document answered at both levels"
        return (f"{self.rate:.1%} ({self.k} of {self.n} documents; {self.confidence:.0%} CI "
                f"{self.low:.1%} .. {self.high:.1%})")


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval of a binomial proportion k / n."""
    from scipy.stats import beta

    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1; got k {k}, n {n}")
    alpha = 1 - confidence
    low = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return low, high


def model_parts(probe: dict[str, Any], device: str, weights: Any, engine_args: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """The store's key parts for one model on this host: `probe` the serving probe (its cpu,
    gpus and versions), `weights` the model's weights digest (file -> sha256)."""
    return {"format": FORMAT, "hardware": cpu_emulation.cache_hardware(probe),
            "engine": (probe.get("versions") or {}).get("vllm"), "device": device,
            "engine_args": redact.engine_args(engine_args),  # written into the store: no secret
            "weights": json.loads(json.dumps(weights, sort_keys=True, default=str))}


def point_label(concurrency: int | None = None, rate: float | None = None) -> str:
    """'c8' (8 in flight) or 'r2.5' (Poisson, per second): how the store names a point."""
    if (concurrency is None) == (rate is None):
        raise ValueError("a point is a concurrency or a rate, exactly one of them")
    return f"c{concurrency}" if concurrency is not None else f"r{rate:g}"


def key_of(parts: dict[str, Any]) -> str:
    return result_cache.cache_key(parts)


def store_root() -> Path:
    return result_cache.cache_root(KIND)


def record(parts: dict[str, Any], point: str, *, run_id: str, role: str, k: int, n: int,
           tasks: list[str] | None = None) -> Path | None:
    """Store one run's flips for one role at one point (k of n documents answered at both
    concurrency 1 and the point); None when n is 0 or this run already stored that role
    and point here (one file each, never rewritten)."""
    if not POINT.match(point):
        raise ValueError(f"point {point!r} is not 'c<N>' or 'r<rate>' (point_label makes one)")
    if not 0 <= k <= n:
        raise ValueError(f"flips k ({k}) must be within 0 .. n ({n})")
    if n == 0:
        return None
    body = {"format": FORMAT, "point": point, "role": role, "run": run_id, "k": int(k), "n": int(n),
            "tasks": sorted(tasks) if tasks else None, "date": now_iso(),
            "parts": json.loads(json.dumps(parts, default=str))}
    return signed_entries.write_once(KIND, key_of(parts), f"{point}-{safe_name(role)}-{safe_name(run_id)}.json",
                                     body)


def contributions(parts: dict[str, Any], point: str | None = None, *, exclude_run: str | None = None
                  ) -> list[dict[str, Any]]:
    """The authenticated contributions for this model (at one point; None: every point),
    oldest first; one that does not authenticate is skipped with a warning."""
    out = [body for body in signed_entries.read_all(KIND, key_of(parts), what="batch noise floor",
                                                    remedy="the load_quality check stores new ones")
           if _usable(body) and body["run"] != exclude_run and point in (None, body["point"])]
    return sorted(out, key=lambda b: (str(b.get("date")), str(b["run"]), b["point"], str(b.get("role"))))


def _usable(body: dict[str, Any]) -> bool:
    counts_ok = all(isinstance(body.get(f), int) for f in ("k", "n")) and 0 <= body["k"] <= body["n"]
    return body.get("format") == FORMAT and counts_ok and isinstance(body.get("point"), str) and "run" in body


def floor_for(parts: dict[str, Any], point: str | None = None, *, exclude_run: str | None = None,
              confidence: float = 0.95) -> FlipRate | None:
    """The pooled flip rate of this model at one point (None: at every point stored): sum k
    over sum n of its contributions; None when the store holds none."""
    found = contributions(parts, point, exclude_run=exclude_run)
    n = sum(b["n"] for b in found)
    if not n:
        return None
    return FlipRate.of(sum(b["k"] for b in found), n, confidence)


def planner_discordance(parts: dict[str, Any], point: str | None = None, *, exclude_run: str | None = None
                        ) -> float | None:
    """The discordance the planner should assume for this model here: the pooled flip rate's
    upper 95% bound (two-sided interval's), None when nothing is stored."""
    found = floor_for(parts, point, exclude_run=exclude_run, confidence=0.95)
    return None if found is None else found.high
