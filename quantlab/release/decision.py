"""The one place verdicts become a decision: `decide(verdicts, policy)`.

The pipeline (exit code 1 and the run's status), the release stage (run.json and the
manifest), the report (which gates block) and `quantlab verify` (does the manifest's
decision follow from its verdicts) all call it. Three outcomes, never more:
- `blocked`: a gate that counts failed;
- `not_shown`: none failed, but a required gate could not decide (verdict
  "inconclusive": too few samples, an interval that straddles its limit, a value not
  measured). Nothing is released on evidence it does not have;
- `release`: every gate that counts passed, or could not decide and the recipe's
  `release.policy` says `warn` for it (per gate, per check, or for all).
A gate of an optional serve target decides that target only; the primary target's gates
count for every target.

The rule has a version (`RULE_VERSION`), recorded with every decision, so `quantlab
verify` decides a manifest again under the rule it was made with:
- 1 (records without `rule_version`): no gate at all was a release, and a gate warned by
  release.policy released whatever its estimate;
- 2: no gate is never a release (not_shown: nothing shows the candidate is fit), and
  `warn` releases an undecided gate only when its estimate is within its limit: one
  whose point estimate is beyond it (a breach the interval cannot yet show) is held, and
  so is a gate marked not warnable (a task that could not run);
- 3: `warn` releases an undecided gate only when its interval was computed and its
  point estimate is strictly within its limit (GateVerdict.within_limit: a gate with no
  estimate, no interval, or an estimate at the limit itself is held), and never a gate
  marked not warnable (no estimate, too few samples to judge, an errored or unanswered
  critical row, a task the served context dropped); and a warning never stands in for
  every test: with no gate passed, every undecided gate holds (not shown).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from quantlab.core import checks as check_table
from quantlab.core.verdicts import GateVerdict, gate_id, not_shown_rule
from quantlab.recipe.serve import PRIMARY_TARGET

Decision = Literal["release", "blocked", "not_shown"]
RULE_VERSION = 3
RULES = (1, 2, 3)
NotShown = Literal["block", "warn"]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DecisionPolicy(_M):
    """What a decision depends on besides the verdicts."""

    fallback: str = Field("", description="What to serve instead when blocked (recorded, not decided on).")
    targets: dict[str, bool] = Field(default_factory=dict, description="Serve target -> required, when the "
                                     "recipe names serve.targets (the primary target included); empty otherwise.")
    not_shown: NotShown = Field("block", description="A gate that could not decide: block the release (default) "
                                "or only warn.")
    checks: dict[str, NotShown] = Field(default_factory=dict, description="Per check (quality, performance, ...).")
    gates: dict[str, NotShown] = Field(default_factory=dict, description="Per gate, as 'check.gate' or, for one "
                                       "scope, 'check.gate@scope'.")

    @property
    def optional_targets(self) -> frozenset[str]:
        return frozenset(n for n, required in self.targets.items() if not required)

    def required(self, v: GateVerdict) -> bool:
        """Whether this gate, when it cannot decide, holds the release back."""
        return self.requires(v.check, v.gate, v.scope)

    def requires(self, check: str, gate: str, scope: str) -> bool:
        """The same, for a gate named before it has a verdict."""
        return not_shown_rule(check, gate, scope, default=self.not_shown, checks=self.checks,
                              gates=self.gates) == "block"

    def rules(self) -> dict:
        """The not-shown rules, as the manifest records them (so verify can decide again)."""
        return {"not_shown": self.not_shown, "checks": dict(self.checks), "gates": dict(self.gates)}


class DecisionRecord(_M):
    """The run's decision, as run.json's release result and the manifest record it."""

    decision: Decision
    why: str
    failed_gates: list[str] = Field(default_factory=list)
    inconclusive_gates: list[str] = Field(default_factory=list, description="Every gate that could not decide.")
    not_shown_gates: list[str] = Field(default_factory=list, description="Those of them that are required: "
                                       "they make the decision not_shown.")
    fallback: str | None = Field(None, description="What to serve instead when not released.")
    not_shown_policy: dict | None = Field(None, description="release.policy's rules this decision was made "
                                          "under; None: a decision from before quantlab had them (then an "
                                          "undecided gate never held a release back).")
    rule_version: int | None = Field(None, description="The decision rule's version (see release/decision.py); "
                                     "None: rule 1, from before versions were recorded.")
    warned_gates: list[str] = Field(default_factory=list, description="Undecided gates release.policy let "
                                    "through (warned, within their limits).")


class TargetDecision(_M):
    """One serve target's decision."""

    decision: Decision
    required: bool
    why: str
    failed_gates: list[str] = Field(default_factory=list)
    not_shown_gates: list[str] = Field(default_factory=list)


