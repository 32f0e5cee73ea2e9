"""Past one machine: `quantlab run a.yaml b.yaml ... --ray ADDRESS --storage DIR`.

Each candidate is one Ray task, placed by Ray on a node that holds what it asks for
(ray_cluster.task_resources) and run again once elsewhere if that node is lost (Ray's
retry). The task runs the candidate's stages on its node as a single run does: quantize
(the checkpoint cache in the storage folder, so a checkpoint made once is found by every
node), serve the baseline and the candidate there, quality, performance (baseline and
candidate interleaved on that node, the load generated there), stability and targets. Its
run folder is in the storage folder, so its records, plots and engine logs are where the
driver reads them; the baseline's quality and stability results go through the shared
cache, so a second node of the same kind takes them instead of evaluating them again.

The driver never serves: it checks before any task starts (the cluster can hold every
task, the storage folder is writable, the signing key is there), then takes each task's
run folder as it finishes, makes every candidate's decision, the recipes' choice, and
runs each release stage itself (only the driver signs), then the comparison's files, as
the local comparison does. The manifest names the node the checks ran on (its hardware
from that node's own probe, in the serve result) and the Ray job.

Read-back: nothing on the shared storage is trusted for being there. Each task hands back,
as its Ray return value, the sha256 of every file it left in its run folder (its checkpoint's
as the quantize stage recorded them); the driver hashes the folder it reads against those
(and the files it wrote itself before the task, against its own digests) and refuses the
comparison (IntegrityError, exit 3, naming each file) on an added, missing or changed file,
before any decision or signature; the release then compares the checkpoint's files with
their record. The shared cache's entries are authenticated under the driver's cache secret,
which each task receives as its argument (core/cache_secret.use), never through an
environment variable, a record or a log.

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
from quantlab.core.errors import EngineError, IntegrityError, QuantlabError, RecipeError
from quantlab.core.fsutil import remove_tree, write_text_atomic
from quantlab.core.layout import CHECKPOINT_DIR, QUALITY_DIR, RECORD_FILE
from quantlab.core.progress import Progress
from quantlab.core.result_cache import SHARED_CACHE_ENV
from quantlab.core.run import RunDir
from quantlab.pipeline.candidates.members import (CANDIDATES_DIR, Candidate, Comparison, candidates_of,
                                                  check_comparable, create_folder, selection_of)
from quantlab.core.engine_time import engine_seconds
from quantlab.pipeline.candidates.conclusion import conclude
from quantlab.pipeline.candidates.run import choose_then_release, comparison_family, finish_candidate
from quantlab.pipeline.context import RunContext
from quantlab.pipeline.loop import (CHECKPOINT_STAGES, STAGES, baseline_needed, blocking_line, enabled,
                                    guard_checkpoint, run_stage, stages_to_run, unlock_checkpoint)
from quantlab.pipeline.ray_cluster import (RUNS_SUBDIR, check_fits, check_storage, check_storage_on_nodes,
                                           shared_cache, task_resources)
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe
from quantlab.release import stage as release_stage
from quantlab.release.registration import register

TASK_RETRIES = 1  # a task whose node is lost runs once more elsewhere (Ray's retry)
COMPARISON_DEADLINE_S = 24 * 3600  # the longest the candidates' tasks may take, queued ones included
WAIT_STEP_S = 1.0  # how often the wait wakes (a Ctrl-C is taken between two waits)
CANCEL_GRACE_S = 30.0  # a cancelled task's stages stop their servers within this, then it is killed
ATTEMPTS_DIR = "ray-attempts"  # in a candidate's run folder: one mark per attempt (node, pid)
NODE_LOG = "logs/node-progress.log"  # in a candidate's run folder: what its task said, on its node
def node_stages() -> list:
    """What a node runs: the run's stages as they are now, but the release (only the driver signs)."""
    return [s for s in STAGES if s is not release_stage]


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


