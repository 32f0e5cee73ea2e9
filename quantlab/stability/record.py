"""What the release records of the stability check (pure): its summary in the manifest
(core/checks.py names it)."""

from __future__ import annotations

from typing import Any

from quantlab.core.results import StabilityResult


def summary(stab: StabilityResult) -> dict[str, Any]:
    """The manifest's summary of the stability result (the run record holds all of it)."""
    return {"fallback": stab.fallback, "fallback_rate": stab.fallback_rate, "max_model_len": stab.max_model_len,
            "roles": {role: _role(r) for role, r in stab.roles.items()}}


def _role(r: dict[str, Any]) -> dict[str, Any]:
    return {"batch_mismatch_rate": (r.get("batch") or {}).get("mismatch_rate"),
            "length_failures": (r.get("lengths") or {}).get("failures"),
            "greedy_mismatch_rate": ((r.get("determinism") or {}).get("greedy") or {}).get("mismatch_rate"),
            "bad_request_server_errors": (r.get("bad_requests") or {}).get("server_errors"),
            "soak_error_rate": (r.get("soak") or {}).get("error_rate"),
            "soak_rss_growth_mb": (r.get("soak") or {}).get("rss_growth_mb")}