class Decided(BaseModel):
    """decide()'s answer: the run's decision, one per serve target, and the verdicts that block."""

    record: DecisionRecord
    targets: dict[str, TargetDecision]
    blocking: list[GateVerdict]

    @property
    def blocked(self) -> bool:
        """Not released: a gate failed, or a required gate could not decide."""
        return self.record.decision != "release"


def recorded_policy(targets: dict[str, bool], rules: dict | None, *, fallback: str = "") -> DecisionPolicy:
    """The policy a recorded decision (run.json's release result, a manifest) was made
    under. One recorded before quantlab kept its rules never held a release back for an
    undecided gate."""
    return DecisionPolicy(fallback=fallback, targets=targets, **(rules or {"not_shown": "warn"}))


def policy_for(recipe, *, fallback: str = "") -> DecisionPolicy:
    """The policy a recipe sets: which serve targets are required, what a gate that
    cannot decide does (release.policy)."""
    extra = recipe.serve.targets
    rules = recipe.release.policy
    return DecisionPolicy(fallback=fallback,
                          targets={PRIMARY_TARGET: True, **{t.name: t.required for t in extra}} if extra else {},
                          not_shown=rules.not_shown, checks=dict(rules.checks), gates=dict(rules.gates))


def holds(v: GateVerdict, policy: DecisionPolicy, rule: int) -> bool:
    """Whether an undecided gate holds the release back: the policy requires it, or it is
    a gate no policy may warn (rule 2: a task that could not run; rule 3: every gate
    marked so), or (rule 2) its estimate is beyond its limit, (rule 3) it has no interval
    or its estimate is not strictly within its limit."""
    if policy.required(v):
        return True
    if rule >= 3:
        return not (v.warnable and v.within_limit())
    return rule >= 2 and (v.beyond_limit() is True or not v.warnable)


def holding(gates: list[GateVerdict], policy: DecisionPolicy, rule: int) -> list[GateVerdict]:
    """The undecided gates among `gates` that hold the release back. Rule 3: when none of
    `gates` passed, all of them (a warning lets an undecided gate through beside passed
    tests, never in place of every one)."""
    undecided = [v for v in gates if v.verdict == "inconclusive"]
    if rule >= 3 and gates and not any(v.verdict == "pass" for v in gates):
        return undecided
    return [v for v in undecided if holds(v, policy, rule)]


def decide(verdicts: list[GateVerdict], policy: DecisionPolicy, *, rule: int = RULE_VERSION) -> Decided:
    """blocked, not_shown or release; see the module docstring. `rule`: the version to
    decide under (verify passes the one a manifest records)."""
    if rule not in RULES:
        raise ValueError(f"unknown decision rule version {rule} (this quantlab knows {', '.join(map(str, RULES))}): "
                         "a newer quantlab made this decision; verify it with that version")
    optional = policy.optional_targets
    counted = [v for v in verdicts if v.target is None or v.target not in optional]
    failing = [v for v in counted if v.verdict == "fail"]
    undecided = [v for v in counted if v.verdict == "inconclusive"]
    held = holding(counted, policy, rule)
    failed, unsure, unshown = ([gate_id(v) for v in vs] for vs in (failing, undecided, held))
    common = {"failed_gates": failed, "inconclusive_gates": unsure, "not_shown_gates": unshown,
              "not_shown_policy": policy.rules(), "rule_version": rule if rule >= 2 else None,
              "warned_gates": [u for u in unsure if u not in unshown] if rule >= 2 else []}
    if failed:
        why = f"{len(failed)} gate(s) failed" + (f", {len(unshown)} more not shown" if unshown else "")
        why += f": {first_gates(failed, unshown)}"
        record = DecisionRecord(decision="blocked", why=why, fallback=policy.fallback, **common)
    elif unshown:
        why = f"{len(unshown)} required gate(s) could not decide (not shown): {first_gates(unshown)}"
        why += _why_warned_gates_hold(held, counted, policy, rule)
        record = DecisionRecord(decision="not_shown", why=why, fallback=policy.fallback, **common)
    elif not counted and rule >= 2:
        record = DecisionRecord(decision="not_shown", why="no gate was configured: nothing shows the candidate is "
                                "fit to release (add a quality, performance or stability section)",
                                fallback=policy.fallback, **common)
    else:
        warned = [u for u in unsure if u not in unshown]
        passed = sum(v.verdict == "pass" for v in counted)
        why = ("no gate was configured" if not counted else
               f"all {passed} gate(s) passed" if not warned else f"{passed} of {len(counted)} gate(s) passed")
        if warned:
            why += (f"; {len(warned)} not shown, warned by release.policy (no test bounds a wrong release through "
                    f"them): {first_gates(warned)}")
        record = DecisionRecord(decision="release", why=why, **common)
    return Decided(record=record, targets=_per_target(verdicts, policy, rule), blocking=failing + held)


