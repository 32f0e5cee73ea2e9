"""A manifest's gates held to the gate set registered before any engine started (pure).

The registration statement records every check's section as the stages read it
(release/registration.gate_set), not a list of verdicts: which tasks, points and probes
get which gates, and at what limit, margin, confidence and comparator, follows from those
sections through each check's own functions (quality/gates.task_gates, pooled_gates,
ni_margin; performance/gates.PERF_GATES; the stability and target gates' limits). So
`verify` recomputes, for every gate the manifest lists, what the registered section says
it must be, field by field, and which gates the sections call for that the manifest lacks.

What it cannot recompute is a measurement: a quality margin scales with the baseline's
score, which it reads from the manifest's own results (signed by the same key).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from quantlab.core import checks as check_table
from quantlab.release.check_hooks import hook
from quantlab.core.verdicts import GateVerdict, Want, gate_id
from quantlab.performance.gates import PERF_GATES
from quantlab.quality import gates as quality_gates
from quantlab.quality.compare import POOLED_SCOPE
from quantlab.recipe.performance import PerformanceSpec, Workload
from quantlab.recipe.quality import QualityGates, QualitySpec, ni_margin
from quantlab.recipe.release import ReleasePolicySpec
from quantlab.recipe.serve import PRIMARY_TARGET, ServeTarget
from quantlab.recipe.stability import StabilitySpec
from quantlab.serving import gates as serve_gates

COMPARISON_GATES = ("min_recovery", "max_drop", "non_inferiority")
KL_GATES = {"max_mean_kl": ("mean", "at_most"), "min_same_top_rate": ("same_top_rate", "at_least")}
# stability gate -> the probe that measures it (the probe runs when its section is set)
STABILITY_PROBES = {"max_batch_mismatch_excess": "batch", "max_length_failures": "lengths",
                    "max_server_errors": "bad_requests", "max_determinism_mismatch": "determinism",
                    "max_soak_error_rate": "soak", "max_rss_growth_mb": "soak"}
TARGET_LIMITS = {"servable": 1, "started": 1, "max_request_errors": 0}  # fixed; the mismatch limits are registered


@dataclass
class Sections:
    """The registered gate set, each section read with the recipe's own schema."""

    quality: QualitySpec | None
    performance: PerformanceSpec | None
    stability: StabilitySpec | None
    targets: list[ServeTarget]
    policy: ReleasePolicySpec | None
    raw: dict[str, Any] = field(default_factory=dict)  # the gate set as registered (a check's own section)


def read_sections(gates: dict[str, Any]) -> tuple[Sections, list[str]]:
    """The statement's gate set as schemas; a section that does not read is a problem."""
    problems: list[str] = []

    def read(name: str, model: Any) -> Any:
        raw = gates.get(name)
        if raw is None:
            return None
        try:
            return model.model_validate(raw)
        except (ValidationError, ValueError, TypeError) as err:
            problems.append(f"the registration's {name} section is not one this quantlab reads: "
                            f"{str(err).splitlines()[0]}")
            return None

    targets = []
    raw_targets = gates.get("targets") or []
    if not isinstance(raw_targets, list):
        problems.append(f"the registration's targets are a JSON {type(raw_targets).__name__}, not a list")
        raw_targets = []
    for i, raw in enumerate(raw_targets):
        try:
            targets.append(ServeTarget.model_validate(raw))
        except (ValidationError, ValueError, TypeError) as err:
            problems.append(f"the registration's targets[{i}] is not a serve target: {str(err).splitlines()[0]}")
    return Sections(quality=read("quality", QualitySpec), performance=read("performance", PerformanceSpec),
                    stability=read("stability", StabilitySpec), targets=targets,
                    policy=read("policy", ReleasePolicySpec), raw=gates), problems


def gate_set_problems(manifest: Any, statement: dict[str, Any]) -> list[str]:
    """Every way a manifest's gates, policy and targets differ from the registered gate set
    (`statement`: the registration statement's JSON)."""
    gates = statement.get("gates")
    if not isinstance(gates, dict):
        return ["the registration statement holds no gate set ('gates')"]
    sections, problems = read_sections(gates)
    problems += _policy_problems(manifest, sections)
    seen: dict[str, GateVerdict] = {}
    for v in manifest.gates:
        gid = gate_id(v)
        if gid in seen:
            problems.append(f"gate {gid} is listed twice")
            continue
        seen[gid] = v
        problems += _field_problems(v, sections, manifest)
    problems += _missing(seen, sections, manifest, _obj(statement.get("data")))
    return problems


