"""Two folders of samples judged: the baseline's and the candidate's answers, in quantlab's
own form (`<task>.jsonl` and `<task>.summary.json` a task), paired and compared task by
task, pooled per slice and over every gated item, and gated (tasks, slices, the pooled
gate, KL, the tasks that could not run, a traffic file's critical rows), with every flip.

The quality stage judges what it evaluated through lm-eval on its servers; `quantlab
decide` judges what lm-eval wrote on the user's own machines (quality/imported_stage.py):
one judgement, so both reach the same verdicts on the same answers."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantlab.core.fsutil import write_text_atomic
from quantlab.core.verdicts import GateVerdict
from quantlab.quality import gates as quality_gates
from quantlab.quality.pairing import compare_tasks, pool_everything, pool_slices
from quantlab.quality.suites import Suite
from quantlab.recipe.quality import QualitySpec


@dataclass
class Judged:
    tasks: list[quality_gates.Paired]
    slices: list[quality_gates.Paired]
    everything: quality_gates.Paired | None
    gates: list[GateVerdict]
    flips: list[dict[str, Any]]
    lm_eval_version: str | None
    traffic: list[dict[str, Any]] = field(default_factory=list)

    @property
    def comparisons(self) -> list[Any]:
        return [cmp for cmp, _, _ in self.tasks]

    @property
    def slice_comparisons(self) -> list[Any]:
        return [cmp for cmp, _, _ in self.slices + ([self.everything] if self.everything else [])]


def gated_only(tasks: list[quality_gates.Paired], work: list[tuple[Suite, Any]]) -> list[quality_gates.Paired]:
    """The comparisons gates judge (a traffic file's unchecked rows are reported only)."""
    ungated = {t.task for _, t in work if not t.gated}
    return [t for t in tasks if t[0].task not in ungated]


def judge(spec: QualitySpec, work: list[tuple[Suite, Any]], skipped: list[tuple[Any, str]], base_dir: Path,
          cand_dir: Path, *, kl: dict[str, Any] | None = None, plans: dict[str, list[int]] | None = None) -> Judged:
    """Every task of `work` paired and gated; `skipped` (task, why): a gated task that could not
    run leaves a gate that cannot pass; `plans`: each task's look schedule (samples: auto)."""
    looks = {task: len(p) for task, p in (plans or {}).items()}
    tasks, flips, lm_eval_version = compare_tasks(spec, work, base_dir, cand_dir, plans=plans)
    gated = gated_only(tasks, work)
    slices = pool_slices(spec, gated, looks=looks)
    everything = pool_everything(spec, gated, looks=looks)
    gates = quality_gates.verdicts(spec, gated, slices, kl, everything, plans=plans)
    gates += quality_gates.skipped_verdicts(spec, [(t.task, why, t.slice, t.metric) for t, why in skipped if t.gated])
    traffic, critical = traffic_findings(work, base_dir, cand_dir)
    return Judged(tasks=tasks, slices=slices, everything=everything, gates=gates + critical, flips=flips,
                  lm_eval_version=lm_eval_version, traffic=traffic)


def write_flips(path: Path, flips: list[dict[str, Any]]) -> None:
    write_text_atomic(path, "".join(json.dumps(f, default=str) + "\n" for f in flips))


def sample_artifacts(ctx: Any, base_dir: Path, cand_dir: Path) -> list[str]:
    """Each role's sample files recorded as the run's artifacts (the manifest hashes them);
    `ctx`: the stage's context (core/stage_context.StageContext)."""
    raw = []
    for role_dir, role in ((cand_dir, "candidate"), (base_dir, "baseline")):
        for p in sorted(role_dir.glob("*.jsonl")):
            rel = str(p.relative_to(ctx.run.path))
            ctx.add_artifact(rel, f"quality-{role}-samples")
            raw.append(rel)
    return raw


def traffic_findings(work: list[tuple[Suite, Any]], base_dir: Path, cand_dir: Path
                     ) -> tuple[list[dict[str, Any]], list[GateVerdict]]:
    """Traffic tasks: unchecked rows against the baseline's answers, checks that errored,
    and one gate per critical row."""
    from quantlab.quality.lmeval import read_samples
    from quantlab.quality.traffic import compare_unchecked, critical_verdicts

    findings, gates = [], []
    for suite, task in work:
        if not suite.name.startswith("traffic-") or suite.folder is None or \
                not (suite.folder / "data" / f"{task.task}.jsonl").is_file():
            continue  # not a generated traffic suite
        b_rows, _ = read_samples(base_dir, task.task)
        c_rows, _ = read_samples(cand_dir, task.task)
        if not task.gated:
            findings.append({"suite": suite.name, **compare_unchecked(task.task, b_rows, c_rows)})
            continue
        data = suite.folder / "data" / f"{task.task}.jsonl"
        docs = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
        critical = critical_verdicts(task.task, docs, b_rows, c_rows)
        gates += critical
        findings.append({"suite": suite.name, "task": task.task, "n": len(c_rows),
                         "errored": {"baseline": sum(int((r["metrics"] or {}).get("errored") or 0) for r in b_rows),
                                     "candidate": sum(int((r["metrics"] or {}).get("errored") or 0) for r in c_rows)},
                         "critical": [{"scope": v.scope, "verdict": v.verdict, "evidence": v.evidence}
                                      for v in critical]})
    return findings, gates
