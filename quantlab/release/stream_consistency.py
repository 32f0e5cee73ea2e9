"""A manifest's stream entry against the rule (pure): the level its gates were judged at,
re-derived from the history it records (recipe/stream.rederive), and the gates' own
pass-side alphas held to that level.

A manifest of quantlab 0.3.0 or later must carry a `stream` entry (controlled, turned off
by the user, no quality check, or a family's candidate): one without it had its place in
the stream removed. A 0.2.0 manifest has none (the format before streams): nothing to
re-derive, as rule_history accepts it. What this
cannot catch is a history edited together with the level by whoever holds the signing
key: the register in the cache is the history's witness, not the manifest.
"""

from __future__ import annotations

from typing import Any

from quantlab.recipe.stream import CONTROLLED, NO_STREAM, rederive
from quantlab.release.rule_history import STREAM_VERSIONS

SLACK = 2e-6  # the ledger rounds each check's pass alpha to 6 decimals


def stream_problems(manifest: Any) -> list[str]:
    budget = manifest.error_budget if isinstance(manifest.error_budget, dict) else {}
    if "stream" not in budget:
        version = str((getattr(manifest, "quantlab", None) or {}).get("version"))
        if version in STREAM_VERSIONS:
            return [f"error_budget.stream: missing, and quantlab {version} records every release's place in its "
                    "baseline's stream: the entry was removed from what was signed"]
        return []
    entry = budget["stream"]
    share, problems = rederive(entry)
    problems = [f"error_budget.stream: {p}" for p in problems]
    if isinstance(entry, dict) and entry.get("control") == NO_STREAM and \
            any(getattr(g, "check", None) == "quality" for g in manifest.gates or []):
        problems.append("error_budget.stream: the run is recorded as in no stream (no quality check), yet the "
                        "manifest has quality verdicts: a quality check shares the baseline's answers and is a "
                        "decision of their stream")
    if share is None or not isinstance(entry, dict) or entry.get("control") != CONTROLLED:
        return problems
    level = entry.get("level")
    family = budget.get("family") if isinstance(budget.get("family"), dict) else {}
    size = family.get("size") if isinstance(family.get("size"), int) and family.get("size") > 0 else 1
    checks = budget.get("checks") if isinstance(budget.get("checks"), dict) else {}
    judged = [c.get("pass_alpha") for c in checks.values() if isinstance(c, dict)]
    judged = [a for a in judged if isinstance(a, (int, float))]
    if isinstance(level, (int, float)) and judged and max(judged) > level / size + SLACK:
        problems.append(f"error_budget.stream: its gates were judged at a pass-side alpha up to {max(judged):.6g}, "
                        f"above the stream's level {level:.6g}" + (f" over a family of {size}" if size > 1 else "")
                        + ": the level the manifest records is not the one its gates were judged at")
    return problems


CLAIMED = ("key", "position", "share")  # what the registered claim and the manifest's entry must agree on


def claim_problems(manifest: Any, statement: Any) -> list[str]:
    """The manifest's stream entry against the claim registered before any engine started
    (release/registration.stream_claim): a position or level changed after the registration
    is not the one the run was placed at. A statement without a claim (quantlab before the
    claim was registered) has nothing to hold the entry to."""
    claim = statement.get("stream") if isinstance(statement, dict) else None
    budget = manifest.error_budget if isinstance(manifest.error_budget, dict) else {}
    entry = budget.get("stream")
    if not isinstance(claim, dict) or not isinstance(entry, dict):
        return []
    if claim.get("control") != entry.get("control"):
        return [f"error_budget.stream: control '{entry.get('control')}', but the registration claimed "
                f"'{claim.get('control')}' before any engine started"]
    if claim.get("control") != CONTROLLED:
        return []
    return [f"error_budget.stream: {field} {entry.get(field)!r}, but the registration claimed {claim.get(field)!r} "
            "before any engine started" for field in CLAIMED
            if not _same(entry.get(field), claim.get(field))]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= 1e-9
    return a == b
