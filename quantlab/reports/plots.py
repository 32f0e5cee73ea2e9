"""PNG plots for reports (matplotlib, headless). Baseline and candidate always share
the axes; every figure's title carries its workload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLORS = {"baseline": "#4c72b0", "candidate": "#dd8452"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _rows(run_dir: Path, files: list[str], role: str) -> list[dict[str, Any]]:
    rows = []
    for f in files:
        if f"/{role}-" in f:
            rows += [json.loads(line) for line in (run_dir / f).read_text().splitlines() if line.strip()]
    return rows


def latency_cdfs(run_dir: Path, points: list[Any], out: Path, context: str) -> Path:
    """TTFT and TPOT CDFs per workload point, all repeats pooled per role."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(points), 2, figsize=(10, 2.8 * len(points)), squeeze=False)
    for row, p in zip(axes, points, strict=True):
        for ax, key, label in ((row[0], "ttft", "TTFT (ms)"), (row[1], "tpot", "TPOT (ms)")):
            for role in ("baseline", "candidate"):
                vals = sorted(r[key] * 1000 for r in _rows(run_dir, p.raw_files, role)
                              if r["outcome"] == "ok" and r.get(key) is not None)
                if vals:
                    ax.step(vals, [(i + 1) / len(vals) for i in range(len(vals))], where="post",
                            color=COLORS[role], label=role)
            ax.set_xlabel(label)
            ax.set_ylabel("fraction of requests")
            ax.set_title(f"{p.workload} {p.point}", fontsize=9)
    return _finish(plt, fig, axes.flat, out, f"Latency CDFs - {context}")


def versus_concurrency(points: list[Any], out: Path, context: str) -> Path | None:
    """Output tokens/s and P99 TTFT against concurrency, per workload."""
    closed = [p for p in points if p.concurrency is not None]
    if not closed:
        return None
    plt = _pyplot()
    fig, (ax_tp, ax_ttft) = plt.subplots(1, 2, figsize=(10, 3.6))
    for workload in sorted({p.workload for p in closed}):
        pts = sorted((p for p in closed if p.workload == workload), key=lambda p: p.concurrency)
        xs = [p.concurrency for p in pts]
        for role in ("baseline", "candidate"):
            ax_tp.plot(xs, [getattr(p, role)["output_tokens_per_s"] for p in pts], marker="o", color=COLORS[role],
                       label=f"{role} {workload}")
            ax_ttft.plot(xs, [getattr(p, role)["ttft_ms"]["p99"] for p in pts], marker="o", color=COLORS[role],
                         label=f"{role} {workload}")
    ax_tp.set_title("output tokens/s", fontsize=9)
    ax_ttft.set_title("P99 TTFT (ms)", fontsize=9)
    for ax in (ax_tp, ax_ttft):
        ax.set_xlabel("concurrency")
        ax.set_xscale("log", base=2)
    return _finish(plt, fig, (ax_tp, ax_ttft), out, f"Throughput and tail latency - {context}")


def accuracy_vs_load(points: list[Any], out: Path, context: str) -> Path | None:
    """Accuracy on the load_quality slice at concurrency 1 and at each closed-loop point, per
    role (open-loop points, which have no concurrency, are in the report's table only)."""
    closed = sorted((p for p in points if p.concurrency is not None), key=lambda p: p.concurrency)
    if not closed:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(1, 1, figsize=(6, 3.6))
    for role in ("baseline", "candidate"):
        first = next((p.roles[role].c1 for p in closed if p.roles.get(role) and p.roles[role].c1), None)
        xs = ([1] if first is not None else []) + [p.concurrency for p in closed if p.concurrency != 1]
        ys = ([first.accuracy] if first is not None else []) + [p.roles[role].load.accuracy for p in closed
                                                                if p.concurrency != 1]
        ax.plot(xs, ys, marker="o", color=COLORS[role], label=role)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("accuracy on the slice")
    ax.set_xscale("log", base=2)
    return _finish(plt, fig, (ax,), out, f"Accuracy against concurrency - {context}")


def _finish(plt, fig, axes, out: Path, title: str) -> Path:
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, out, title)