def _why_warned_gates_hold(held: list[GateVerdict], counted: list[GateVerdict], policy: DecisionPolicy,
                           rule: int) -> str:
    """Why gates release.policy warns about hold the release anyway (the not_shown line's tail)."""
    warned = [v for v in held if not policy.required(v)]
    if not warned:
        return ""
    if rule < 3:
        breached = [v for v in warned if v.warnable]
        return f"; {len(breached)} warned but beyond its limit, which no warning releases" if breached else ""
    if not any(v.verdict == "pass" for v in counted):
        return f"; {len(warned)} warned, but no gate passed: a warning never stands in for every test"
    return (f"; {len(warned)} warned but held: a warning releases an undecided gate only with its interval "
            "computed and its estimate strictly within its limit, never a gate marked not warnable (no estimate, "
            "too few samples, a critical row or task that could not be judged)")


def _per_target(verdicts: list[GateVerdict], policy: DecisionPolicy, rule: int) -> dict[str, TargetDecision]:
    """One decision per serve target. The primary target's gates (quality, performance,
    stability: measured there) count for every target; each other target adds its own."""
    out = {}
    for name, req in policy.targets.items():
        own = [v for v in verdicts if v.target is None or (name != PRIMARY_TARGET and v.target == name)]
        failed = [v for v in own if v.verdict == "fail"]
        unshown = holding(own, policy, rule)
        if failed:
            local = [v.evidence for v in failed if v.target == name]
            why = "; ".join(local) if local else f"{len(failed)} gate(s) failed on the primary target"
            out[name] = TargetDecision(decision="blocked", required=req, why=why,
                                       failed_gates=[gate_id(v) for v in failed],
                                       not_shown_gates=[gate_id(v) for v in unshown])
        elif unshown:
            local = [v.evidence for v in unshown if v.target == name]
            why = "; ".join(local) if local else f"{len(unshown)} gate(s) not shown on the primary target"
            out[name] = TargetDecision(decision="not_shown", required=req, why=why,
                                       not_shown_gates=[gate_id(v) for v in unshown])
        elif not own and rule >= 2:
            out[name] = TargetDecision(decision="not_shown", required=req, why="no gate was configured")
        else:
            out[name] = TargetDecision(decision="release", required=req, why=f"all {len(own)} gate(s) passed or "
                                       "warned" if own else "no gate was configured")
    return out


def targets_line(decisions: dict[str, TargetDecision]) -> str:
    """'released for primary, cpu-eager; blocked for gpu (optional): no GPU ...'."""
    released = [n for n, d in decisions.items() if d.decision == "release"]
    parts = [f"released for {', '.join(released)}"] if released else []
    for word, decision in (("blocked", "blocked"), ("not shown", "not_shown")):
        held = [f"{n}{'' if d.required else ' (optional)'}: {d.why}" for n, d in decisions.items()
                if d.decision == decision]
        if held:
            parts.append(f"{word} for {'; '.join(held)}")
    return "; ".join(parts)


FIRST_GATES_CHARS = 80  # the headline names gates up to about this many characters; the report has them all


def importance(gate: str) -> tuple:
    """A gate id's place in a headline: by check (serve's kernel path first, then quality),
    then the pooled gate, the slices, each task or point."""
    check, _, rest = gate.partition(".")
    scope = rest.partition("@")[2]
    order = check_table.names()  # the table's order: serve first (core/checks.py)
    return (order.index(check) if check in order else len(order),
            0 if scope == "pooled" else 1 if scope.startswith("slice:") else 2, gate)


def first_gates(*groups: list[str], chars: int = FIRST_GATES_CHARS) -> str:
    """The most important gate ids that fit in about `chars` (each group by importance, the
    groups in the order given: failed before not shown), and how many more there are."""
    ordered = [g for group in groups for g in sorted(group, key=importance)]
    shown: list[str] = []
    for g in ordered:
        if shown and len(", ".join(shown + [g])) > chars:
            break
        shown.append(g)
    rest = len(ordered) - len(shown)
    return ", ".join(shown) + (f" and {rest} more (all in the report)" if rest else "")
