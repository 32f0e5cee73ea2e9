"""The report's sections, one per stage and the gates, as (title, lines) from a run record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantlab.core import checks as check_table
from quantlab.release.check_hooks import hook
from quantlab.core.verdicts import all_verdicts, gate_id
from quantlab.release.decision import (RULE_VERSION, DecisionPolicy, decide, recorded_policy)
from quantlab.core.results import (
    CheckpointResult,
    PerfResult,
    QualityResult,
    QuantizeResult,
    ReleaseResult,
    ServeResult,
    StabilityResult,
    TargetsResult,
)
from quantlab.core.verdicts import GateVerdict
from quantlab.core.run import RunRecord
from quantlab.reports.environments import environments_sections
from quantlab.release.signing_key import local_public_key
from quantlab.serving.compat import engine_build


def stage_results(record: RunRecord) -> dict[str, Any]:
    return {name: record.result(name) for name in record.stages}


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _ratio(c: dict[str, Any], iv: dict[str, Any] | None = None) -> str:
    """The median ratio with its bootstrap interval where there is one, else the range over repeats."""
    if not c or c.get("ratio") is None:
        return "-"
    if iv:
        return f"{c['ratio']:.2f} ({iv['pass_low']:.2f}-{iv['pass_high']:.2f})"
    mark = "" if c.get("beyond_noise") is None else ("" if c["beyond_noise"] else " ~")
    return f"{c['ratio']:.2f} [{c['ratio_min']:.2f}-{c['ratio_max']:.2f}]{mark}"


def quality_section(q: QualityResult, results: dict[str, Any]) -> Table:
    rows = []
    for t in q.tasks + q.slices:
        flips = f"-{t.worse} / +{t.better}" if t.binary else "-"
        rows.append([t.task, t.slice, t.metric, str(t.n), _fmt(t.baseline, 4), _fmt(t.candidate, 4),
                     f"{t.diff:+.3g} [{t.ci_low:+.3g}, {t.ci_high:+.3g}]", _fmt(t.recovery, 3), flips,
                     _fmt(t.mcnemar_p, 3)])
    notes = [f"difference = candidate - baseline with its {q.tasks[0].confidence:.0%} paired interval (Tango's "
             "score interval for pass/fail metrics, the BCa bootstrap otherwise); flips = samples lost / gained "
             "against the baseline (in " + str(q.flips_file) + ")"] if q.tasks else []
    notes += [f"planned before the run: {line.strip()}" for line in q.plan]
    if q.kl:
        notes.append(f"next-token KL(baseline || candidate) over {q.kl.get('tokens')} positions of "
                     f"{q.kl.get('texts')} texts: mean {_fmt(q.kl.get('mean'), 3)}, median "
                     f"{_fmt(q.kl.get('median'), 3)}, P99 {_fmt(q.kl.get('p99'), 3)} nats; same top token "
                     f"{_fmt(q.kl.get('same_top_rate'), 3)}")
    notes += [f"skipped {s}" for s in q.skipped] + q.notes + _traffic_notes(q.traffic)
    secs = ", ".join(f"{k} {v:.0f} s" for k, v in q.seconds.items())
    notes.append(f"lm-eval {q.lm_eval_version}; evaluation time {secs or '-'}"
                 + ("; baseline from cache" if q.baseline_cached else "")
                 + (f"; model code ran in the {q.code_sandbox} sandbox" if q.code_sandbox in ("bwrap", "unshare")
                    else "; model code ran UNSANDBOXED (quality.code_sandbox)" if q.code_sandbox else ""))
    return (["task", "slice", "metric", "n", "baseline", "candidate", "difference [CI]", "recovery", "flips",
             "McNemar p"], rows, notes)


def _traffic_notes(traffic: list[dict[str, Any]]) -> list[str]:
    """Your own traffic: checks that errored, critical rows, unchecked rows' agreement."""
    notes = []
    for t in traffic:
        if "same_rate" in t:
            notes.append(f"{t['task']}: {t['n']} rows without a check; the candidate's answer is the baseline's "
                         f"(normalised) in {t['same_rate']:.0%}, mean chrF {t['mean_chrf']:.1f}")
            for m in t.get("most_changed", [])[:3]:
                notes.append(f"  most changed, chrF {m['chrf']:.1f}: baseline {m['baseline'][:80]!r} -> "
                             f"candidate {m['candidate'][:80]!r}")
        elif "errored" in t:
            e = t["errored"]
            if e["baseline"] or e["candidate"]:
                notes.append(f"{t['task']}: the check errored on {e['baseline']} baseline and {e['candidate']} "
                             "candidate answers (counted as not passed)")
            for c in t.get("critical", []):
                said = c.get("evidence", c.get("detail"))  # `detail` in records from before the rename
                notes.append(f"{c['scope']}: {c['verdict'].upper()}: {said}")
    return notes


