"""A sensitivity measurement as a ranked table (pure): the groups by how far quantizing
each alone moves the model's next-token distribution (mean KL against the unquantized
model on held-out text), with the top-1 agreement, the weights' own rounding error and,
where a run recorded one, the quantizer's loss (GPTQ)."""

from __future__ import annotations

from typing import Any


def _score(group: dict[str, Any]) -> float:
    return group.get("score", group["mean_kl"])  # files from before `method` scored by mean KL


def ranked(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows sorted by score (the KL a group causes alone, or the KL keeping it takes away),
    most sensitive first, each with its rank and its share of the sum of positive scores."""
    total = sum(max(_score(g), 0.0) for g in groups) or 1.0
    rows = sorted(groups, key=_score, reverse=True)
    return [{**g, "rank": i, "kl_share": max(_score(g), 0.0) / total} for i, g in enumerate(rows, 1)]


def with_quantizer_loss(rows: list[dict[str, Any]], losses: dict[str, float] | None) -> list[dict[str, Any]]:
    """Each group's sum of a run's per-module quantizer losses (None where not recorded)."""
    if not losses:
        return rows
    return [{**r, "quantizer_loss": sum(losses[m] for m in r["modules"] if m in losses)
             if any(m in losses for m in r["modules"]) else None} for r in rows]


def rank_agreement(proxy: dict[str, float], truth: dict[str, float]) -> dict[str, Any]:
    """Spearman's rho and Kendall's tau between two scores of the same groups (higher =
    worse in both), over the groups both scored."""
    from scipy.stats import kendalltau, spearmanr

    common = sorted(set(proxy) & set(truth))
    if len(common) < 3:
        return {"groups": len(common), "spearman": None, "kendall": None,
                "note": "fewer than 3 groups scored by both: no rank agreement"}
    a, b = [proxy[g] for g in common], [truth[g] for g in common]
    rho = float(spearmanr(a, b).statistic)
    return {"groups": len(common), "spearman": rho, "spearman_95": spearman_interval(rho, len(common)),
            "kendall": float(kendalltau(a, b).statistic)}


def spearman_interval(rho: float, n: int, confidence: float = 0.95) -> list[float] | None:
    """Spearman's rho's interval: Fisher's z with Bonett and Wright's variance,
    (1 + rho^2 / 2) / (n - 3); None below 4 groups (or an undefined rho)."""
    import math

    from scipy.stats import norm

    if n < 4 or rho != rho:
        return None
    z = math.atanh(max(-0.999999, min(0.999999, rho)))
    half = norm.ppf(0.5 + confidence / 2) * math.sqrt((1 + rho * rho / 2) / (n - 3))
    return [round(math.tanh(z - half), 4), round(math.tanh(z + half), 4)]


def markdown(result: dict[str, Any], top: int | None = None) -> str:
    """The ranked table with what it was measured on and what it cost."""
    rows = result["groups"][:top] if top else result["groups"]
    has_loss = any(r.get("quantizer_loss") is not None for r in rows)
    restored = (result.get("spec") or {}).get("method") == "restored"
    head = ["rank", "group", "modules"] + (["KL taken away", "mean KL kept"] if restored else ["mean KL"]) + \
        ["share", "top-1 agree", "weight rel. error"] + (["quantizer loss"] if has_loss else [])
    scored = f", {result['scored_positions']} positions scored" if result.get("scored_positions") else ""
    lines = [f"# Sensitivity: {result['recipe']}", "",
             f"Proxy: {result['proxy']}{' (the rest quantized, each group kept in turn)' if restored else ''}. "
             f"Held-out text: {result['texts']} sequences of up to {result['tokens']} tokens"
             f"{scored} ({result['text_source']}). All quantized modules at once: mean KL "
             f"{result['all_quantized']['mean_kl']:.4g}, top-1 agreement "
             f"{result['all_quantized']['top1_agreement']:.3f}. Cost: {result['wall_s']:.1f} s, "
             f"{result['forward_passes']} forward passes, computed in {result['dtype']} on {result['device']}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        kl = [f"{_score(r):.4g}", f"{r['mean_kl']:.4g}"] if restored else [f"{r['mean_kl']:.4g}"]
        cells = [str(r["rank"]), r["group"], str(len(r["modules"])), *kl, f"{r['kl_share']:.1%}",
                 f"{r['top1_agreement']:.3f}", f"{r['weight_rel_error']:.3g}"]
        if has_loss:
            cells.append("-" if r.get("quantizer_loss") is None else f"{r['quantizer_loss']:.4g}")
        lines.append("| " + " | ".join(cells) + " |")
    if top and len(result["groups"]) > top:
        lines.append(f"\n({len(result['groups']) - top} more groups in sensitivity.json)")
    return "\n".join(lines) + "\n"
