"""The run's error budget (pure): how its chance of a wrong decision was spent, as one
ledger the manifest records (`error_budget`).

Two errors, two rules:
- a false block (an unchanged model blocked): one failing gate blocks, so the fail sides
  of a check share its alpha (Bonferroni over its gates, points and looks); over the
  run the checks' alphas add up (a union bound) for the gates judged on an interval;
- a false release (a model worse than a margin released): a release needs every
  required gate to pass (an intersection-union test), so each pass side keeps its own
  alpha and the run's is the largest of them. A gate that did not pass but was
  released by release.policy's `warn` carries no test at all: the run's false-release
  bound is then 1.0, and the ledger names those gates (`warned_gates`) and says why.
Fixed thresholds (stability, KL, a critical row, a count, the serve kernel path) are not
judged on an interval: they are listed, spending no alpha, each with the false-block rate
A/A runs measured for it where there is one (release/threshold_rates.py), or why not.
Several candidates judged on the same items (a comparison, a search) are one family
(recipe/family.py): each candidate's alphas above are already divided by its size, and
the `family` entry says so, with the family's bounds (the size times the candidate's).
Every decision against the same baseline answers is one stream (recipe/stream.py): the
`stream` entry records its position, its level and the history it was derived from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from quantlab.core import checks as check_table
from quantlab.release.check_hooks import hook
from quantlab.release.threshold_rates import measured_for
from quantlab.core.verdicts import GateVerdict, gate_id

LEDGER_VERSION = 3  # 2: a release through warned gates bounds nothing (1.0), and names them;
#                    3: each fixed threshold with its measured A/A false-block rate, or why none
INTERVAL_TESTS = ("tango-score", "bca-bootstrap", "hierarchical-bootstrap")
FIXED_TESTS = ("threshold", "count")


def ledger(verdicts: list[GateVerdict], *, rule_version: int, family: Any = None,
           judged_on_these_items: int | None = None, warned: Sequence[str] = (), stream: Any = None,
           stream_alpha: float | None = None, **sections: Any) -> dict[str, Any]:
    """The ledger of one run: per check its tests, looks and alphas (each check's `budget`
    hook in core/checks.py, given its recipe section: `quality=`, `performance=`); then the
    run's (and its family's, when it was judged among several candidates: a recipe.family.Family).
    `warned`: the gate ids a release let through undecided (the decision's warned_gates
    when it released; none otherwise). `stream`: its place among the decisions against the
    same baseline answers (a recipe.stream.StreamDecision), `stream_alpha` the recipe's own
    false-release alpha it takes its share of."""
    checks: dict[str, Any] = {}
    for check in check_table.CHECKS:
        judged = [v for v in verdicts if v.check == check.name and v.test in INTERVAL_TESTS]
        if check.budget and judged:
            checks[check.name] = hook(check.budget)(judged, sections.get(check.name))
    fixed_verdicts = [v for v in verdicts if v.test in FIXED_TESTS]
    measured, not_measured = measured_for(fixed_verdicts)
    out = {
        "ledger_version": LEDGER_VERSION,
        "rule_version": rule_version,
        "checks": checks,
        "fixed_thresholds": {
            "gates": sorted(gate_id(v) for v in fixed_verdicts),
            "false_block_rate": "not controlled by an interval; measured on A/A runs where listed (upper_bound: "
                                "one-sided Clopper-Pearson per run, on the host kind named), spending no alpha",
            "measured": measured, "not_measured": not_measured},
        "run": {
            "false_block_bound": round(sum(c["fail_alpha_family"] for c in checks.values()), 6),
            "false_block_rule": "union bound over the checks' fail sides (interval-judged gates only)",
            "false_release_bound": max((c["pass_alpha"] for c in checks.values()), default=None),
            "false_release_rule": "intersection-union: every required gate passes at its own alpha",
            "tests": sum(c["tests"] for c in checks.values()),
        },
    }
    if warned:  # no test stands behind a warned gate: nothing bounds a wrong release through it
        out["run"].update(
            false_release_bound=1.0, warned_gates=sorted(warned),
            false_release_rule=f"{len(warned)} gate(s) released undecided by release.policy's warn, with no passed "
                               "test behind them: nothing bounds a wrong release through them (1.0); the passed "
                               "gates' own alphas hold for them alone")
    if judged_on_these_items is not None:  # the cached baseline answers' uses, by separate runs too
        out["baseline_answers"] = {
            "candidates_judged": judged_on_these_items,
            "rule": "distinct candidates (by weights) judged against the same cached baseline answers, this one "
                    "included; only a family (a comparison, a search, --family) splits the alpha over them"}
    if stream is not None:  # recipe/stream.py: the level this decision's gates were judged at, and why
        out["stream"] = stream.record(stream_alpha)
    if family is not None:
        run = out["run"]
        out["family"] = {**family.as_dict(),
                         "false_release_bound": None if run["false_release_bound"] is None else
                         min(1.0, round(run["false_release_bound"] * family.size, 6)),
                         "false_release_rule": "union bound over the family's candidates: a wrong release of any "
                                               "of them, each candidate's own bound times the family's size"}
    return out
