"""The one verdict model every gate returns, and the helpers that gather verdicts from a
run's results. Pure: turning verdicts into a decision is quantlab.release.decision's job."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Verdict = Literal["pass", "fail", "inconclusive"]


class GateVerdict(BaseModel):
    """One gate at one scope (a task, a slice, a workload point, a probe, a target), with
    the numbers behind it. Every check's gates return this model, from one function named
    `verdicts` in the check's `gates` module. `stage` names the check and `detail` is the
    evidence (what was compared, over which samples); the names stay as run records and
    manifests already hold them."""

    model_config = ConfigDict(extra="forbid")


    stage: str
    gate: str
    scope: str
    verdict: Verdict
    value: float | None
    limit: float
    detail: str
    samples: int | None = Field(None, description="Paired samples behind a quality verdict.")
    samples_to_verdict: int | None = Field(None, description="Quality: the prefix from which a pass/fail held, "
                                           "or (inconclusive) about how many samples would tell.")
    target: str | None = Field(None, description="The serve target (serve.targets[].name) this verdict is about; "
                               "None: the primary target, which every target's decision includes.")


def gate_id(v: GateVerdict) -> str:
    """'quality.non_inferiority@arc_easy_mini': how decisions and manifests name a verdict."""
    return f"{v.stage}.{v.gate}@{v.scope}"


def all_verdicts(results: dict[str, Any]) -> list[GateVerdict]:
    """Every gate verdict held by the stage results of a run record."""
    out: list[GateVerdict] = []
    for result in results.values():
        out += getattr(result, "gates", None) or []
    return out
