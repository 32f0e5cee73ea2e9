"""Reports from a run record: Markdown (fits a pull-request comment), a self-contained
HTML page (plots embedded), and JUnit XML with one test case per gate.

Pure functions of the record (plus the plot files it names), so `quantlab report
RUN_DIR` re-renders any run without running anything.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from quantlab.core.verdicts import all_verdicts, gate_id
from quantlab.release.decision import (RULE_VERSION, DecisionPolicy, TargetDecision, decide, recorded_policy,
                                       targets_line)
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
from quantlab.serving.compat import engine_build

MARKDOWN_FILE = "report.md"
HTML_FILE = "report.html"
JUNIT_FILE = "junit.xml"

# (title, table header, table rows, notes): one structure, rendered as Markdown and HTML
Section = tuple[str, list[str], list[list[str]], list[str]]


def _results(record: RunRecord) -> dict[str, Any]:
    return {name: record.result(name) for name in record.stages}


def decision_line(record: RunRecord) -> str:
    release = record.result("release")
    if isinstance(release, ReleaseResult):
        word = {"release": "RELEASE", "blocked": "BLOCKED", "not_shown": "NOT SHOWN"}[release.decision]
        fallback = f" Fallback: {release.fallback}." if release.fallback else ""
        targets = ""
        if release.targets:
            decisions = {n: TargetDecision.model_validate(d) for n, d in release.targets.items()}
            targets = f" Targets: {targets_line(decisions)}."
        return f"{word}: {release.why}.{fallback}{targets}"
    stopped = next((s.name for s in record.stages.values() if s.status != "ok"), None)
    if record.status in ("failed", "interrupted"):
        where = f"in stage {stopped}" if stopped else "before its first stage (a preflight check)"
        return f"no decision: the run {record.status} {where}"
    return f"no decision: the run is {record.status}"


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


def _quality_section(q: QualityResult) -> Section:
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
                 + ("; baseline from cache" if q.baseline_cached else ""))
    return ("Quality", ["task", "slice", "metric", "n", "baseline", "candidate", "difference [CI]", "recovery",
                        "flips", "McNemar p"], rows, notes)


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
                notes.append(f"{c['scope']}: {c['verdict'].upper()}: {c['detail']}")
    return notes


def _stability_section(st: StabilityResult) -> Section:
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
    return ("Stability", ["check", "baseline", "candidate"], rows, notes + st.notes)


def _targets_section(t: TargetsResult, release: Any) -> Section:
    def pct(v: Any) -> str:
        return "-" if v is None else f"{v:.1%}"

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
        if d.get("decision") == "blocked":
            notes.append(f"{name} blocked: {d.get('why')}")
        for e in o.examples[:2]:
            notes.append(f"{name} {e['role']} prompt {e['prompt']}: primary {e['primary']!r:.80} vs "
                         f"{e['target']!r:.80}")
    return ("Serve targets", ["target", "required", "mode, device", "engine args", "status", "baseline differs",
                              "candidate differs", "candidate batch mismatch", "decision"], rows, notes)


def _stage_error(s) -> str:
    """A failed stage's one-line cause where the engine's log told it, else its error's first line."""
    if s.cause:
        return s.cause[:300]
    return (s.error or "").splitlines()[0][:160] if s.error else ""


def sections(record: RunRecord) -> list[Section]:
    """(title, table header, table rows, notes) per section: one structure, two renderings."""
    r = _results(record)
    out = [_stages_section(record), _gates_section(r)]
    for stage, kind, build in (("quantize", QuantizeResult, _quantization_section),
                               ("checkpoint", CheckpointResult, _checkpoint_section),
                               ("serve", ServeResult, _serving_section),
                               ("quality", QualityResult, _quality_section),
                               ("stability", StabilityResult, _stability_section),
                               ("targets", TargetsResult, lambda tg: _targets_section(tg, r.get("release"))),
                               ("performance", PerfResult, _performance_section),
                               ("release", ReleaseResult, _manifest_section)):
        result = r.get(stage)
        if isinstance(result, kind):
            out.append(build(result))
    return out


