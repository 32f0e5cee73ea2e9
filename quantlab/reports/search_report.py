"""What a search reads as: its Markdown table (schemes, layers, knobs) and its plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantlab.core.progress import Progress


def markdown(result: dict[str, Any]) -> str:
    """The search's Markdown: its schemes, layer and knob tables, then the choice and the notes."""
    lines = [f"# Search: {result['recipe']}", "",
             f"Stopped: {result['stopped']}, after {len(result['scheme_trials']) + len(result['trials'])} trials in "
             f"{len(result['rounds'])} rounds, {result['wall_s']:.0f} s; {result['width']} trials a round.", ""]
    if result.get("scheme_trials") or result.get("scheme_refused"):
        lines += _scheme_table(result)
    lines += _layer_table(result)
    if result.get("knob_trials"):
        lines += _knob_table(result["knob_trials"])
    lines.append("")
    lines += _chosen(result)
    lines += [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def _scheme_table(result: dict[str, Any]) -> list[str]:
    """The scheme trials' table (predicted and measured), the refused ones last, then a blank line."""
    bench = result.get("kernel_bench") or {}
    lines = [f"Schemes, cheapest first by predicted {bench.get('ordered_by', 'bytes')} (selection.rule "
             f"{bench.get('rule', '-')}; the order registered before the first trial). Predicted speed: one "
             "decoder layer's linear time in the scheme's kernel over the 16-bit layer's, at a decode step, "
             "measured on this host" + ("" if bench.get("measured") else
                                         f" (not measured: {bench.get('why', 'an older search')})")
             + "; beside it what the served trial measured.", "",
             "| trial | scheme | predicted MB | weights MB | predicted time x | decision | failed gates | "
             "out tok/s | x baseline |", "|---|---|---|---|---|---|---|---|---|"]
    for t in result["scheme_trials"]:
        mark = " (chosen)" if t["source"] == result.get("chosen_scheme") else ""
        speed = t.get("predicted_time_ratio")
        lines.append(f"| {t['source']}{mark} | {t['scheme']} | {t['predicted_bytes'] / 1e6:.1f} | "
                     f"{_mb(t['weights_bytes'])} | {'-' if speed is None else format(speed, '.2f')} | "
                     f"{t['decision']} | {_gates(t['failed_gates'])} | "
                     f"{'-' if t['output_tokens_per_s'] is None else format(t['output_tokens_per_s'], '.3g')} | "
                     f"{'-' if t.get('throughput_ratio') is None else format(t['throughput_ratio'], '.2f')} |")
    for t in result.get("scheme_refused") or []:
        lines.append(f"| {t['source']} | - | - | - | - | refused (no trial used) | {t['why']} | - | - |")
    lines.append("")
    return lines


def _layer_table(result: dict[str, Any]) -> list[str]:
    """The layer trials' rows, under the table's heading when there is a ranking."""
    lines = []
    if result.get("ranking"):
        lines += [f"Kept layer groups unquantized, most sensitive first ({result['granularity']} ranking "
                  f"{result['ranking']}); up to {result['max_layers']}.", "",
                  "| kept | decision | failed gates | worst recovery | weights MB | out tok/s |",
                  "|---|---|---|---|---|---|"]
    for t in result["trials"]:
        mark = " (chosen)" if t["k"] == result["best"] and result["passed"] else ""
        lines.append(f"| {t['k']}{mark} | {t['decision']} | {_gates(t['failed_gates'])} | "
                     f"{'-' if t['worst_recovery'] is None else format(t['worst_recovery'], '.3g')} | "
                     f"{_mb(t['weights_bytes'])} | "
                     f"{'-' if t['output_tokens_per_s'] is None else format(t['output_tokens_per_s'], '.3g')} |")
    return lines


def _knob_table(knob_trials: list[dict[str, Any]]) -> list[str]:
    """The knob trials' table, each choice in the order given."""
    lines = ["", "Knobs, each choice in the order given (the layer trials above start from the settings kept):",
             "", "| knob | value | decision | failed gates | worst recovery |", "|---|---|---|---|---|"]
    for t in knob_trials:
        lines.append(f"| {t['knob']} | {t['value']!r} | {t['decision']} | "
                     f"{', '.join(t['failed_gates'][:4]) or '-'} | "
                     f"{'-' if t['worst_recovery'] is None else format(t['worst_recovery'], '.3g')} |")
    return lines


def _chosen(result: dict[str, Any]) -> list[str]:
    """The line on what was chosen, or on the closest trial when none passed (none when there was none)."""
    if result.get("chosen_scheme"):
        return [f"Chosen: the scheme of {result['chosen_scheme']}; recipe: {result['recipe_file']}"]
    if result["passed"] and result["best"] is None:
        return [f"Chosen: {result['settings']} with no layer kept; recipe: {result['recipe_file']}"]
    if result["passed"]:
        return [f"Chosen: keep {result['best']} ({', '.join(result['kept']) or 'none'})"
                + (f" with {result['settings']}" if result["settings"] else "")
                + f"; recipe: {result['recipe_file']}"]
    if result["best"] is not None:
        t = next(t for t in result["trials"] if t["k"] == result["best"])
        return [f"No trial passed. Closest: keep {result['best']}, stopped by {', '.join(t['failed_gates'])}"]
    if result.get("scheme_trials"):
        t = min(result["scheme_trials"], key=lambda t: len(t["failed_gates"]))
        held = (f"blocked by {_gates(t['failed_gates'])}; " if t["failed_gates"] else "no gate failed; ") + \
            f"not shown: {_gates(t['not_shown_gates'])}"
        return [f"No trial passed. Closest scheme: {t['source']} ({t['scheme']}), {held} "
                f"(each gate's evidence: the report under {t.get('run', 'its run folder')})"]
    return []


def _mb(n: int | None) -> str:
    return "-" if n is None else format(n / 1e6, ".1f")


def _gates(names: list[str]) -> str:
    return (", ".join(names[:4]) + (f" (+{len(names) - 4})" if len(names) > 4 else "")) if names else "-"


def plot(result: dict[str, Any], folder: Path, progress: Progress) -> None:
    from quantlab.reports.plots import search_trials

    try:
        search_trials(result["trials"], folder / "search.png", result["recipe"])
    except (ImportError, OSError, ValueError) as err:
        progress(f"the search plot could not be drawn: {type(err).__name__}: {err}")
