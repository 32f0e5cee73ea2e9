"""The one verdict model every gate returns, and the helpers that gather verdicts from a
run's results. Pure: turning verdicts into a decision is quantlab.release.decision's job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

Verdict = Literal["pass", "fail", "inconclusive"]
AT_LIMIT = 1e-9  # an estimate this close to its limit (relative) is at it, not within: floats round
# how a gate's figure meets its limit: at_most (value <= limit), at_least (value >= limit),
# non_inferior (the candidate - baseline difference's interval above -margin = limit)
Comparator = Literal["at_most", "at_least", "non_inferior"]


class GateVerdict(BaseModel):
    """One gate at one scope (a task, a slice, a workload point, a probe, a target), with
    the numbers behind it. Every check's gates return this model, from one function named
    `verdicts` in the check's `gates` module. `check` names the check (quality, performance,
    stability, targets) and `evidence` says what was compared, over which samples, and why
    the verdict is what it is. Records written before these names (`stage`, `detail`) are
    read as they are."""

    model_config = ConfigDict(extra="forbid")

    check: str = Field(validation_alias=AliasChoices("check", "stage"))
    gate: str
    scope: str
    verdict: Verdict
    value: float | None
    limit: float
    evidence: str = Field(validation_alias=AliasChoices("evidence", "detail"))
    samples: int | None = Field(None, description="Paired samples behind a quality verdict.")
    samples_to_verdict: int | None = Field(None, description="Quality: the prefix from which a pass/fail held, "
                                           "or (inconclusive) about how many samples would tell.")
    target: str | None = Field(None, description="The serve target (serve.targets[].name) this verdict is about; "
                               "None: the primary target, which every target's decision includes.")
    # The test behind the verdict, as fields (None in records written before they existed)
    metric: str | None = Field(None, description="The figure judged (a task's metric, a load figure, a probe's rate).")
    comparator: Comparator | None = Field(None, description="How the figure meets the limit.")
    margin: float | None = Field(None, description="non_inferior: the largest worsening allowed, in the metric's "
                                 "units (limit = -margin).")
    confidence: float | None = Field(None, description="Two-sided confidence of the pass side's interval.")
    fail_confidence: float | None = Field(None, description="Confidence of the fail side's interval (adjusted for "
                                          "the family of gates and looks).")
    estimate: float | None = Field(None, description="The point estimate the limit is compared with (non_inferior: "
                                   "candidate - baseline, positive = candidate better).")
    low: float | None = Field(None, description="The estimate's interval at `confidence`, lower end.")
    high: float | None = Field(None, description="The estimate's interval at `confidence`, upper end.")
    test: str | None = Field(None, description="The interval or test used (tango-score, bca-bootstrap, "
                             "hierarchical-bootstrap, count, threshold).")
    warnable: bool = Field(True, description="false: release.policy cannot make this gate only warn when it "
                           "cannot decide (nothing measured, fewer samples than min_samples, a critical row not "
                           "judged, a task that could not run: the evidence says how to fix it).")

    def beyond_limit(self) -> bool | None:
        """Whether the point estimate is on the wrong side of the limit (a breach the
        interval could not yet show); None where the record does not say."""
        if self.comparator == "non_inferior":
            return None if self.estimate is None or self.margin is None else self.estimate < -self.margin
        if self.comparator is None or self.value is None:
            return None
        return self.value > self.limit if self.comparator == "at_most" else self.value < self.limit

    def within_limit(self) -> bool:
        """Whether the gate has an interval and its point estimate is strictly within its
        limit: what an undecided gate needs before a `warn` may release it (decision rule
        3). No interval, no estimate, or an estimate at the limit itself (to rounding: 0.45
        - 0.5 is a drop of exactly 0.05): False."""
        if self.low is None or self.high is None or self.estimate is None:
            return False
        if self.comparator == "non_inferior":
            if self.margin is None:
                return False
            return self.estimate > -self.margin + AT_LIMIT * max(1.0, self.margin)
        at = AT_LIMIT * max(1.0, abs(self.limit))
        if self.comparator == "at_most":
            return self.estimate < self.limit - at
        if self.comparator == "at_least":
            return self.estimate > self.limit + at
        return False


def not_shown_rule(check: str, gate: str, scope: str, *, default: str, checks: dict[str, str],
                   gates: dict[str, str]) -> str:
    """What release.policy says a gate that cannot decide does ('block' or 'warn'): the
    rule for 'check.gate@scope', else 'check.gate', else the check's, else the default.
    One lookup for the decision and for the planner, which asks before any verdict."""
    return gates.get(f"{check}.{gate}@{scope}") or gates.get(f"{check}.{gate}") or checks.get(check) or default


@dataclass(frozen=True)
class Want:
    """One field a gate must have by the gate set registered before the run
    (release/registered_gates.py; a check's `verify` hook in core/checks.py returns them):
    its value, and how it is compared."""

    field: str
    value: Any
    where: str  # the registered field it comes from
    how: str = "equal"  # equal, at_least (a sequential look's confidence), one_of


def gate_id(v: GateVerdict) -> str:
    """'quality.non_inferiority@arc_easy_mini': how decisions and manifests name a verdict."""
    return f"{v.check}.{v.gate}@{v.scope}"


def all_verdicts(results: dict[str, Any]) -> list[GateVerdict]:
    """Every gate verdict held by the stage results of a run record."""
    out: list[GateVerdict] = []
    for result in results.values():
        out += getattr(result, "gates", None) or []
    return out


# scopes renamed since records and recipes named them: (old prefix, new prefix)
RENAMED_SCOPES = (("traffic_traffic_", "traffic_"),)  # traffic.jsonl's tasks, once doubled


def current_name(name: str) -> str:
    """A gate id, scope or task name as quantlab names it now (old names map to new)."""
    head, at, scope = name.rpartition("@") if "@" in name else ("", "", name)
    for old, new in RENAMED_SCOPES:
        if scope.startswith(old):
            scope = new + scope[len(old):]
    return f"{head}{at}{scope}"


class OldNameWarning(UserWarning):
    """A recipe names a gate, scope or task by a name quantlab has since changed."""


def renamed(name: str, where: str) -> str:
    """current_name(name), with a warning naming the recipe field when it changed."""
    import warnings

    new = current_name(name)
    if new != name:
        warnings.warn(f"{where}: '{name}' is an old name, read as '{new}'; rename it in the recipe",
                      OldNameWarning, stacklevel=3)
    return new