def _save(plt, fig, out: Path, title: str) -> Path:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def quality_deltas(comparisons: list[Any], out: Path, context: str) -> Path | None:
    """Per task (and slice): candidate - baseline relative to the baseline, with its
    confidence interval (right = better, whatever the metric's direction), and the
    samples lost and gained against the baseline."""
    rows = [c for c in comparisons if c.baseline]
    if not rows:
        return None
    plt = _pyplot()
    fig, (ax, ax_flips) = plt.subplots(1, 2, figsize=(11, 0.45 * len(rows) + 1.6), sharey=True,
                                       gridspec_kw={"width_ratios": [3, 1]})
    ys = list(range(len(rows)))[::-1]
    for y, c in zip(ys, rows, strict=True):
        sign = 1 if c.higher_is_better else -1
        scale = abs(c.baseline)
        mid, lo, hi = (sign * v / scale for v in (c.diff, c.ci_low, c.ci_high))
        lo, hi = min(lo, hi), max(lo, hi)
        color = COLORS["candidate"] if hi < 0 else ("#55a868" if lo >= 0 else "#8c8c8c")
        ax.errorbar(mid, y, xerr=[[mid - lo], [hi - mid]], fmt="o", color=color, capsize=3)
        if c.binary:
            ax_flips.barh(y - 0.15, -(c.worse or 0), height=0.3, color=COLORS["candidate"])
            ax_flips.barh(y + 0.15, c.better or 0, height=0.3, color="#55a868")
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(ys, [f"{c.task} ({c.metric}, n={c.n})" for c in rows], fontsize=8)
    ax.set_xlabel("candidate vs baseline, relative (right = better), with CI")
    ax_flips.axvline(0, color="black", linewidth=0.8)
    ax_flips.set_xlabel("samples lost (left) / gained (right)")
    for a in (ax, ax_flips):
        a.grid(alpha=0.3)
    return _save(plt, fig, out, f"Quality deltas - {context}")


DECISION_COLORS = {"release": "#55a868", "blocked": "#c44e52", "not_shown": "#8c8c8c", "baseline": "#4c72b0"}


def pareto_axis(rows: list[dict[str, Any]]) -> str:
    """The Pareto plot's x figure: the first of cost per correct answer, cost per successful
    answer and output tokens/s that some candidate has."""
    keys = ("cost_per_correct_answer", "cost_per_successful_request")
    return next((k for k in keys if any(r.get(k) for r in rows)), "output_tokens_per_s")


def pareto(rows: list[dict[str, Any]], out: Path, context: str) -> Path | None:
    """The candidates of a comparison: worst quality recovery (up = better) against cost
    per correct answer (quality at load: right and within every SLO), else cost per
    successful answer, or output tokens/s where no price is set (right = better for
    throughput, left for cost); marker size is peak memory. Colour is the decision."""
    key = pareto_axis(rows)
    use_cost = key != "output_tokens_per_s"
    pts = [r for r in rows if r.get(key) is not None and r.get("worst_recovery") is not None]
    if not pts:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    peak = max((r.get("peak_memory_bytes") or 0) for r in pts) or 1
    for r in pts:
        size = 60 + 540 * (r.get("peak_memory_bytes") or 0) / peak
        ax.scatter(r[key], r["worst_recovery"], s=size, alpha=0.7, color=DECISION_COLORS.get(r["decision"], "#dd8452"),
                   edgecolors="black", linewidths=0.6)
        ax.annotate(f"{r['name']} ({r['decision']})", (r[key], r["worst_recovery"]), fontsize=8,
                    xytext=(6, 6), textcoords="offset points")
    ax.set_xlabel({"cost_per_correct_answer": "cost per correct answer within the SLOs (lower is better)",
                   "cost_per_successful_request": "cost per successful answer (lower is better)"}.get(
                       key, "output tokens/s at the best point (higher is better)"))
    ax.set_ylabel("worst quality recovery, candidate / baseline")
    ax.grid(alpha=0.3)
    return _save(plt, fig, out, f"Candidates - {context}\n(marker size: peak memory)")


def sensitivity_bars(rows: list[dict[str, Any]], out: Path, context: str, top: int = 40) -> Path | None:
    """Mean KL of each group quantized alone, most sensitive first (log scale: a few
    layers usually dominate)."""
    rows = rows[:top]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.22 * len(rows)))
    names = [r["group"] for r in rows][::-1]
    values = [max(r["mean_kl"], 1e-12) for r in rows][::-1]
    ax.barh(names, values, color="#4c72b0")
    ax.set_xscale("log")
    ax.set_xlabel("mean next-token KL vs the unquantized model (this group alone quantized)")
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(alpha=0.3, axis="x")
    return _save(plt, fig, out, f"Sensitivity - {context}")


def search_trials(trials: list[dict[str, Any]], out: Path, context: str) -> Path | None:
    """A search's trials against the number of layer groups kept: worst quality recovery
    (left axis, colour = decision) and weights size (right axis)."""
    pts = sorted(trials, key=lambda t: t["k"])
    if not pts:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for t in pts:
        if t.get("worst_recovery") is not None:
            ax.scatter(t["k"], t["worst_recovery"], s=70, color=DECISION_COLORS.get(t["decision"], "#dd8452"),
                       edgecolors="black", linewidths=0.6, zorder=3)
            ax.annotate(t["decision"], (t["k"], t["worst_recovery"]), fontsize=7, xytext=(5, 5),
                        textcoords="offset points")
    ax.set_xlabel("layer groups kept unquantized (most sensitive first)")
    ax.set_ylabel("worst quality recovery, candidate / baseline")
    ax.grid(alpha=0.3)
    sized = [t for t in pts if t.get("weights_bytes")]
    if sized:
        right = ax.twinx()
        right.plot([t["k"] for t in sized], [t["weights_bytes"] / 1e6 for t in sized], "s--", color="#777777")
        right.set_ylabel("weights MB")
    return _save(plt, fig, out, f"Search - {context}")
