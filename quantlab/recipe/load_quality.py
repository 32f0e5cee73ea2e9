"""The recipe's `load_quality` section: quality at the operating point. A paired slice of
the quality suites' pass/fail tasks is sent to baseline and candidate at performance
workload points (their concurrency, or their Poisson rate) and at concurrency 1, each
answer scored as the quality stage scores it and each request timed.

Pure pydantic (no engine imports); recipe/file.py adds it as an optional section and
checks it against the `quality` and `performance` sections it needs.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quantlab.recipe.performance import PerformanceSpec, Workload

ALL = "all"
POINT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}/(c[1-9][0-9]*|r[0-9][0-9.e+-]*)$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoadQualitySpec(_Strict):
    """Which points are checked, on how many documents, and how the two gates judge them:
    `load_quality.at_load` (the candidate at load against the baseline at load) and
    `load_quality.versus_c1` (the candidate at load against itself at concurrency 1), each
    a non-inferiority test at `margin` on Tango's score interval at `confidence`."""

    points: list[str] | Literal["all"] = Field(
        ALL, description="Performance points as '<workload>/<point>', the point 'c<N>' (N in flight) or 'r<rate>' "
        "(requests per second, Poisson), as the performance stage names them ('chat/c8', 'chat/r2.5'); 'all': every "
        "point of every workload.")
    tasks: list[str] | None = Field(
        None, min_length=1, description="The quality tasks the slice is drawn from (each a gated pass/fail task "
        "of the quality suites); unset: every one of them.")
    items: int | Literal["auto"] = Field(
        "auto", description="Paired documents per point, across the tasks (stratified: each task's share "
        "proportional to its documents, its first ones, the same on every run). auto: the fewest at which an "
        "unchanged candidate passes non-inferiority at `margin` 80% of the time (at the batch noise floor measured "
        "on this host, else an assumed discordance), at least min_items and at most max_items.")
    max_items: int = Field(400, ge=1, le=100_000, description="The most documents `items: auto` sends per point.")
    min_items: int = Field(40, ge=1, le=100_000, description="The fewest documents per point: `items: auto` "
                           "plans at least this many, and a gate with fewer paired documents is not judged "
                           "(inconclusive, and release.policy cannot warn it through).")
    margin: float = Field(0.05, gt=0, lt=1, description="Both gates' non-inferiority margin, in absolute accuracy "
                          "(0.05 = five points): the candidate at load may be at most this much worse.")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="Two-sided confidence of the gates' intervals (the "
                              "fail side's is adjusted for the number of gates).")
    versus_c1: bool = Field(True, description="Also judge the candidate at load against its own answers at "
                            "concurrency 1 (a batch-dependent regression that is the candidate's alone).")
    num_concurrent: int = Field(64, ge=2, le=4096, description="Requests lm-eval queues at once for an open-loop "
                                "(rate) point, which are then released at the point's Poisson arrival times; a "
                                "closed-loop point keeps its own concurrency in flight.")
    timeout_s: float = Field(1800, gt=0, description="Deadline for the whole check of one role at one point.")

    @field_validator("points")
    @classmethod
    def _point_names(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, str):
            return v
        if not v:
            raise ValueError("name at least one point as '<workload>/<point>', or say 'all'")
        bad = [p for p in v if not POINT_NAME.match(p)]
        if bad:
            what = "is not a point name" if len(bad) == 1 else "are not point names"
            raise ValueError(f"{', '.join(map(repr, bad))} {what}: a point is '<workload>/c<N>' (N requests in "
                             "flight) or '<workload>/r<rate>' (requests per second), as in 'chat/c8'")
        if len(set(v)) != len(v):
            raise ValueError(f"a point is named twice: {sorted({p for p in v if v.count(p) > 1})}")
        return v

    @field_validator("tasks")
    @classmethod
    def _unique_tasks(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"a task is named twice: {sorted({t for t in v if v.count(t) > 1})}")
        return v

    @model_validator(mode="after")
    def _sizes(self) -> "LoadQualitySpec":
        if self.min_items > self.max_items:
            raise ValueError(f"min_items ({self.min_items}) is above max_items ({self.max_items}); lower min_items "
                             "or raise max_items")
        if isinstance(self.items, int) and not self.min_items <= self.items <= 100_000:
            raise ValueError(f"items ({self.items}) must be at least min_items ({self.min_items}), fewer paired "
                             "documents are never judged, and at most 100000; raise items or lower min_items")
        return self


def workload_points(w: Workload) -> list[tuple[str, int | None, float | None]]:
    """(point, concurrency, rate) of one workload, named as the performance stage names them."""
    return [(f"c{c}", c, None) for c in w.concurrency] + [(f"r{r:g}", None, r) for r in w.request_rates]


def point_names(perf: PerformanceSpec) -> list[str]:
    """Every '<workload>/<point>' the performance section defines, in its order."""
    return [f"{w.name}/{p}" for w in perf.workloads for p, _, _ in workload_points(w)]


def selected_points(spec: LoadQualitySpec, perf: PerformanceSpec) -> list[tuple[str, Workload, int | None,
                                                                                   float | None]]:
    """The points the section names (name, workload, concurrency, rate), in the performance
    section's order. ValueError naming the valid names when one is not defined there."""
    every = [(f"{w.name}/{p}", w, c, r) for w in perf.workloads for p, c, r in workload_points(w)]
    if spec.points == ALL:
        return every
    unknown = [p for p in spec.points if p not in {name for name, *_ in every}]
    if unknown:
        what = "is not a point" if len(unknown) == 1 else "are not points"
        raise ValueError(f"{', '.join(map(repr, unknown))} {what} of the performance section; its points are "
                         f"{', '.join(name for name, *_ in every)}. Name one of them "
                         "(a workload's concurrency level 'c<N>' or request rate 'r<rate>'), or 'all'")
    return [e for e in every if e[0] in spec.points]