def stability_section(st: StabilityResult, results: dict[str, Any]) -> Table:
    def row(what: str, get) -> list[str]:
        return [what] + [get(st.roles.get(role) or {}) for role in ("baseline", "candidate")]

    def pct(v: Any) -> str:
        return "-" if v is None else f"{v:.1%}"

    rows = [
        row("outputs changed in a batch", lambda r: pct((r.get("batch") or {}).get("mismatch_rate"))),
        row("length sweep failures", lambda r: _fmt((r.get("lengths") or {}).get("failures"))),
        row("greedy repeats that differed", lambda r: pct(((r.get("determinism") or {}).get("greedy") or {})
                                                          .get("mismatch_rate"))),
        row("seeded sampling repeats that differed", lambda r: pct(((r.get("determinism") or {}).get("seeded") or {})
                                                                   .get("mismatch_rate"))),
        row("bad requests: 5xx / dropped / unhealthy after", lambda r: _fmt((r.get("bad_requests") or {})
                                                                            .get("server_errors"))),
        row("soak error rate", lambda r: pct((r.get("soak") or {}).get("error_rate"))),
        row("soak memory growth MB", lambda r: _fmt((r.get("soak") or {}).get("rss_growth_mb"))),
    ]
    fr = st.fallback_rate
    notes = [f"fallback if blocked: {st.fallback}; fallback rate (requests the candidate failed and the baseline "
             f"answered, stability and performance): {pct(fr.get('rate'))} of {fr.get('requests')}",
             f"{st.prompts} greedy prompts of {st.prompt_tokens} tokens; served max_model_len {st.max_model_len}"]
    cand = st.roles.get("candidate") or {}
    for r in (cand.get("bad_requests") or {}).get("rows", []):
        notes.append(f"bad request '{r['case']}': {r['status']}"
                     + ("" if r["healthy_after"] else ", server unhealthy after"))
    return (["check", "baseline", "candidate"], rows, notes + st.notes)


def targets_section(t: TargetsResult, results: dict[str, Any]) -> Table:
    def pct(v: Any) -> str:
        return "-" if v is None else f"{v:.1%}"

    release = results.get("release")
    decided = release.targets if isinstance(release, ReleaseResult) else {}
    rows = [["primary", "yes", "-", "-", "checked", "0.0% (reference)", "0.0% (reference)",
             pct((t.primary.get("candidate") or {}).get("batch_mismatch_rate")),
             (decided.get("primary") or {}).get("decision", "-")]]
    notes = [f"{t.prompts} greedy prompts, {t.max_tokens} output tokens each; 'differs' = the answer sent alone "
             "differs from the primary target's answer to the same prompt"]
    for name, o in t.targets.items():
        d = decided.get(name) or {}
        rows.append([name, "yes" if o.required else "no", f"{o.mode}, {o.device or '-'}",
                     ", ".join(f"{k}={v}" for k, v in (o.engine_args or {}).items()) or "-",
                     o.status, pct(o.cross_mismatch_rate.get("baseline")), pct(o.cross_mismatch_rate.get("candidate")),
                     pct(o.batch_mismatch_rate.get("candidate")), d.get("decision", "-")])
        if o.reason:
            notes.append(f"{name}: {o.reason}")
        if (o.kernel_path or {}).get("status") in ("not gated", "not measured"):
            notes.append(f"{name}: candidate kernel path {o.kernel_path['status']}: {o.kernel_path.get('why')}")
        if d.get("decision") == "blocked":
            notes.append(f"{name} blocked: {d.get('why')}")
        for e in o.examples[:2]:
            notes.append(f"{name} {e['role']} prompt {e['prompt']}: primary {e['primary']!r:.80} vs "
                         f"{e['target']!r:.80}")
    return (["target", "required", "mode, device", "engine args", "status", "baseline differs", "candidate differs",
             "candidate batch mismatch", "decision"], rows, notes)