def run_comparison_on_ray(recipes: list[Path | LoadedRecipe], storage: Path, *, progress: Progress = print,
                          cpus: int = 1, verbose: bool = False, family: Family | None = None) -> Comparison:
    """The candidates as Ray tasks (connected already: ray_cluster.connect), then the
    choice and every release on this machine. One recipe is a comparison of one; a recipe
    may be one in memory (a search's trial), which travels to its node whole. The family
    (recipe/family.py; by default the candidates given) travels with each task: a
    candidate refused by its node's preflight still counts in it (known only there)."""
    import ray

    clock = (time.perf_counter(), engine_seconds())
    cands = candidates_of(recipes)
    check_comparable(cands, minimum=1)
    selection = selection_of([c.loaded for c in cands])
    check_fits([c.loaded for c in cands], [n["Resources"] for n in ray.nodes() if n.get("Alive")], cpus)
    storage = check_storage(storage)  # here first, then from every node
    check_storage_on_nodes(storage)
    folder = create_folder(Path(storage) / RUNS_SUBDIR, cands)
    family = family or comparison_family(cands, folder)
    progress(f"comparison of {len(cands)} candidate(s) on the Ray cluster: {folder}")
    for c in cands:
        c.run = RunDir.create(c.loaded, folder / CANDIDATES_DIR)
        c.ctx = RunContext(c.loaded, c.run, progress, verbose=verbose, stages=STAGES, family=family)
        stages_to_run(c.ctx)  # a recipe without any check is refused here, before any task
        release_stage.preflight(c.ctx)  # the signing key: on this machine, which signs
        c.ctx.baseline_model()  # the release here hashes the baseline's files: it must resolve here too
        c.run.record.registration = register(c.ctx)  # signed here, before any task starts an engine
        c.run.save()
    # what this machine wrote into each run folder (the registration): checked against its own digests
    own = {c.name: {rel: folder_record.file_digest(c.run.path / rel)["sha256"]
                    for rel in folder_record.walk(c.run.path)[0] if rel != RECORD_FILE} for c in cands}
    try:
        outcomes = run_tasks(cands, storage, progress=progress, cpus=cpus,
                             stop_on_refusal=selection.unservable == "stop", family=family)
        check_read_back(cands, outcomes, own)
    except BaseException as err:  # Ctrl-C, the deadline, a refusal that stops all: no record stays "running"
        for c in cands:
            run = RunDir.open(c.run.path)
            if run.record.status == "running":
                run.record.status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
                run.save()
        raise
    write_placement(folder, outcomes)
    for c in cands:
        _adopt(c, outcomes[c.name], progress, verbose, family)
    choose_then_release(cands, selection)
    for c in cands:
        finish_candidate(c, clock, progress)
    return conclude(folder, cands, selection, progress)


def run_tasks(cands: list[Candidate], storage: Path, *, progress: Progress, cpus: int = 1,
              stop_on_refusal: bool = False, family: Family | None = None) -> dict[str, NodeOutcome]:
    """Every candidate's task at once (Ray queues those no node can take yet); waits for
    all of them within COMPARISON_DEADLINE_S. On Ctrl-C, SIGTERM or the deadline every task is
    cancelled: its stages stop their servers (within CANCEL_GRACE_S), then it is killed."""
    import ray

    task = ray.remote(max_retries=TASK_RETRIES, retry_exceptions=False)(_candidate_task)
    env = {"env_vars": {SHARED_CACHE_ENV: str(shared_cache(storage))}}
    job = ray.get_runtime_context().get_job_id()
    secret = cache_secret.current()  # the shared cache's entries are authenticated under this machine's secret
    submitted = time.time()
    refs = {task.options(runtime_env=env, name=f"candidate:{c.name}", **task_resources(c.loaded, cpus))
            .remote(c.loaded, str(c.run.path), job, family, secret): c.name for c in cands}
    progress(f"ray: {len(refs)} candidate task(s) submitted (job {job})")
    outcomes: dict[str, NodeOutcome] = {}
    deadline = time.monotonic() + COMPARISON_DEADLINE_S
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=min(WAIT_STEP_S, max(
                0.1, deadline - time.monotonic())))
            if not ready:
                if time.monotonic() >= deadline:
                    raise EngineError(f"ray: {len(pending)} candidate task(s) did not finish within "
                                      f"{COMPARISON_DEADLINE_S} s: " + ", ".join(refs[r] for r in pending))
                continue
            out = _collected(ray, ready[0], refs[ready[0]], submitted, progress)
            outcomes[out.name] = out
            if out.refused and stop_on_refusal:
                raise RecipeError(f"candidate {out.name}: {out.refused} (selection.unservable: stop)",
                                  field="selection.unservable")
    except BaseException:
        _cancel(ray, pending, progress)
        raise
    return outcomes


def _cancel(ray, pending: list, progress: Progress) -> None:
    """Ask each task to stop (a KeyboardInterrupt in it: its stages stop their servers and
    record the interruption), then kill what is still running after CANCEL_GRACE_S."""
    if not pending:
        return
    progress(f"ray: stopping {len(pending)} candidate task(s)")
    for ref in pending:
        ray.cancel(ref, force=False)
    _, left = ray.wait(pending, num_returns=len(pending), timeout=CANCEL_GRACE_S)
    for ref in left:
        ray.cancel(ref, force=True)  # its servers die with it (they follow their parent's death)


