"""The gates of the extra serve targets (pure): servable, started, answered, and greedy
answers against the primary target's."""

from __future__ import annotations

from typing import Any

from quantlab.core import redact
from quantlab.core.results import TargetOutcome
from quantlab.core.verdicts import GateVerdict
from quantlab.serving import gates as serve_gates

CHECK = "targets"


def registered(recipe: Any) -> list[dict[str, Any]]:
    """The targets check's section as registered before any engine (release/registration.py):
    every extra serve target, its secrets redacted."""
    return [redact.serve_section(t.model_dump(mode="json")) for t in recipe.serve.targets]


def _verdict(name: str, gate: str, ok: bool | None, value, limit: float, detail: str) -> GateVerdict:
    verdict = "inconclusive" if ok is None else "pass" if ok else "fail"
    return GateVerdict(check=CHECK, gate=gate, scope=name, target=name, verdict=verdict, value=value, limit=limit,
                       evidence=detail, test="threshold")


def verdicts(outcome: TargetOutcome, target) -> list[GateVerdict]:
    """The target's own gates (pure): servable, started, answered, mismatch vs primary, and
    the candidate's kernel path there (serve.kernel_path@<name>, deciding this target only)."""
    n = outcome.name
    if outcome.status == "unservable":
        return [_verdict(n, "servable", False, None, 1, f"cannot serve this checkpoint: {outcome.reason}")]
    if outcome.status == "not_started":
        return [_verdict(n, "started", False, None, 1, f"the server did not start: {outcome.reason}")]
    out = serve_gates.verdicts(outcome.kernel_path, scope=n, target=n)
    errors = sum(outcome.errors.values())
    out.append(_verdict(n, "max_request_errors", errors == 0, errors, 0, f"greedy requests that failed on {n}: "
                        + ", ".join(f"{role} {count}" for role, count in outcome.errors.items())))
    cand, base = outcome.cross_mismatch_rate.get("candidate"), outcome.cross_mismatch_rate.get("baseline")
    if target.max_mismatch_excess is not None:
        if cand is None or base is None:
            out.append(_verdict(n, "max_mismatch_excess", None, None, target.max_mismatch_excess,
                                "needs the candidate and the baseline served on this target and on the primary"))
        else:
            out.append(_verdict(n, "max_mismatch_excess", cand - base <= target.max_mismatch_excess, cand - base,
                                target.max_mismatch_excess,
                                f"greedy answers differing from the primary target: candidate {cand:.1%}, baseline "
                                f"{base:.1%} (excess {cand - base:+.1%}, needs <= {target.max_mismatch_excess:.1%})"))
    if target.max_mismatch is not None:
        ok = None if cand is None else cand <= target.max_mismatch
        out.append(_verdict(n, "max_mismatch", ok, cand, target.max_mismatch,
                            "no candidate answer to compare" if cand is None else
                            f"candidate greedy answers differing from the primary target: {cand:.1%} "
                            f"(needs <= {target.max_mismatch:.1%})"))
    return out
