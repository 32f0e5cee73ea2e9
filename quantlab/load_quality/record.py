"""What the release and the report record of the load_quality check (pure): its manifest
summary, its error-budget entry, the Wants `quantlab verify` holds its gates to, and its
report section (core/checks.py names them)."""

from __future__ import annotations

from typing import Any

from quantlab.core.results import LoadQualityLevel, LoadQualityResult
from quantlab.core.verdicts import GateVerdict, Want
from quantlab.load_quality.gates import AT_LOAD, METRIC, VERSUS_C1
from quantlab.recipe.load_quality import LoadQualitySpec, selected_points
from quantlab.recipe.performance import PerformanceSpec


def summary(result: LoadQualityResult) -> dict[str, Any]:
    """The manifest's summary: per point and role, accuracy at c1 and at load, correct-answer
    goodput, and the flips between the two (the batch noise floor measured here)."""
    def level(lv: LoadQualityLevel | None) -> dict[str, Any] | None:
        if lv is None:
            return None
        good = lv.goodput or {}
        return {"accuracy": lv.accuracy, "documents": lv.documents, "answered": lv.answered,
                "correct_per_s": good.get("rate"), "correct_per_s_interval": [good.get("low"), good.get("high")],
                "cost_per_correct_answer": good.get("cost_per_correct_answer")}

    return {"tasks": result.tasks, "items": result.items, "discordance": result.discordance, "floor": result.floor,
            "points": [{"point": p.name, "roles": {role: {"load": level(r.load), "c1": level(r.c1), "flips": r.flips}
                                                   for role, r in p.roles.items()}} for p in result.points]}


def budget(vs: list[GateVerdict], spec: LoadQualitySpec | None) -> dict[str, Any]:
    """Two-sided Tango intervals: each pass side spends (1 - confidence) / 2; the fail side is
    Bonferroni over every gate of the check (load_quality/gates.verdicts)."""
    fail = [(1 - (v.fail_confidence or 0.95)) / 2 for v in vs]
    return {
        "tests": len(vs), "gates": len(vs), "test": sorted({v.test for v in vs if v.test}),
        "pass_alpha": round((1 - spec.confidence) / 2, 6) if spec is not None else None,
        "fail_alpha_per_test": round(min(fail), 8) if fail else None,
        "fail_alpha_family": round(sum(fail), 6),
        "family_rule": "Bonferroni over every load_quality gate x point (fail side); each pass side at its "
                       "own confidence",
    }


def wants(v: GateVerdict, sections: Any, manifest: Any) -> list[Want] | str:
    """A load_quality gate against the registered section (sections.raw['load_quality'])."""
    spec, perf = _registered(sections)
    if spec is None:
        return "the registration has no load_quality section (or one that does not read)"
    if v.gate not in (AT_LOAD, VERSUS_C1):
        return f"'{v.gate}' is not a load_quality gate"
    if v.gate == VERSUS_C1 and not spec.versus_c1:
        return "load_quality.versus_c1 is false in the registration"
    if perf is not None:
        gates = wanted(sections, manifest)
        if f"load_quality.{v.gate}@{v.scope}" not in gates:
            return f"'{v.gate}@{v.scope}' is not a gate the registered load_quality section calls for"
    if v.verdict != "inconclusive" and (v.samples or 0) < spec.min_items:
        return f"judged on {v.samples} paired documents, fewer than the registered load_quality.min_items"
    return [Want("margin", spec.margin, "load_quality.margin"), Want("limit", -spec.margin, "load_quality.margin"),
            Want("confidence", spec.confidence, "load_quality.confidence"),
            Want("comparator", "non_inferior", "every load_quality gate"), Want("metric", METRIC, "its figure")]


def _registered(sections: Any) -> tuple[LoadQualitySpec | None, PerformanceSpec | None]:
    raw = (sections.raw or {}).get("load_quality")
    perf = (sections.raw or {}).get("performance")
    try:
        return (LoadQualitySpec.model_validate(raw) if raw is not None else None,
                PerformanceSpec.model_validate(perf) if perf is not None else None)
    except ValueError:
        return None, None


def wanted(sections: Any, manifest: Any) -> list[str]:
    """Every gate the registered section calls for: at_load at each registered point, and
    versus_c1 at each point not at concurrency 1 when the section asks for it."""
    spec, perf = _registered(sections)
    if spec is None or perf is None:
        return []
    out = []
    try:
        points = selected_points(spec, perf)
    except ValueError:  # a point the registered performance section lacks: wants() says so per gate
        return []
    for name, _, concurrency, _ in points:
        out.append(f"load_quality.{AT_LOAD}@{name}")
        if spec.versus_c1 and concurrency != 1:
            out.append(f"load_quality.{VERSUS_C1}@{name}")
    return out


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _rate(good: dict[str, Any] | None) -> str:
    if not good or good.get("rate") is None:
        return "-"
    return f"{good['rate']:.3g}/s ({good.get('low') or 0:.3g}-{good.get('high') or 0:.3g})"


def report_section(result: LoadQualityResult, results: dict[str, Any]) -> tuple[list[str], list[list[str]],
                                                                                    list[str]]:
    """Per point: accuracy at c1 and at load for both roles, correct answers within the SLOs per
    second, and the flips between c1 and load (the batch noise floor)."""
    header = ["point", "role", "accuracy at c1", "accuracy at load", "correct within SLOs", "cost / correct",
              "flips c1 vs load"]
    rows = []
    for p in result.points:
        for role, r in p.roles.items():
            flips = r.flips or {}
            cost = (r.load.goodput or {}).get("cost_per_correct_answer")
            rows.append([p.name, role, _pct(r.c1.accuracy if r.c1 else None), _pct(r.load.accuracy),
                         _rate(r.load.goodput), "-" if cost is None else f"{cost:.3g}",
                         "-" if not flips else f"{flips.get('k')}/{flips.get('n')} ({_pct(flips.get('rate'))}, "
                                               f"up to {_pct(flips.get('high'))})"])
    notes = list(result.plan)
    for role, floor in sorted(result.floor.items()):
        notes.append(f"flips between two loads of the same weights here ({role}, every point and run pooled): "
                     f"{floor.get('k')}/{floor.get('n')} = {_pct(floor.get('rate'))} "
                     f"(95% up to {_pct(floor.get('high'))})")
    items = ", ".join(f"{t} {n}" for t, n in sorted(result.items.items()))
    notes.append(f"the slice: {items} (each task's first documents)")
    return header, rows, notes + result.notes