def _collected(ray, ref, name: str, submitted: float, progress: Progress) -> NodeOutcome:
    """One finished task's outcome (a task that still failed after Ray's retry is reported)."""
    try:
        done = ray.get(ref)
        out = NodeOutcome(name, waited_s=round(done.pop("started_at") - submitted, 2), **done)
    except Exception as err:  # noqa: BLE001 - one candidate's failure is said, the others go on
        said = (str(err).strip().splitlines() or [""])[-1][:300]
        out = NodeOutcome(name, failed=f"its Ray task failed ({type(err).__name__}: {said}; a task whose node "
                                       f"is lost is run {TASK_RETRIES} more time, an error in it is not)")
        progress(f"ray: candidate {name}: {out.failed}")
        return out
    how = (f"refused: {out.refused}" if out.refused else f"failed: {out.failed}" if out.failed else
           f"stopped early: {out.stopped_early}" if out.stopped_early else "checked")
    progress(f"ray: candidate {name} on {out.node} in {out.seconds:.0f} s: {how}"
             + (f" (after {out.attempts - 1} retry: its first node was lost)" if out.attempts > 1 else ""))
    return out


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


def read_back_problems(run_path: Path, written: dict[str, Any], own: dict[str, str]) -> list[str]:
    """The run folder on the shared storage against what its task handed back (`written`) and
    what this machine wrote there before the task (`own`, which wins): each added, missing or
    changed file, in words; the record's checkpoint files against the task's. Empty: it holds."""
    expected = {**written["files"], **own}
    files, others = folder_record.walk(run_path)
    problems = [f"not a plain file: {rel}" for rel in others
                if not rel.startswith(f"{CHECKPOINT_DIR}/") and rel not in written.get("not_files", [])]
    seen = set()
    for rel in files:
        if rel.startswith(f"{CHECKPOINT_DIR}/"):
            continue  # hashed against the checkpoint's record by the release stage
        seen.add(rel)
        if rel not in expected:
            problems.append(f"added file: {rel} (its task did not write it)")
        elif folder_record.file_digest(run_path / rel)["sha256"] != expected[rel]:
            problems.append(f"changed file: {rel} (not the sha256 its task handed back)")
    problems += [f"missing file: {rel} (its task wrote it)" for rel in expected if rel not in seen]
    if not problems and (record_problem := _checkpoint_record_problem(run_path, written)):
        problems.append(record_problem)
    return problems


def _checkpoint_record_problem(run_path: Path, written: dict[str, Any]) -> str | None:
    """run.json (its bytes checked already) against the checkpoint files the task recorded."""
    record = RunDir.open(run_path).record
    made = record.result("quantize") or record.result("checkpoint")
    mine = {rel: f.sha256 for rel, f in made.files.items()} if made is not None else None
    if mine != written.get("checkpoint"):
        return f"{RECORD_FILE}: its checkpoint files are not those its task recorded"
    return None


def check_read_back(cands: list[Candidate], outcomes: dict[str, NodeOutcome], own: dict[str, dict[str, str]]) -> None:
    """Every candidate's run folder as its task handed it back, before any decision or signature
    is made from it; IntegrityError (exit 3) naming the files otherwise (the records say so)."""
    wrong = {}
    for c in cands:
        out = outcomes.get(c.name)
        if out is None or out.written is None:  # the task itself failed: nothing is read from it to release
            continue
        problems = read_back_problems(c.run.path, out.written, own.get(c.name, {}))
        if problems:
            wrong[c.name] = problems
    if not wrong:
        return
    for c in [c for c in cands if c.name in wrong]:
        try:
            run = RunDir.open(c.run.path)
            run.record.status = "failed"
            run.save()
        except (QuantlabError, OSError, ValueError):
            pass  # a record that cannot be read back is among the problems named
    folders = {c.name: c.run.path for c in cands}
    said = "; ".join(f"candidate {n} ({folders[n]}): " + ", ".join(p[:8]) for n, p in wrong.items())
    raise IntegrityError(f"ray: the shared storage does not hold what the candidates' tasks wrote; nothing is decided "
                         f"or signed from it: {said}. Something changed the storage folder after the tasks ended: "
                         "run the comparison again", cause="the shared storage changed after its tasks wrote it")


