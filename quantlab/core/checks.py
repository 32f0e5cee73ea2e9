"""The table of checks (pure): one row per check kind, the one place the list is written.

A check is a stage whose gates the decision reads. Every list of checks reads this table
at call time: the decision's order of importance (release/decision.importance), the
recipe's `release.policy` names (recipe/release.py), the registered gate set
(release/registration.py), the evidence a run needs (pipeline/stages.require_evidence), the
manifest's check summaries and error budget (release/stage.py, release/error_budget.py),
the report's sections and plots (reports/sections.py, reports/stage_plots.py).

A row names its hooks as "module:function" strings, resolved by their callers
(release/check_hooks.hook): this module sits on the floor and imports nothing above
it, and the hooks live beside their check (or in reports/ where they need its helpers).
tests/unit/test_checks_table.py holds each hook to the floors its caller may import.
Adding a check kind: docs/design.md, "Adding a check kind".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LAST = 99  # a place for a new row: after the rows kept in the places they had before the table


@dataclass(frozen=True)
class Check:
    """One check kind. The hooks' signatures are in the field comments."""

    name: str  # the stage's NAME, its verdicts' `check` and its `release.policy.checks` key
    section: str  # the recipe field that turns it on (dotted: "serve.targets")
    report_title: str  # its section's title in the report (the Markdown heading and its anchor)
    evidence: bool = True  # its gates count as a check section (serve's alone do not: every run has them)
    remeasured: bool = False  # a resume may register its section anew after its evidence (measured again)
    refusal_field: str = ""  # the recipe field a refused re-registration names ("": the name)
    report: str | None = None  # (result, results) -> (header, rows, notes): its report section
    summary: str | None = None  # (result) -> dict: its entry in the manifest's `results`
    plots: str | None = None  # (ctx, result) -> [paths]: its plots, drawn once its stage returns
    budget: str | None = None  # (verdicts, section) -> dict: its entry in the error budget's `checks`
    registered: str | None = None  # (recipe) -> its gates as registered (None: its section as JSON)
    # (verdict, sections, manifest) -> [core.verdicts.Want], or why the gate is not registered: what `quantlab
    # verify` holds each of its gates to (sections: release/registered_gates.Sections; a check's own: sections.raw)
    verify: str | None = None
    # (sections, manifest) -> [gate ids]: every gate its registered section calls for, so `quantlab verify`
    # finds one a manifest dropped (None: only the five first checks', known to release/registered_gates)
    wanted: str | None = None
    report_place: int = LAST  # its place among the report's check sections
    manifest_place: int = LAST  # its place among the manifest's `results`

    @property
    def recipe_field(self) -> str:
        """The recipe field a refused re-registration of its section names."""
        return self.refusal_field or self.name


VERIFY = "quantlab.release.registered_gates"  # the five checks' verify rules share the registered sections' reading

# in the decision's order of importance: serve first (a server on the wrong kernel makes every
# other figure not the release's)
CHECKS: tuple[Check, ...] = (
    Check("serve", "serve", "Serving", evidence=False, refusal_field="serve.allow_kernels",
          report="quantlab.reports.sections:serving_section", registered="quantlab.serving.gates:registered",
          verify=f"{VERIFY}:serve_wants", report_place=0),
    Check("quality", "quality", "Quality", report="quantlab.reports.sections:quality_section",
          summary="quantlab.quality.record:summary", plots="quantlab.reports.stage_plots:quality_plots",
          budget="quantlab.quality.record:budget", verify=f"{VERIFY}:quality_wants", report_place=1,
          manifest_place=0),
    Check("performance", "performance", "Performance", remeasured=True,
          report="quantlab.reports.sections:performance_section", summary="quantlab.performance.record:summary",
          plots="quantlab.reports.stage_plots:performance_plots", budget="quantlab.performance.record:budget",
          verify=f"{VERIFY}:performance_wants", report_place=4, manifest_place=3),
    Check("stability", "stability", "Stability", report="quantlab.reports.sections:stability_section",
          summary="quantlab.stability.record:summary", verify=f"{VERIFY}:stability_wants", report_place=2,
          manifest_place=2),
    Check("targets", "serve.targets", "Serve targets", report="quantlab.reports.sections:targets_section",
          summary="quantlab.targets.record:summary", registered="quantlab.targets.gates:registered",
          verify=f"{VERIFY}:targets_wants", report_place=3, manifest_place=1),
    Check("load_quality", "load_quality", "Quality at load", report="quantlab.load_quality.record:report_section",
          summary="quantlab.load_quality.record:summary", plots="quantlab.reports.stage_plots:load_quality_plots",
          budget="quantlab.load_quality.record:budget", verify="quantlab.load_quality.record:wants",
          wanted="quantlab.load_quality.record:wanted",
          report_place=5, manifest_place=4),
)


def names() -> tuple[str, ...]:
    """Every check, in the decision's order."""
    return tuple(c.name for c in CHECKS)


def evidence_names() -> tuple[str, ...]:
    """The checks whose gates are the evidence a run is decided on (a recipe needs one)."""
    return tuple(c.name for c in CHECKS if c.evidence)


def find(name: str) -> Check | None:
    return next((c for c in CHECKS if c.name == name), None)


def in_report_order() -> list[Check]:
    return sorted(CHECKS, key=lambda c: c.report_place)


def in_manifest_order() -> list[Check]:
    return sorted(CHECKS, key=lambda c: c.manifest_place)


def section_of(recipe: Any, check: Check) -> Any:
    """The recipe's section for `check` (None when the recipe has none)."""
    value = recipe
    for part in check.section.split("."):
        value = getattr(value, part, None)
    return value

