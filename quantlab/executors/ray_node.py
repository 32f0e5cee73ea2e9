"""The node's side of `--ray`: one candidate's Ray task, run on the node Ray placed it on.

The task runs the candidate's stages but the release (only the driver signs) as a single
run does, in its run folder in the storage folder: quantize (the checkpoint cache in the
storage folder, so a checkpoint made once is found by every node), serve the baseline and
the candidate there, then each check. A retry (its first node was lost) resumes there.
It hands back, as its Ray return value, what it did and the sha256 of every file it left
(written_files), which the driver checks the folder against (executors/ray_read_back.py).

Racing: with `quality.samples: auto`, a candidate that has failed a required gate after
its quality stage stops there (its servers stopped, its node free for the next task) and
is recorded as stopped early, with the gate that stopped it.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantlab.core import cache_secret, folder_record
from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import remove_tree
from quantlab.core.layout import CHECKPOINT_DIR, QUALITY_DIR
from quantlab.core.progress import Progress
from quantlab.core.run import RunDir
from quantlab.pipeline.candidate_run import CandidateRun
from quantlab.pipeline.loop import blocking_line
from quantlab.pipeline.stages import STAGES
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe
from quantlab.release import stage as release_stage

ATTEMPTS_DIR = "ray-attempts"  # in a candidate's run folder: one mark per attempt (node, pid)
NODE_LOG = "logs/node-progress.log"  # in a candidate's run folder: what its task said, on its node


@dataclass
class NodeOutcome:
    """What one candidate's task did: where, how long, and how it ended."""

    name: str
    node: str | None = None  # host name / Ray node id
    seconds: float | None = None  # the task's own wall time, on its node
    waited_s: float | None = None  # from submitting the task to its start on a node (Ray's scheduling)
    attempts: int = 1  # 2: its first node was lost and Ray ran it again elsewhere
    refused: str | None = None  # by a preflight on its node, before any work
    failed: str | None = None  # a stage failed, or the task itself (after Ray's retry)
    stopped_early: str | None = None  # racing: the required gate that failed, and where
    written: dict[str, Any] | None = None  # what the task left in its run folder (written_files), over Ray's channel


def node_stages() -> list:
    """What a node runs: the run's stages as they are now, but the release (only the driver signs)."""
    return [s for s in STAGES if s is not release_stage]


def candidate_task(loaded: LoadedRecipe, run_path: str, job: str, family: Family | None = None,
                   secret: bytes | None = None) -> dict[str, Any]:
    """Runs on a Ray node: the candidate's stages but release, in its run folder in the
    storage folder (a retry resumes there: the stages already done with the same inputs
    are kept). Each attempt leaves a mark, so a retry is known and said. `secret`: the
    driver's cache secret (the shared cache's entries are authenticated under it). Returns
    what it did and what it wrote (written_files), which the driver checks the folder against."""
    import ray

    cache_secret.use(secret)
    started_at, t0 = time.time(), time.monotonic()
    node_id = ray.get_runtime_context().get_node_id()
    node = f"{socket.gethostname()}/{node_id[:8]}"
    run, attempts = _attempt(Path(run_path), node, node_id, job, started_at)
    said = _node_log(run.path / NODE_LOG)
    out: dict[str, Any] = {"node": node, "started_at": started_at, "attempts": attempts}
    task = CandidateRun(loaded, run, said, stages=node_stages(), family=family)
    try:
        _run_stages(task, node, out)
        return out
    finally:
        task.close()
        run.save()
        out["seconds"] = round(time.monotonic() - t0, 1)
        out["written"] = written_files(run.path, run.record)  # last: nothing is written after it


def _attempt(run_path: Path, node: str, node_id: str, job: str, started_at: float) -> tuple[RunDir, int]:
    """The run folder, marked with this attempt, and the attempt's number; a retry drops what the lost node served and
    measured (a finished checkpoint is kept) and what it was writing."""
    run = RunDir.open(run_path)
    marks = run.path / ATTEMPTS_DIR
    marks.mkdir(exist_ok=True)
    (marks / f"{node_id[:8]}.{os.getpid()}").write_text(str(started_at))
    attempts = len(list(marks.iterdir()))
    run.record.placement = {"node": node, "ray_node_id": node_id, "ray_job_id": job, "attempt": attempts}
    if attempts > 1:
        run.record.stages = {n: r for n, r in run.record.stages.items() if n in ("quantize", "checkpoint")}
        for partial in [*run.path.glob(".*.partial"), *run.path.glob(".*.old-*")]:
            remove_tree(partial)
    run.record.status = "running"
    run.save()
    return run, attempts


def _run_stages(task: CandidateRun, node: str, out: dict[str, Any]) -> None:
    """Every preflight, then each enabled stage in order, as a single run runs them; how it
    ended goes into `out` (refused, failed or stopped early; nothing added: every stage ran)."""
    try:
        task.plan()
        task.preflight()
    except RecipeError as err:
        out["refused"] = f"refused by its preflight on {node}: {err}"
        return

    def failed(name: str, err: Exception) -> None:
        out["failed"] = f"stage {name} failed on {node}: {err}"

    stop = task.run_stages(failed=failed, until=lambda name: _stopped_early(task, name))
    if stop:
        out["stopped_early"] = task.run.record.stopped_early = stop
        task.progress(f"stopped early: {stop}")


def _stopped_early(task: CandidateRun, stage: str) -> str | None:
    """Racing (quality.samples auto): after the quality stage, a required gate that
    failed ends the candidate's checks (nothing later can undo a failed gate)."""
    q = task.ctx.recipe.quality
    if stage != "quality" or q is None or q.samples != "auto":
        return None
    failed = [v for v in task.decide().blocking if v.verdict == "fail"]
    if not failed:
        return None
    looks = len(list((task.run.path / QUALITY_DIR / "candidate").glob("look-*")))  # quality/stage.py's folders
    return f"blocked at look {looks} of its quality stage: {blocking_line(failed[0])}"


def _node_log(path: Path) -> Progress:
    """Progress of a task on its node, appended to a file in its run folder (the driver
    prints its own lines; this one is read afterwards)."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def said(msg: str) -> None:
        with path.open("a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {msg}\n")

    return said


def written_files(run_path: Path, record) -> dict[str, Any]:
    """What a task hands back over Ray's channel: the sha256 of every plain file in its run
    folder, what is not a plain file there, and its checkpoint's files as the quantize stage
    recorded them (the release hashes those against the folder)."""
    files, others = folder_record.walk(run_path)
    made = record.result("quantize") or record.result("checkpoint")
    return {"files": {rel: folder_record.file_digest(run_path / rel)["sha256"] for rel in files
                      if not rel.startswith(f"{CHECKPOINT_DIR}/")},
            "not_files": sorted(rel for rel in others if not rel.startswith(f"{CHECKPOINT_DIR}/")),
            "checkpoint": {rel: f.sha256 for rel, f in made.files.items()} if made is not None else None}