def _blocking(verdicts: list[GateVerdict], release: Any) -> set[str]:
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
    blocking = _blocking(verdicts, r.get("release"))

    def label(v: GateVerdict) -> str:  # an optional target's failure blocks that target, not the release
        if v.verdict == "fail":
            return "FAIL" + ("" if gate_id(v) in blocking else " (optional target)")
        if v.verdict == "inconclusive":
            return "NOT SHOWN" + ("" if gate_id(v) in blocking else " (not required)")
        return v.verdict.upper()

    return ("Gates", ["verdict", "stage", "gate", "scope", "value", "limit", "detail"],
            [[label(v), v.stage, v.gate, v.scope, _fmt(v.value, 4), _fmt(v.limit, 4), v.detail]
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


def _serving_section(s: ServeResult) -> Section:
    rows = []
    for role, f in s.engines.items():
        log = f.log or {}
        kernels = sorted({k for ks in (log.get("linear_kernels") or {}).values() for k in ks})
        rows.append([role, f.vllm_version or "-", ", ".join(kernels) or "(unquantized)",
                     f"{log.get('kv_cache_dtype') or 'model dtype'}, {_fmt(log.get('kv_cache_tokens'))} tokens",
                     _fmt(f.startup_s), f.smoke_completion.text.strip()[:60]])
    notes = [f"device {s.device}; engine build {engine_build(s.probe)}; engine args {s.engine_args}"]
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
    return ("Serving", ["model", "vLLM", "linear kernels", "KV cache", "start-up s", "smoke completion"],
            rows, notes)


def _performance_section(p: PerfResult) -> Section:
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
    if p.client:
        notes.append(f"load generator ceiling here: {p.client['requests_per_s']:.0f} requests/s; its CPU use "
                     f"during the run {p.client_cpu_share:.2f} s per second")
    notes += p.notes
    notes += [f"NOT REPRESENTATIVE of a production server: {why}" for why in p.unrepresentative]
    return ("Performance", ["point", "out tok/s base", "out tok/s cand", "ratio", "P99 TTFT ms base",
                            "P99 TTFT ms cand", "ratio", "P99 TPOT ms base", "P99 TPOT ms cand",
                            "error rate base / cand"], rows, notes)


def _manifest_section(rel: ReleaseResult) -> Section:
    key = "local development key" if rel.local_development_key else (rel.public_key_fingerprint or "")
    return ("Manifest", ["manifest", "signed", "method", "key"],
            [[rel.manifest, "yes" if rel.signed else "NO", rel.signing_method, key]],
            [f"verify: quantlab verify {Path(rel.manifest).parent} --public-key <public key>"])


def plots(record: RunRecord) -> list[str]:
    out: list[str] = []
    for stage in ("quality", "performance"):
        out += list(getattr(record.result(stage), "plots", None) or [])
    return out


def render_markdown(record: RunRecord) -> str:
    lines = [f"## quantlab: {record.recipe_name}", "", f"**{decision_line(record)}**", "",
             f"run `{record.run_id}`, recipe sha256 `{record.recipe_sha256[:12]}`, quantlab {record.quantlab_version}",
             ""]
    for title, header, rows, notes in sections(record):
        lines += [f"### {title}", ""]
        if rows:
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "---|" * len(header))
            for row in rows:
                lines.append("| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in row) + " |")
            lines.append("")
        lines += [f"- {n}" for n in notes]
        if notes:
            lines.append("")
    for p in plots(record):
        lines += [f"![{Path(p).stem}]({p})", ""]
    return "\n".join(lines).rstrip() + "\n"


CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;
text-align:left}th{background:#f3f3f3}.release{color:#176f2c}.blocked{color:#b00020}.not_shown{color:#8a6d00}.FAIL{color:#b00020;
font-weight:bold}.PASS{color:#176f2c}.NOT{color:#8a6d00}ul{font-size:14px;color:#444}img{max-width:100%}"""


def render_html(record: RunRecord, run_dir: Path) -> str:
    release = record.result("release")
    cls = release.decision if isinstance(release, ReleaseResult) else "blocked"
    e = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             f"<title>quantlab: {e(record.recipe_name)}</title><style>{CSS}</style></head><body>",
             f"<h1>quantlab: {e(record.recipe_name)}</h1>",
             f"<h2 class='{cls}'>{e(decision_line(record))}</h2>",
             f"<p>run <code>{e(record.run_id)}</code>, recipe sha256 <code>{e(record.recipe_sha256[:12])}</code>, "
             f"quantlab {e(record.quantlab_version)}</p>"]
    for title, header, rows, notes in sections(record):
        parts.append(f"<h3>{e(title)}</h3>")
        if rows:
            parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
            for row in rows:
                first = f" class='{e(row[0])}'" if title == "Gates" else ""
                parts.append("<tr>" + "".join(f"<td{first if i == 0 else ''}>{e(c)}</td>"
                                              for i, c in enumerate(row)) + "</tr>")
            parts.append("</table>")
        if notes:
            parts.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    for p in plots(record):
        f = run_dir / p
        # embedded: the page is one self-contained file; only a file inside the run folder
        # (a run record naming any other path must not pull it into a report)
        if f.is_file() and f.resolve().is_relative_to(run_dir.resolve()):
            data = base64.b64encode(f.read_bytes()).decode()
            parts.append(f"<p><img alt='{e(Path(p).stem)}' src='data:image/png;base64,{data}'></p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def render_junit(record: RunRecord) -> str:
    """One test case per gate (failure = a failed gate, or a required one that could not
    decide; skipped = one not shown that release.policy only warns about), and one error
    case per failed stage, so CI systems show them natively."""
    results = _results(record)
    verdicts: list[GateVerdict] = all_verdicts(results)
    blocking = _blocking(verdicts, results.get("release"))
    unshown = sum(v.verdict == "inconclusive" and gate_id(v) in blocking for v in verdicts)
    failed_stages = [s for s in record.stages.values() if s.status != "ok"]
    suite = ET.Element("testsuite", name=f"quantlab.{record.recipe_name}",
                       tests=str(len(verdicts) + len(failed_stages)),
                       failures=str(sum(v.verdict == "fail" for v in verdicts) + unshown),
                       errors=str(len(failed_stages)),
                       skipped=str(sum(v.verdict == "inconclusive" for v in verdicts) - unshown))
    for v in verdicts:
        case = ET.SubElement(suite, "testcase", classname=f"{record.recipe_name}.{v.stage}",
                             name=f"{v.gate}@{v.scope}")
        if v.verdict == "fail":
            ET.SubElement(case, "failure", message=v.detail, type="GateFailed").text = v.detail
        elif v.verdict == "inconclusive" and gate_id(v) in blocking:  # required and not shown: nothing released
            ET.SubElement(case, "failure", message=f"not shown: {v.detail}", type="GateNotShown").text = v.detail
        elif v.verdict == "inconclusive":
            ET.SubElement(case, "skipped", message=v.detail)
    for s in failed_stages:
        case = ET.SubElement(suite, "testcase", classname=f"{record.recipe_name}.stages", name=s.name)
        ET.SubElement(case, "error", message=s.cause or (s.error or s.status).splitlines()[0],
                      type=s.status).text = s.error
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{seconds:.1f} s"


def time_line(record: RunRecord) -> str:
    """The latest attempt's wall time split into the engines' and quantlab's own."""
    a = record.attempt
    share = a.own_s / a.wall_s if a.wall_s else 0.0
    return (f"time: {_duration(a.wall_s)} in all (preflights and reports included), engines at work "
            f"{_duration(a.engine_s)}, quantlab's own {a.own_s:.1f} s ({share:.1%})")


def summary_lines(record: RunRecord, run_dir: Path) -> list[str]:
    """The few lines a run ends with on the terminal (failed gates and errors follow in
    the error message itself)."""
    lines = [f"{s.name:<12} {s.status:<11} {s.duration_s:8.1f} s"
             + (f"   engines {s.engine_s:7.1f} s" if s.engine_s is not None else "") for s in record.stages.values()]
    if record.attempt is not None:
        lines.append(time_line(record))
    lines.append(f"decision: {decision_line(record)}")
    if (run_dir / MARKDOWN_FILE).is_file():
        lines.append(f"report: {run_dir / MARKDOWN_FILE} (also {HTML_FILE}, {JUNIT_FILE})")
    return lines


def write_reports(run_dir: Path, record: RunRecord) -> dict[str, Path]:
    from quantlab.core.fsutil import write_text_atomic

    out = {MARKDOWN_FILE: render_markdown(record), HTML_FILE: render_html(record, run_dir),
           JUNIT_FILE: render_junit(record)}
    paths = {}
    for name, text in out.items():
        write_text_atomic(run_dir / name, text)
        paths[name] = run_dir / name
    return paths