# ------------------------------------------------------------------ the policy and the targets

def _policy_problems(manifest: Any, s: Sections) -> list[str]:
    out = []
    recorded = manifest.decision.not_shown_policy
    if s.policy is not None:
        registered = {"not_shown": s.policy.not_shown, "checks": dict(s.policy.checks), "gates": dict(s.policy.gates)}
        if recorded != registered:
            out.append(f"the decision was made under release.policy {recorded}, the registered one is {registered}")
    registered_targets = {PRIMARY_TARGET: True, **{t.name: t.required for t in s.targets}} if s.targets else {}
    recorded_targets = {n: t.required for n, t in manifest.targets.items()}
    if recorded_targets != registered_targets:
        out.append(f"the decision's serve targets (name: required) are {recorded_targets or 'none'}, the registered "
                   f"ones {registered_targets or 'none'}")
    return out


# ------------------------------------------------------------------ one gate's fields

def _field_problems(v: GateVerdict, s: Sections, manifest: Any) -> list[str]:
    gid = gate_id(v)
    check = check_table.find(v.check)
    rule = hook(check.verify) if check is not None and check.verify else None
    if rule is None:
        return [f"gate {gid}: '{v.check}' is not a check quantlab gates"]
    wants = rule(v, s, manifest)
    if isinstance(wants, str):
        return [f"gate {gid} is not in the registered gate set: {wants}"]
    out = []
    for w in wants:
        got = getattr(v, w.field)
        if not _meets(got, w):
            said = {"equal": "", "at_least": "at least ", "one_of": "one of "}[w.how]
            out.append(f"gate {gid}: its {w.field} is {got!r}, the registered gate set gives {said}{w.value!r} "
                       f"({w.where})")
    return out