def _stage_error(s) -> str:
    """A failed stage's one-line cause where the engine's log told it, else its error's first line."""
    if s.cause:
        return s.cause[:300]
    return (s.error or "").splitlines()[0][:160] if s.error else ""


def sections(record: RunRecord) -> list[Section]:
    """(title, table header, table rows, notes) per section: one structure, two renderings."""
    r = stage_results(record)
    out = [_stages_section(record), _gates_section(r)]
    for stage, kind, build in (("quantize", QuantizeResult, _quantization_section),
                               ("checkpoint", CheckpointResult, _checkpoint_section)):
        if isinstance(r.get(stage), kind):
            out.append(build(r[stage]))
    for check in check_table.in_report_order():  # each check's section: its row's `report` hook
        if check.report and r.get(check.name) is not None:
            out.append((check.report_title, *hook(check.report)(r[check.name], r)))
    if isinstance(r.get("release"), ReleaseResult):
        out.append(_manifest_section(r["release"]))
    if isinstance(r.get("release"), ReleaseResult) and r["release"].environments:
        out += environments_sections(r["release"].environments, signed=r["release"].signed)
    return out


def blocking_gates(verdicts: list[GateVerdict], release: Any) -> set[str]:
    """The ids of the verdicts that hold the release back, under the policy it was
    decided by (no release result yet: the default, every gate required)."""
    policy = recorded_policy({n: d.get("required", True) for n, d in release.targets.items()},
                             release.not_shown_policy) if isinstance(release, ReleaseResult) else DecisionPolicy()
    rule = (release.rule_version or 1) if isinstance(release, ReleaseResult) else RULE_VERSION
    return {gate_id(v) for v in decide(verdicts, policy, rule=rule).blocking}


def _stages_section(record: RunRecord) -> Section:
    return ("Stages", ["stage", "status", "seconds", "engines at work (s)", "error"],
            [[s.name, s.status, f"{s.duration_s:.1f}", "-" if s.engine_s is None else f"{s.engine_s:.1f}",
              _stage_error(s)]
             for s in record.stages.values()], [time_line(record)] if record.attempt else [])


def _gates_section(r: dict[str, Any]) -> Section:
    verdicts = all_verdicts(r)
    blocking = blocking_gates(verdicts, r.get("release"))

    def label(v: GateVerdict) -> str:  # an optional target's failure blocks that target, not the release
        if v.verdict == "fail":
            return "FAIL" + ("" if gate_id(v) in blocking else " (optional target)")
        if v.verdict == "inconclusive":
            return "NOT SHOWN" + ("" if gate_id(v) in blocking else " (not required)")
        return v.verdict.upper()

    return ("Gates", ["verdict", "check", "gate", "scope", "value", "limit", "evidence"],
            [[label(v), v.check, v.gate, v.scope, _fmt(v.value, 4), _fmt(v.limit, 4), v.evidence]
             for v in sorted(verdicts, key=lambda v: ({"fail": 0, "inconclusive": 1}.get(v.verdict, 2), v.scope))],
            [] if verdicts else ["no gate configured"])


def _quantization_section(q: QuantizeResult) -> Section:
    cal = q.calibration or {}
    return ("Quantization", ["method", "scheme", "layers", "checkpoint MB", "calibration", "GPTQ max loss"],
            [[q.method, q.scheme or "raw", str(q.layers_quantized), f"{q.size_bytes / 1e6:.1f}",
              f"{cal.get('num_samples', '-')} samples, {cal.get('num_tokens', '-')} tokens, sha256 "
              f"{str(cal.get('sha256', '-'))[:12]}" if cal else "none (data-free)", _fmt(q.gptq_max_loss)]],
            [f"llm-compressor {q.versions.get('llmcompressor')}, torch {q.versions.get('torch')}"]
            + ([f"calibrated in {q.compute_dtype['dtype']}, exported in {q.compute_dtype['model_dtype']}: "
                f"{q.compute_dtype['reason']}"] if q.compute_dtype and q.compute_dtype["dtype"]
               != q.compute_dtype["model_dtype"] else [])
            + ([f"reused the checkpoint quantized earlier from the same inputs (cache "
                f"{q.reused_from_cache[:12]}); the timings are that run's"] if q.reused_from_cache else [])
            + _baseline_note(q.model))