def _adopt(c: Candidate, out: NodeOutcome, progress: Progress, verbose: bool, family: Family) -> None:
    """The candidate's run folder as its task left it, ready for the driver's release."""
    c.run = RunDir.open(c.run.path)
    c.ctx = RunContext(c.loaded, c.run, progress, verbose=verbose, stages=STAGES, family=family)
    c.ctx.enabled_stages = {s.NAME for s in STAGES if enabled(s, c.ctx)}
    c.todo = {release_stage.NAME: f"the checks ran on {out.node}"}
    c.ctx.will_run = set(c.todo)
    if out.refused:
        c.refused = out.refused
    elif out.failed:
        c.failed = out.failed
    if c.refused or c.failed:
        if c.run.record.status == "running":
            c.run.record.status = "failed"
        c.run.save()


def _candidate_task(loaded: LoadedRecipe, run_path: str, job: str, family: Family | None = None,
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
    run = RunDir.open(Path(run_path))
    marks = run.path / ATTEMPTS_DIR
    marks.mkdir(exist_ok=True)
    (marks / f"{node_id[:8]}.{os.getpid()}").write_text(str(started_at))
    attempts = len(list(marks.iterdir()))
    run.record.placement = {"node": node, "ray_node_id": node_id, "ray_job_id": job, "attempt": attempts}
    if attempts > 1:  # what the lost node served and measured is redone here; a finished checkpoint is kept
        run.record.stages = {n: r for n, r in run.record.stages.items() if n in ("quantize", "checkpoint")}
        for partial in [*run.path.glob(".*.partial"), *run.path.glob(".*.old-*")]:
            remove_tree(partial)  # what the lost attempt was writing
    run.record.status = "running"
    run.save()
    said = _node_log(run.path / NODE_LOG)
    out: dict[str, Any] = {"node": node, "started_at": started_at, "attempts": attempts}
    ctx = RunContext(loaded, run, progress=said, stages=node_stages(), family=family)
    try:
        try:
            todo = stages_to_run(ctx)
            ctx.will_run = set(todo)
            for stage in ctx.stages:
                if stage.NAME in todo:
                    stage.preflight(ctx)
        except RecipeError as err:
            out["refused"] = f"refused by its preflight on {node}: {err}"
            return out
        ctx.needs_baseline = lambda: baseline_needed(ctx)
        for stage in ctx.stages:
            if not enabled(stage, ctx):
                continue
            try:
                if stage.NAME in todo:
                    said(f"stage {stage.NAME}: {todo[stage.NAME]}")
                    run_stage(ctx, stage)
                if stage.NAME in CHECKPOINT_STAGES:  # as in a single run
                    guard_checkpoint(ctx, made_now=stage.NAME in todo)
            except QuantlabError as err:
                out["failed"] = f"stage {stage.NAME} failed on {node}: {err}"
                return out
            stop = _stopped_early(ctx, stage.NAME)
            if stop:
                out["stopped_early"] = run.record.stopped_early = stop
                said(f"stopped early: {stop}")
                return out
        return out
    finally:
        ctx.close_engines()
        unlock_checkpoint(ctx)
        run.save()
        out["seconds"] = round(time.monotonic() - t0, 1)
        out["written"] = written_files(run.path, run.record)  # last: nothing is written after it


def _stopped_early(ctx: RunContext, stage: str) -> str | None:
    """Racing (quality.samples auto): after the quality stage, a required gate that
    failed ends the candidate's checks (nothing later can undo a failed gate)."""
    q = ctx.recipe.quality
    if stage != "quality" or q is None or q.samples != "auto":
        return None
    failed = [v for v in release_stage.decide_run(ctx).blocking if v.verdict == "fail"]
    if not failed:
        return None
    looks = len(list((ctx.run.path / QUALITY_DIR / "candidate").glob("look-*")))  # quality/stage.py's folders
    return f"blocked at look {looks} of its quality stage: {blocking_line(failed[0])}"


def _node_log(path: Path) -> Progress:
    """Progress of a task on its node, appended to a file in its run folder (the driver
    prints its own lines; this one is read afterwards)."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def said(msg: str) -> None:
        with path.open("a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {msg}\n")

    return said


PLACEMENT_FILE = "placement.json"


def write_placement(folder: Path, outcomes: dict[str, NodeOutcome]) -> None:
    """Where each candidate ran, how long it waited for a node and took there, beside the
    comparison's files."""
    import json

    write_text_atomic(folder / PLACEMENT_FILE, json.dumps({n: {k: v for k, v in o.__dict__.items() if k != "written"}
                                                          for n, o in outcomes.items()}, indent=2))
