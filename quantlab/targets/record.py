"""What the release records of the serve targets check (pure): its summary in the manifest
(core/checks.py names it)."""

from __future__ import annotations

from typing import Any

from quantlab.core.results import TargetsResult


def summary(extra: TargetsResult) -> dict[str, Any]:
    """The manifest's summary of the targets result (the run record holds all of it)."""
    return {"primary": extra.primary, "prompts": extra.prompts, "max_tokens": extra.max_tokens,
            "targets": {n: {"status": o.status, "reason": o.reason,
                            "batch_mismatch_rate": o.batch_mismatch_rate,
                            "cross_mismatch_rate": o.cross_mismatch_rate,
                            "compared": o.compared, "errors": o.errors}
                        for n, o in extra.targets.items()}}
