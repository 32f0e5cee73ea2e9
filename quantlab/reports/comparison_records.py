"""What a comparison's report is written from (plain records, pure): each judged candidate
reduced to the figures the choice reads, the choice, and what the comparison's files hold.
The pipeline builds them (pipeline/candidates/conclusion.py, select.py); the writers in
reports/ read them, so no writer needs the pipeline's candidates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quantlab.core.run import RunRecord
from quantlab.recipe.family import Family
from quantlab.recipe.selection import SelectionSpec


@dataclass(frozen=True)
class CandidateSummary:
    """What the choice reads of one judged candidate."""

    name: str
    decision: str  # release | blocked | not_shown
    failed_gates: list[str] = field(default_factory=list)
    not_shown_gates: list[str] = field(default_factory=list)
    cost_per_successful_request: float | None = None
    peak_memory_bytes: float | None = None
    output_tokens_per_s: float | None = None
    worst_slice_recovery: float | None = None
    goodput_at_slo: float | None = None  # successful requests/s at the best point meeting the SLOs


@dataclass(frozen=True)
class Choice:
    chosen: str | None
    why: str  # one line for the terminal and the manifest
    ranking: list[str]  # released candidates, best first
    closest: str | None = None  # when none is released
    lost: dict[str, str] = field(default_factory=dict)  # candidate -> why it was not chosen


@dataclass(frozen=True)
class ComparisonOutcome:
    """A judged comparison as its files show it: the table's rows, the choice (None when no
    candidate could be judged), the refused, and the judged members' run records."""

    baseline_row: dict[str, Any] | None
    rows: list[dict[str, Any]]
    choice: Choice | None
    refused: dict[str, str]  # candidate -> why its preflight refused it
    selection: SelectionSpec
    runs: dict[str, str]  # candidate -> its run folder, relative to the comparison's
    family: Family | None  # the family the candidates were judged as, when any
    records: list[RunRecord]  # the judged candidates' records (their JUnit suites)
