"""Which decision rules each quantlab version decided under, and what a manifest's own
fields say about the rule it can have been made with (pure).

A signer can write any `rule_version` into a manifest; rule 1 released a run with no gate
at all. So `verify` holds the recorded rule to the quantlab that recorded it: a rule that
version never decided under, or a version this table does not know, is a problem. The
history (git log of release/decision.py and core/version.py): quantlab 0.1.0 spans rule 1,
rule 2 (with the error budget, the manifest's `error_budget`, which records the rule, and
the first recorded `rule_version`), registrations (which record the rule they were
registered under) and rule 3. So a 0.1.0 manifest may lawfully lack a registration and an
error budget, and then nothing holds it to a registered gate set: a key holder who wants
rule 1 (a release with no gate at all) writes one. quantlab 0.2.0 is the format where every
release carries a registration and an error budget under rule 3; a manifest claiming an
older version is refused unless the verifier says it trusts that history
(`quantlab verify --allow-legacy`). From 0.3.0 the error budget also records the run's
place in its baseline's stream (a `stream` entry), which verify then requires. A new rule ships in a new quantlab version with a row of
its own (tests/unit/release/test_verify_holds_the_signer.py holds the current version's row
to decision.RULE_VERSION).
"""

from __future__ import annotations

from typing import Any

from quantlab.core.version import __version__

# quantlab version -> the decision rules a release made by it can have been decided under (rule 1, no
# rule_version recorded, before commit 43cea77; rule 2 from 43cea77; rule 3 from f9478a1).
# From 0.2.0 every release is decided under rule 3 and carries a registration and an error budget.
# A new rule comes with a new version and a row here (a unit test holds this version's row to RULE_VERSION).
RULES_BY_VERSION: dict[str, tuple[int, ...]] = {"0.1.0": (1, 2, 3), "0.2.0": (3,), "0.3.0": (3,)}
# versions whose error budget records the run's place in its baseline's stream (release/stream_consistency.py)
STREAM_VERSIONS = frozenset({"0.3.0"})
# versions whose releases may lack a registration and an error budget: verified only with --allow-legacy
LEGACY_VERSIONS = frozenset({"0.1.0"})
FIRST_RECORDED_RULE = 2  # the first rule a manifest records as `rule_version` (rule 1: none recorded)


def recorded_rule(decision_rule: int | None) -> int:
    """The rule a manifest's decision claims (none recorded: rule 1)."""
    return decision_rule or 1


def rule_problems(manifest: Any, registered_rule: Any = None, *, allow_legacy: bool = False) -> list[str]:
    """Problems with the rule a manifest (release.manifest.Manifest) claims: unknown to the
    quantlab version it records, or at odds with what its error budget and its registration
    statement (`registered_rule`: the statement's gates.rule_version; None: no statement)
    record; a legacy version unless `allow_legacy`; a newer one without the registration and
    error budget every release of it carries."""
    rule = recorded_rule(manifest.decision.rule_version)
    version = (manifest.quantlab or {}).get("version")
    problems = []
    known = RULES_BY_VERSION.get(str(version))
    if known is None:
        problems.append(f"the manifest records quantlab {version!r}, a version this verifier (quantlab "
                        f"{__version__}) does not know ({', '.join(sorted(RULES_BY_VERSION))}): verify it with the "
                        "quantlab that made it, or it is not a manifest quantlab wrote")
    elif rule not in known:
        problems.append(f"decision rule {rule} is not one quantlab {version} decided under "
                        f"({', '.join(map(str, known))}): the manifest claims a rule its own quantlab never had")
    if known is not None:
        problems += _record_problems(manifest, str(version), allow_legacy)
    budget = manifest.error_budget
    if budget is not None:
        said = budget.get("rule_version") if isinstance(budget, dict) else None
        if manifest.decision.rule_version is None:
            problems.append(f"the manifest carries an error budget, which only a quantlab recording its decision "
                            f"rule writes (rule {FIRST_RECORDED_RULE} on), yet claims rule 1 (no rule_version): "
                            "rule 1 released a run with no gate at all")
        elif said != rule:
            problems.append(f"the decision claims rule {rule}, its error budget records rule {said}")
    if registered_rule is not None and registered_rule != rule:
        problems.append(f"the decision claims rule {rule}, but the gate set was registered under rule "
                        f"{registered_rule} before any engine started")
    return problems


def _record_problems(manifest: Any, version: str, allow_legacy: bool) -> list[str]:
    """A legacy manifest refused unless allowed; a newer one without the records its quantlab always writes."""
    if version in LEGACY_VERSIONS:
        if allow_legacy:
            return []
        return [f"the manifest records quantlab {version}, whose releases may lack a registration and an error "
                "budget (then nothing holds its gates to a registered set, and its rule 1 released a run with no "
                f"gate at all), so anyone holding the key can pose as one; a release made now records quantlab "
                f"{__version__}. Pass --allow-legacy only if you trust that this release was made by quantlab "
                f"{version}"]
    return [f"the manifest records quantlab {version}, which writes {what} into every release, but it has none "
            f"('{name}' is null): a record removed after the run, or not a manifest quantlab wrote"
            for name, what in (("registration", "the registration"), ("error_budget", "an error budget"))
            if getattr(manifest, name) is None]


def legacy_note(manifest: Any) -> str | None:
    """What verify says of a legacy manifest accepted by --allow-legacy (None: not one)."""
    version = str((manifest.quantlab or {}).get("version"))
    if version not in LEGACY_VERSIONS:
        return None
    return (f"made by quantlab {version}, accepted by --allow-legacy: "
            + ("its gates are held to its registration" if manifest.registration is not None else
               "it carries no registration, so nothing holds its gates to a registered set"))