def _meets(got: Any, w: Want) -> bool:
    if w.how == "one_of":
        return any(_same(got, x) for x in w.value)
    if w.how == "at_least":
        return isinstance(got, (int, float)) and (got >= w.value or _same(got, w.value))
    return _same(got, w.value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _obj(value: Any) -> dict[str, Any]:
    """A JSON object read from a signed record, or an empty one (a record no release writes)."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _quality_result(manifest: Any) -> dict[str, Any]:
    return _obj(_obj(manifest.results).get("quality"))


def _quality_row(manifest: Any, scope: str) -> dict[str, Any] | None:
    rows = _list(_quality_result(manifest).get("tasks"))
    return next((r for r in rows if isinstance(r, dict) and r.get("task") == scope), None)


def quality_wants(v: GateVerdict, s: Sections, manifest: Any) -> list[Want] | str:
    q = s.quality
    if q is None:
        return "the registration has no quality section"
    if v.gate in KL_GATES:
        key, comparator = KL_GATES[v.gate]
        limit = getattr(q.kl, v.gate)
        if limit is None or v.scope != "kl":
            return f"quality.kl.{v.gate} is not set (or the scope is not 'kl')"
        return [Want("limit", limit, f"quality.kl.{v.gate}"), Want("comparator", comparator, "its direction"),
                Want("metric", f"kl.{key}", "the KL summary's figure")]
    if v.gate == "skipped":
        return [Want("limit", 0, "a task that could not run"), Want("warnable", False, "a task that could not run")]
    if v.gate == "critical_row":  # a traffic file's critical row (the file's digest is registered)
        return [Want("limit", 1.0, "a critical row passes"), Want("metric", "passed", "the row's check")]
    if v.gate not in COMPARISON_GATES:
        return f"'{v.gate}' is not a quality gate"
    g, where = _configured(q, v.scope, manifest)
    if isinstance(g, str):
        return g
    configured = {"min_recovery": g.min_recovery, "max_drop": g.max_drop,
                  "non_inferiority": g.non_inferiority_margin}[v.gate]
    if configured is None:
        return f"{where} sets no {v.gate}"
    confidence = Want("confidence", g.confidence, f"{where}.confidence",
                      "equal" if q.samples == "all" else "at_least")  # a sequential look spends less alpha
    wants = [Want("comparator", "non_inferior", "every comparison gate"), confidence]
    row = _quality_row(manifest, v.scope)
    if row is not None:
        wants.append(Want("metric", row.get("metric"), "the task's metric in the manifest's results"))
    margins = _margins(v.gate, g, row)
    if margins is not None:
        wants.append(Want("margin", margins, f"{where} and the baseline's score", "one_of"))
    if v.gate == "non_inferiority":
        wants.append(Want("limit", -v.margin if v.margin is not None else None, "minus its margin"))
    else:
        wants.append(Want("limit", configured, f"{where}.{v.gate}"))
    return wants


def _configured(q: QualitySpec, scope: str, manifest: Any) -> tuple[QualityGates | str, str]:
    """The gates a quality scope is judged under, and the registered field they come from."""
    if scope == POOLED_SCOPE:
        if q.pooled is None:
            return "quality.pooled is not registered (null)", ""
        return quality_gates.pooled_gates(q), "quality.pooled"
    if scope.startswith("slice:"):
        name = scope.removeprefix("slice:")
        override = q.slice_gates.get(name)
        if override and override.disabled:
            return f"quality.slice_gates.{name} is disabled", ""
        return quality_gates.slice_gates(q, name), f"quality.slice_gates.{name}" if override else "quality.gates"
    override = q.task_gates.get(scope)
    if override and override.disabled:
        return f"quality.task_gates.{scope} is disabled", ""
    row = _quality_row(manifest, scope)
    slice_ = row.get("slice") if row and isinstance(row.get("slice"), str) else None
    where = f"quality.task_gates.{scope}" if override else \
        f"quality.slice_gates.{slice_}" if slice_ in q.slice_gates else "quality.gates"
    return quality_gates.task_gates(q, scope, slice_ or ""), where


def _margins(gate: str, g: QualityGates, row: dict[str, Any] | None) -> list[float] | None:
    """The margin(s) a comparison gate can have: from the baseline's score where it scales
    with it (min_recovery: either direction of the metric)."""
    floor = g.non_inferiority_min_margin or 0.0
    if gate == "max_drop":
        return [max(g.max_drop, floor)]
    base = row.get("baseline") if row else None
    if not isinstance(base, (int, float)):
        return None
    if gate == "non_inferiority":
        return [ni_margin(g, base)]
    r, b = g.min_recovery, abs(base)
    return [max(floor, max(0.0, (1 - r) * b)), max(floor, max(0.0, b * (1 / r - 1)))]


def performance_wants(v: GateVerdict, s: Sections, manifest: Any) -> list[Want] | str:
    p = s.performance
    if p is None:
        return "the registration has no performance section"
    if v.gate not in PERF_GATES:
        return f"'{v.gate}' is not a performance gate"
    limit = getattr(p.gates, v.gate)
    if limit is None:
        return f"performance.gates.{v.gate} is not set"
    if v.scope not in performance_points(p):
        return f"'{v.scope}' is not a registered workload point ({', '.join(performance_points(p))})"
    key, kind, direction = PERF_GATES[v.gate]
    return [Want("limit", limit, f"performance.gates.{v.gate}"),
            Want("comparator", "at_least" if direction == "min" else "at_most", "its direction"),
            Want("metric", f"{key} ratio" if kind == "ratio" else key, "the figure it judges")]


def performance_points(p: PerformanceSpec) -> list[str]:
    """Every workload point's scope (performance/result.load_points names them so)."""
    return [f"{w.name}/{point}" for w in p.workloads for point in _points(w)]


def _points(w: Workload) -> list[str]:
    return [f"c{c}" for c in w.concurrency] + [f"r{r:g}" for r in w.request_rates]


def stability_wants(v: GateVerdict, s: Sections, manifest: Any) -> list[Want] | str:
    st = s.stability
    if st is None:
        return "the registration has no stability section"
    probe = STABILITY_PROBES.get(v.gate)
    if probe is None:
        return f"'{v.gate}' is not a stability gate"
    limit = getattr(st.gates, v.gate)
    if limit is None:
        return f"stability.gates.{v.gate} is not set"
    return [Want("limit", limit, f"stability.gates.{v.gate}"), Want("scope", probe, "the probe that measures it"),
            Want("comparator", "at_most", "every stability gate"),
            Want("metric", v.gate.removeprefix("max_"), "the figure it judges")]


def _target(s: Sections, name: str | None) -> ServeTarget | None:
    return next((t for t in s.targets if t.name == name), None)


def serve_wants(v: GateVerdict, s: Sections, manifest: Any) -> list[Want] | str:
    if v.gate != serve_gates.GATE:
        return f"'{v.gate}' is not the serve check's gate"
    if v.target is not None and _target(s, v.target) is None:
        return f"'{v.target}' is not a registered serve target"
    return [Want("limit", 0, "no kernel off the expected path"), Want("comparator", "at_most", "its direction"),
            Want("scope", v.target or PRIMARY_TARGET, "the serve target it is about")]


def targets_wants(v: GateVerdict, s: Sections, manifest: Any) -> list[Want] | str:
    target = _target(s, v.scope)
    if target is None:
        return f"'{v.scope}' is not a registered serve target"
    wants = [Want("target", target.name, "the target it decides")]
    if v.gate in TARGET_LIMITS:
        return wants + [Want("limit", TARGET_LIMITS[v.gate], "a fixed threshold")]
    if v.gate in ("max_mismatch_excess", "max_mismatch"):
        limit = getattr(target, v.gate)
        if limit is None:
            return f"serve.targets[{target.name}].{v.gate} is not set"
        return wants + [Want("limit", limit, f"serve.targets[{target.name}].{v.gate}")]
    return f"'{v.gate}' is not a target gate"


# ------------------------------------------------------------------ gates the sections call for

def _stage_ran(manifest: Any, check: str) -> bool:
    """Whether a check's stage is in the manifest's run (a Ray race may stop a blocked
    candidate before it; a release never lacks one)."""
    stages = _obj(manifest.run).get("stages")
    if not stages or manifest.decision.decision == "release":
        return True
    return check in stages or not _obj(manifest.run).get("stopped_early")


def _missing(seen: dict[str, GateVerdict], s: Sections, manifest: Any, data: dict[str, Any]) -> list[str]:
    """Gate ids the registered sections call for that the manifest does not list."""
    wanted: list[str] = []
    if s.performance is not None and _stage_ran(manifest, "performance"):
        set_gates = [g for g in PERF_GATES if getattr(s.performance.gates, g) is not None]
        wanted += [f"performance.{g}@{point}" for point in performance_points(s.performance) for g in set_gates]
    if s.stability is not None and _stage_ran(manifest, "stability"):
        st = s.stability
        on = {"batch": st.batch is not None, "lengths": st.lengths is not None, "bad_requests": st.bad_requests,
              "determinism": st.determinism is not None, "soak": st.soak is not None}
        wanted += [f"stability.{g}@{probe}" for g, probe in STABILITY_PROBES.items()
                   if on[probe] and getattr(st.gates, g) is not None]
    if s.quality is not None and _stage_ran(manifest, "quality"):
        wanted += _quality_wanted(s.quality, seen, manifest, data)
    for check in check_table.CHECKS:  # a check whose row says which gates its registered section calls for
        if check.wanted and s.raw.get(check.name) is not None and _stage_ran(manifest, check.name):
            wanted += hook(check.wanted)(s, manifest)
    if s.targets and _stage_ran(manifest, "targets"):
        for t in s.targets:
            if not any(v.check == "targets" and v.scope == t.name for v in seen.values()):
                wanted.append(f"targets.*@{t.name}")
    return [f"gate {gid} is missing: the registered gate set calls for it" for gid in wanted
            if gid not in seen and not gid.startswith("targets.*")] + \
        [f"serve target {gid.partition('@')[2]} has no gate: the registered gate set names it"
         for gid in wanted if gid.startswith("targets.*")]


def _quality_wanted(q: QualitySpec, seen: dict[str, GateVerdict], manifest: Any, data: dict[str, Any]) -> list[str]:
    """Every registered gated task's configured gates (or its skipped gate: it could not
    run); every configured gate of a scope (task, slice, pooled) the manifest judged."""
    out: list[str] = []
    tasks = [t for suite in _list(data.get("suites")) for t in _list(_obj(suite).get("tasks")) if isinstance(t, dict)]
    for t in tasks:  # statements from before tasks were registered list none
        name = t.get("task")
        if not isinstance(name, str):
            continue
        override = q.task_gates.get(name)
        if not t.get("gated", True) or (override and override.disabled) or f"quality.skipped@{name}" in seen:
            continue
        g = quality_gates.task_gates(q, name, str(t.get("slice") or ""))
        out += [f"quality.{gate}@{name}" for gate in _set_gates(g)]
    judged = {v.scope for v in seen.values() if v.check == "quality" and v.gate in COMPARISON_GATES}
    for scope in sorted(judged):
        g, _ = _configured(q, scope, manifest)
        if not isinstance(g, str):
            out += [f"quality.{gate}@{scope}" for gate in _set_gates(g)]
    kl = _quality_result(manifest).get("kl")
    if kl is not None:
        out += [f"quality.{gate}@kl" for gate in KL_GATES if getattr(q.kl, gate) is not None]
    return list(dict.fromkeys(out))


def _set_gates(g: QualityGates) -> list[str]:
    return [gate for gate, value in (("min_recovery", g.min_recovery), ("max_drop", g.max_drop),
                                     ("non_inferiority", g.non_inferiority_margin)) if value is not None]
