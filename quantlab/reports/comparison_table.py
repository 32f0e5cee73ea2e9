"""The comparison of candidates as a Markdown table and as JSON for dashboards (pure)."""

from __future__ import annotations

from typing import Any

from quantlab.reports.comparison_records import Choice

COLUMNS = [("name", "candidate"), ("decision", "decision"), ("cost_per_successful_request", "cost / success"),
           ("goodput_at_slo", "answers/s at SLO"),
           ("peak_memory_bytes", "peak GB"), ("kv_cache_tokens", "KV tokens"),
           ("output_tokens_per_s", "out tok/s (peak)"), ("p95_ttft_ms", "P95 TTFT ms"),
           ("p99_ttft_ms", "P99 TTFT ms"), ("p95_tpot_ms", "P95 TPOT ms"), ("p99_tpot_ms", "P99 TPOT ms"),
           ("max_error_rate", "errors"), ("worst_recovery", "worst recovery")]


def _cell(key: str, v: Any) -> str:
    if v is None:
        return "-"
    if key == "peak_memory_bytes":
        return f"{v / 1e9:.2f}"
    if key == "kv_cache_tokens":
        return f"{int(v):,}"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def markdown(baseline: dict[str, Any] | None, rows: list[dict[str, Any]], choice: Choice) -> str:
    """The table (baseline first), the choice in one line, and why each other lost."""
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    lines = [head, "|" + "---|" * len(COLUMNS)]
    for row in ([baseline] if baseline else []) + rows:
        mark = " (chosen)" if row["name"] == choice.chosen else ""
        cells = [_cell(k, row.get(k)) + (mark if k == "name" else "") for k, _ in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", choice.why]
    lines += [f"- {name}: {why}" for name, why in choice.lost.items()]
    scaled = scale_notes(rows)
    if scaled:
        lines += ["", "Measured beside another baseline block (another group, or in turn), so put on the first "
                  "candidate's baseline scale:"] + [f"- {n}" for n in scaled]
    return "\n".join(lines) + "\n"


def scale_notes(rows: list[dict[str, Any]]) -> list[str]:
    """One line per row whose speed figures were scaled onto the common baseline."""
    out = []
    for row in rows:
        k = row.get("baseline_scale")
        if k:
            measured = row.get("measured_as") or {}
            tps = measured.get("output_tokens_per_s")
            out.append(f"{row['name']}: x{k['output_tokens_per_s']:.3f} (its own baseline block measured "
                       f"{1 / k['output_tokens_per_s']:.3f} of the reference's throughput"
                       + (f"; {tps:.3g} out tok/s as measured" if tps is not None else "") + ")")
    return out


def as_json(baseline: dict[str, Any] | None, rows: list[dict[str, Any]], choice: Choice) -> dict[str, Any]:
    return {"baseline": baseline, "candidates": rows, "chosen": choice.chosen, "why": choice.why,
            "ranking": choice.ranking, "closest": choice.closest, "lost": choice.lost}


def html(baseline: dict[str, Any] | None, rows: list[dict[str, Any]], choice: Choice, *,
         refused: dict[str, str], plot_png: bytes | None = None) -> str:
    """One self-contained page: the table, the choice, why each other lost, the plot."""
    import base64
    from html import escape as e

    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>quantlab: comparison</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child{text-align:left}"
             ".release{color:#2a7a3b}.blocked{color:#b22}.not_shown{color:#777}</style></head><body>",
             "<h1>quantlab: comparison</h1>", f"<h2>{e(choice.why)}</h2>",
             "<table><tr>" + "".join(f"<th>{e(t)}</th>" for _, t in COLUMNS) + "</tr>"]
    for row in ([baseline] if baseline else []) + rows:
        cls = e(str(row.get("decision")))
        cells = [_cell(k, row.get(k)) + (" (chosen)" if k == "name" and row["name"] == choice.chosen else "")
                 for k, _ in COLUMNS]
        parts.append(f"<tr class='{cls}'>" + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>")
    parts.append("</table><ul>" + "".join(f"<li>{e(n)}: {e(w)}</li>" for n, w in
                                          {**choice.lost, **refused}.items()) + "</ul>")
    if scale_notes(rows):
        parts.append("<p>Measured beside another baseline block, so put on the first candidate's baseline scale:</p>"
                     "<ul>" + "".join(f"<li>{e(n)}</li>" for n in scale_notes(rows)) + "</ul>")
    if plot_png:
        parts.append(f"<p><img alt='candidates' src='data:image/png;base64,{base64.b64encode(plot_png).decode()}'></p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
