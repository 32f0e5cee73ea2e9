"""The one place verdicts become a decision: `decide(verdicts, policy)`.

The pipeline (exit code 1 and the run's status), the release stage (run.json and the
manifest), the report (which failures block) and `quantlab verify` (does the manifest's
decision follow from its verdicts) all call it. Rule: release when no gate that counts
failed; inconclusive gates are listed but do not block. A gate of an optional serve
target decides that target only; the primary target's gates count for every target.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from quantlab.serving.spec import PRIMARY_TARGET
from quantlab.core.verdicts import GateVerdict, gate_id

Decision = Literal["release", "blocked"]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DecisionPolicy(_M):
    """What a decision depends on besides the verdicts."""

    fallback: str = Field("", description="What to serve instead when blocked (recorded, not decided on).")
    targets: dict[str, bool] = Field(default_factory=dict, description="Serve target -> required, when the "
                                     "recipe names serve.targets (the primary target included); empty otherwise.")

    @property
    def optional_targets(self) -> frozenset[str]:
        return frozenset(n for n, required in self.targets.items() if not required)


class DecisionRecord(_M):
    """The run's decision, as run.json's release result and the manifest record it."""

    decision: Decision
    why: str
    failed_gates: list[str] = Field(default_factory=list)
    inconclusive_gates: list[str] = Field(default_factory=list)
    fallback: str | None = Field(None, description="What to serve instead when blocked.")


class TargetDecision(_M):
    """One serve target's decision."""

    decision: Decision
    required: bool
    why: str
    failed_gates: list[str] = Field(default_factory=list)


class Decided(BaseModel):
    """decide()'s answer: the run's decision, one per serve target, and the verdicts that block."""

    record: DecisionRecord
    targets: dict[str, TargetDecision]
    blocking: list[GateVerdict]

    @property
    def blocked(self) -> bool:
        return self.record.decision == "blocked"


def policy_for(recipe, *, fallback: str = "") -> DecisionPolicy:
    """The policy a recipe sets: which serve targets are required."""
    extra = recipe.serve.targets
    return DecisionPolicy(fallback=fallback,
                          targets={PRIMARY_TARGET: True, **{t.name: t.required for t in extra}} if extra else {})


def decide(verdicts: list[GateVerdict], policy: DecisionPolicy) -> Decided:
    """Release when no counting gate failed; see the module docstring."""
    optional = policy.optional_targets
    counted = [v for v in verdicts if v.target is None or v.target not in optional]
    blocking = [v for v in counted if v.verdict == "fail"]
    failed = [gate_id(v) for v in blocking]
    unsure = [gate_id(v) for v in counted if v.verdict == "inconclusive"]
    if failed:
        record = DecisionRecord(decision="blocked", why=f"{len(failed)} gate(s) failed: {', '.join(failed)}",
                                failed_gates=failed, inconclusive_gates=unsure, fallback=policy.fallback)
    else:
        why = f"all {len(counted)} gate(s) passed" if counted else "no gate was configured"
        if unsure:
            why += f"; {len(unsure)} inconclusive (not blocking): {', '.join(unsure)}"
        record = DecisionRecord(decision="release", why=why, inconclusive_gates=unsure)
    return Decided(record=record, targets=_per_target(verdicts, policy.targets), blocking=blocking)


def _per_target(verdicts: list[GateVerdict], required: dict[str, bool]) -> dict[str, TargetDecision]:
    """One decision per serve target. The primary target's gates (quality, performance,
    stability: measured there) count for every target; each other target adds its own."""
    out = {}
    for name, req in required.items():
        own = [v for v in verdicts if v.target is None or (name != PRIMARY_TARGET and v.target == name)]
        failed = [v for v in own if v.verdict == "fail"]
        if failed:
            local = [v.detail for v in failed if v.target == name]
            why = "; ".join(local) if local else f"{len(failed)} gate(s) failed on the primary target"
            out[name] = TargetDecision(decision="blocked", required=req, why=why,
                                       failed_gates=[gate_id(v) for v in failed])
        else:
            out[name] = TargetDecision(decision="release", required=req, why=f"all {len(own)} gate(s) passed or "
                                       "inconclusive" if own else "no gate was configured")
    return out


def targets_line(decisions: dict[str, TargetDecision]) -> str:
    """'released for primary, cpu-eager; blocked for gpu (optional): no GPU ...'."""
    released = [n for n, d in decisions.items() if d.decision == "release"]
    blocked = [f"{n}{'' if d.required else ' (optional)'}: {d.why}" for n, d in decisions.items()
               if d.decision == "blocked"]
    parts = ([f"released for {', '.join(released)}"] if released else []) + \
        ([f"blocked for {'; '.join(blocked)}"] if blocked else [])
    return "; ".join(parts)
