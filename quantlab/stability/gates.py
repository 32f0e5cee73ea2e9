"""The stability gates (pure): batch invariance, length sweep, bad requests,
determinism and the soak, judged against the recipe's stability section.

Each is a fixed threshold on a measured figure. A figure that could not be measured (no
request answered both alone and in a batch, no repeated request answered, an endpoint's
memory) is a gate that could not decide and is not warnable: release.policy never lets
an unmeasured gate through."""

from __future__ import annotations

from typing import Any

from quantlab.core.verdicts import GateVerdict
from quantlab.recipe.stability import StabilitySpec

CHECK = "stability"


def verdicts(stab: dict[str, dict[str, Any]], spec: StabilitySpec) -> list[GateVerdict]:
    """Every stability gate on the probes' summaries (candidate, with the baseline beside it)."""
    g, out = spec.gates, []
    c, b = stab["candidate"], stab["baseline"]
    if g.max_batch_mismatch_excess is not None and "batch" in c:
        out.append(_batch_verdict(g, c, b))
    if g.max_length_failures is not None and "lengths" in c:
        out.append(_lengths_verdict(g, c, b))
    if g.max_server_errors is not None and "bad_requests" in c:
        out.append(_bad_requests_verdict(g, c, b))
    if g.max_determinism_mismatch is not None and "determinism" in c:
        out.append(_determinism_verdict(g, c, b))
    if "soak" in c:
        out += _soak_verdicts(g, c["soak"], b)
    return out


def _verdict(gate: str, scope: str, value, limit, ok: bool, detail: str) -> GateVerdict:
    """A threshold gate's verdict: pass when `ok`, else fail."""
    return GateVerdict(check=CHECK, gate=gate, scope=scope, verdict="pass" if ok else "fail",
                       value=value, limit=limit, evidence=detail, metric=gate.removeprefix("max_"),
                       comparator="at_most", estimate=value, test="threshold")


def _batch_verdict(g, c: dict[str, Any], b: dict[str, Any]) -> GateVerdict:
    """Batch invariance: the candidate's mismatch rate in a batch over the baseline's."""
    cr, br = c["batch"]["mismatch_rate"], b["batch"]["mismatch_rate"]
    if cr is None or br is None:
        return unmeasured("max_batch_mismatch_excess", "batch", g.max_batch_mismatch_excess,
                          "no request answered both alone and in a batch")
    return _verdict("max_batch_mismatch_excess", "batch", cr - br, g.max_batch_mismatch_excess,
                    cr - br <= g.max_batch_mismatch_excess,
                    f"outputs that changed in a batch: candidate {cr:.1%}, baseline {br:.1%} (excess {cr - br:+.1%}, "
                    f"needs <= {g.max_batch_mismatch_excess:.1%})")


def _lengths_verdict(g, c: dict[str, Any], b: dict[str, Any]) -> GateVerdict:
    """The length sweep: how many of its requests failed."""
    n = c["lengths"]["failures"]
    return _verdict("max_length_failures", "lengths", n, g.max_length_failures, n <= g.max_length_failures,
                    f"{n} of {len(c['lengths']['rows'])} length-sweep requests failed (baseline "
                    f"{b['lengths']['failures']}): " + ", ".join(f"{r['prompt_tokens']} tokens -> {r['status']}"
                                                                  for r in c["lengths"]["rows"] if not r["ok"]))


def _bad_requests_verdict(g, c: dict[str, Any], b: dict[str, Any]) -> GateVerdict:
    """Malformed requests: server errors, an unhealthy server after, or one accepted (200)."""
    n = c["bad_requests"]["server_errors"]
    bad = [f"{r['case']} -> {r['status']}" for r in c["bad_requests"]["rows"]
           if r["server_error"] or not r["healthy_after"]]
    accepted = c["bad_requests"].get("accepted") or []
    n += len(accepted)  # a malformed request answered 200 was not refused: a finding, not a note
    bad += [f"{case} -> 200 (accepted)" for case in accepted]
    return _verdict("max_server_errors", "bad_requests", n, g.max_server_errors, n <= g.max_server_errors,
                    f"{n} malformed requests got a 5xx, a dropped connection, left the server unhealthy or were "
                    f"answered 200 (baseline {b['bad_requests']['server_errors']})"
                    f"{': ' + '; '.join(bad) if bad else ''}")


def _determinism_verdict(g, c: dict[str, Any], b: dict[str, Any]) -> GateVerdict:
    """Determinism: the worse of the greedy and seeded repeats' mismatch rates."""
    rates = {m: c["determinism"][m]["mismatch_rate"] for m in ("greedy", "seeded")}
    worst = max((r for r in rates.values() if r is not None), default=None)
    if worst is None:
        return unmeasured("max_determinism_mismatch", "determinism", g.max_determinism_mismatch,
                          "no repeated request was answered")
    return _verdict("max_determinism_mismatch", "determinism", worst, g.max_determinism_mismatch,
                    worst <= g.max_determinism_mismatch,
                    f"repeated requests that answered differently: greedy {_pct(rates['greedy'])}, seeded sampling "
                    f"{_pct(rates['seeded'])} (baseline greedy {_pct(b['determinism']['greedy']['mismatch_rate'])})")


def _soak_verdicts(g, s: dict[str, Any], b: dict[str, Any]) -> list[GateVerdict]:
    """The soak's gates: its error rate and the server's memory growth."""
    out = []
    if g.max_soak_error_rate is not None:
        out.append(_verdict("max_soak_error_rate", "soak", s["error_rate"], g.max_soak_error_rate,
                            s["error_rate"] <= g.max_soak_error_rate,
                            f"{s['errors']} errors and {s['empty']} empty answers in {s['requests']} soak requests"))
    if g.max_rss_growth_mb is not None:
        out.append(_rss_growth_verdict(g, s, b))
    return out


def _rss_growth_verdict(g, s: dict[str, Any], b: dict[str, Any]) -> GateVerdict:
    """The server's memory growth over the soak (unmeasured where its memory is not visible)."""
    growth = s["rss_growth_mb"]
    if growth is None and not s.get("memory_visible", True):
        return unmeasured("max_rss_growth_mb", "soak", g.max_rss_growth_mb,
                          "the server's memory is not visible (external server)",
                          fix="set stability.gates.max_rss_growth_mb: null for a server whose memory "
                          "quantlab cannot see")
    if growth is None:
        return _verdict("max_rss_growth_mb", "soak", None, g.max_rss_growth_mb, False,
                        "the memory of a server quantlab launched could not be read during the soak (fewer than "
                        "two samples): its growth is not shown, and an unread gate does not pass")
    return _verdict("max_rss_growth_mb", "soak", growth, g.max_rss_growth_mb, growth <= g.max_rss_growth_mb,
                    f"server memory grew {growth:.0f} MB over the soak (baseline "
                    f"{_num(b['soak']['rss_growth_mb'])} MB)")


def unmeasured(gate: str, scope: str, limit: float, what: str, *, fix: str = "") -> GateVerdict:
    """A gate whose figure was not measured: not shown, and no policy may warn it through."""
    return GateVerdict(check=CHECK, gate=gate, scope=scope, verdict="inconclusive", value=None, limit=limit,
                       metric=gate.removeprefix("max_"), comparator="at_most", test="threshold", warnable=False,
                       evidence=f"{what}: nothing was measured, and release.policy cannot let an unmeasured gate "
                       f"through{f' ({fix})' if fix else ''}")


def _pct(v) -> str:
    return "-" if v is None else f"{v:.1%}"


def _num(v) -> str:
    return "-" if v is None else f"{v:.0f}"