def _baseline_note(model: dict[str, Any]) -> list[str]:
    """What the embedded default model is: every delta in this report is against it."""
    prov = model.get("provenance") or {}
    if model.get("kind") != "default" or not prov.get("gguf_file"):
        return []
    return [f"baseline: the embedded default model, {prov.get('model')} dequantized from {prov['gguf_file']} "
            "(4-bit Q4_1) to bf16, not the original bf16 release: every delta here is against that model, whose "
            "weights already carry 4-bit rounding, not against the original release"]


def _checkpoint_section(ck: CheckpointResult) -> Section:
    return ("Checkpoint", ["format", "from", "MB"], [[ck.format, ck.source, f"{ck.size_bytes / 1e6:.1f}"]],
            ["validated as given (quantlab validate): no quantization ran in this run"])


def serving_section(s: ServeResult, results: dict[str, Any]) -> Table:
    rows = []
    for role, f in s.engines.items():
        log = f.log or {}
        kernels = sorted({k for ks in (log.get("linear_kernels") or {}).values() for k in ks})
        rows.append([role, f.vllm_version or "-", ", ".join(kernels) or "(unquantized)",
                     f"{log.get('kv_cache_dtype') or 'model dtype'}, {_fmt(log.get('kv_cache_tokens'))} tokens",
                     _fmt(f.startup_s), f.smoke_completion.text.strip()[:60]])
    notes = [f"device {s.device}; engine build {engine_build(s.probe)}; engine args {s.engine_args}"]
    if s.exposed:
        notes.insert(0, f"**EXPOSED to other hosts**: {s.exposed}")
    if s.dtype and s.dtype["dtype"] != s.dtype["model_dtype"]:
        notes.append(f"**served in {s.dtype['dtype']}, not the model's {s.dtype['model_dtype']}**: "
                     f"{s.dtype['reason']}. Both roles alike, so the comparison holds; absolute speeds are "
                     "this CPU's, not a bf16-capable one's")
    for role, f in s.engines.items():
        phases = (f.log or {}).get("startup_phases_s")
        if phases:
            notes.append(f"{role} start-up {_fmt(f.startup_s)} s: "
                         + ", ".join(f"{k} {v:.0f} s" for k, v in phases.items()))
    for role, c in s.compat.items():
        notes += [f"{role}: {w}" for w in c.warnings + c.notes]
    kp = s.kernel_path or {}
    if kp.get("status") in ("not gated", "not measured"):  # a judged one is in the gates table
        notes.append(f"candidate kernel path {kp['status']}: {kp.get('why')}")
    return (["model", "vLLM", "linear kernels", "KV cache", "start-up s", "smoke completion"], rows, notes)


def _noise_lines(p: PerfResult) -> list[str]:
    """Per point, one line saying which noise model judged its ratios (Interval.noise_model;
    the metrics it judged named where they differ), and how to calibrate a host that has none."""
    lines, calibrated = [], False
    for pt in p.points:
        models: dict[str, list[str]] = {}
        for name, iv in pt.intervals.items():
            if name.startswith("ratio:") and iv.get("noise_model"):
                models.setdefault(iv["noise_model"], []).append(name.split(":", 1)[1])
                calibrated = calibrated or bool(iv.get("host_df"))
        if len(models) == 1:
            lines.append(f"noise at {pt.workload}/{pt.point}: {next(iter(models))}")
        elif models:
            lines.append(f"noise at {pt.workload}/{pt.point}: "
                         + "; ".join(f"{', '.join(m)}: {model}" for model, m in models.items()))
    if lines and not calibrated:
        lines.append("no host calibration was pooled: `quantlab calibrate RECIPE` measures this host's spread "
                     "between repeats once, for later runs to judge with it")
    return lines


def performance_section(p: PerfResult, results: dict[str, Any]) -> Table:
    rows = []
    for pt in p.points:
        b, c, cmp = pt.baseline, pt.candidate, pt.comparison
        rows.append([f"{pt.workload}/{pt.point}", _fmt(b["output_tokens_per_s"]), _fmt(c["output_tokens_per_s"]),
                     _ratio(cmp.get("output_tokens_per_s"), pt.intervals.get("ratio:output_tokens_per_s")),
                     _fmt(b["ttft_ms"]["p99"]), _fmt(c["ttft_ms"]["p99"]),
                     _ratio(cmp.get("ttft_ms.p99"), pt.intervals.get("ratio:ttft_ms.p99")),
                     _fmt(b["tpot_ms"]["p99"]), _fmt(c["tpot_ms"]["p99"]),
                     f"{_fmt(b['error_rate'])} / {_fmt(c['error_rate'])}"])
    notes = [f"{p.workload_context.get('label')}; measured {' '.join(p.order)}"
             + ("" if p.interleaved else " (not interleaved)"),
             "ratios are candidate / baseline, the median over paired repeats with (its bootstrap interval, "
             "one-sided bounds at performance.confidence) where gated, else [range over repeats]; ~ = within "
             "run-to-run noise"]
    for role, m in p.memory.items():
        notes.append(f"{role} memory: checkpoint {_fmt((m.get('checkpoint_bytes_on_disk') or 0) / 1e6)} MB, "
                     f"peak {_fmt((m.get('peak_bytes') or 0) / 1e9)} GB ({m.get('peak_is')}), KV capacity "
                     f"{_fmt(m.get('kv_cache_tokens'))} tokens")
    for role, cost in p.cost.items():
        if cost.get("price_per_hour"):
            notes.append(f"{role} cost per successful answer: {_fmt(cost.get('cost_per_successful_request'), 4)} "
                         f"at {cost.get('at')} (price {cost['price_per_hour']}/h)")
    notes += _noise_lines(p)
    if p.client:
        notes.append(f"load generator ceiling here: {p.client['requests_per_s']:.0f} requests/s; its CPU use "
                     f"during the run {p.client_cpu_share:.2f} s per second")
    notes += p.notes
    notes += [f"NOT REPRESENTATIVE of a production server: {why}" for why in p.unrepresentative]
    return (["point", "out tok/s base", "out tok/s cand", "ratio", "P99 TTFT ms base", "P99 TTFT ms cand", "ratio",
             "P99 TPOT ms base", "P99 TPOT ms cand", "error rate base / cand"], rows, notes)


def _manifest_section(rel: ReleaseResult) -> Section:
    key = "local development key" if rel.local_development_key else (rel.public_key_fingerprint or "")
    return ("Manifest", ["manifest", "signed", "method", "key"],
            [[rel.manifest, "yes" if rel.signed else "NO", rel.signing_method, key]],
            [_verify_hint(rel)])


def _verify_hint(rel: ReleaseResult) -> str:
    """The command that verifies this release: with the local development key, its public
    half on this machine and --allow-dev-key (without which verify refuses a dev-key release)."""
    folder = Path(rel.manifest).parent
    if not rel.local_development_key:
        return f"verify: quantlab verify {folder} --public-key <public key>"
    public = local_public_key()
    shown = f"~/{public.relative_to(Path.home())}" if public.is_relative_to(Path.home()) else str(public)
    return (f"verify: quantlab verify {folder} --public-key {shown} --allow-dev-key (signed with this machine's "
            "local development key, for trying quantlab: a release to ship needs a key of your own)")


# (title, table header, table rows, notes): one structure, rendered as Markdown and HTML
Section = tuple[str, list[str], list[list[str]], list[str]]
Table = tuple[list[str], list[list[str]], list[str]]  # a check's section without its title (the table's)


def _duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{seconds:.1f} s"


def time_line(record: RunRecord) -> str:
    """The latest attempt's wall time split into the engines' and quantlab's own."""
    a = record.attempt
    share = a.own_s / a.wall_s if a.wall_s else 0.0
    return (f"time: {_duration(a.wall_s)} in all (preflights and reports included), engines at work "
            f"{_duration(a.engine_s)}, quantlab's own {a.own_s:.1f} s ({share:.1%})")
