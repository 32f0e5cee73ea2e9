"""The driver's side of `quantlab run a.yaml b.yaml ... --ray ADDRESS --storage DIR`.

Each candidate is one Ray task (executors/ray_node.py), placed by Ray on a node that holds
what it asks for (ray_cluster.task_resources) and run again once elsewhere if that node is
lost (Ray's retry). Its run folder is in the storage folder, so its records, plots and
engine logs are where the driver reads them; the baseline's quality and stability results
go through the shared cache, so a second node of the same kind takes them instead of
evaluating them again.

The driver never serves: it checks before any task starts (the cluster can hold every
task, the storage folder is writable, the signing key is there), then takes each task's
run folder as it finishes, checked against what the task handed back
(executors/ray_read_back.py), makes every candidate's decision, the recipes' choice, and
runs each release stage itself (only the driver signs), then the comparison's files, as
the local comparison does. The manifest names the node the checks ran on (its hardware
from that node's own probe, in the serve result) and the Ray job. The shared cache's
entries are authenticated under the driver's cache secret, which each task receives as
its argument (core/cache_secret.use), never through an environment variable, a record or
a log.
"""

from __future__ import annotations

import time
from pathlib import Path

from quantlab.core import cache_secret
from quantlab.core.errors import EngineError, RecipeError
from quantlab.core.fsutil import write_text_atomic
from quantlab.core.progress import Progress
from quantlab.core.result_cache import SHARED_CACHE_ENV
from quantlab.core.run import RunDir
from quantlab.executors.ray_cluster import (RUNS_SUBDIR, check_fits, check_storage, check_storage_on_nodes,
                                            shared_cache, task_resources)
from quantlab.executors.ray_node import NodeOutcome, candidate_task
from quantlab.executors.ray_read_back import check_read_back, own_digests
from quantlab.pipeline.candidates.conclusion import conclude
from quantlab.pipeline.candidates.members import (CANDIDATES_DIR, Candidate, Comparison, candidates_of,
                                                  check_comparable, create_folder, selection_of)
from quantlab.pipeline.stage_run import mark_ended
from quantlab.pipeline.candidate_run import CandidateRun, start_clock
from quantlab.pipeline.candidates.run import choose_then_release, comparison_family, finish_candidate
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe
from quantlab.release import stage as release_stage

TASK_RETRIES = 1  # a task whose node is lost runs once more elsewhere (Ray's retry)
COMPARISON_DEADLINE_S = 24 * 3600  # the longest the candidates' tasks may take, queued ones included
WAIT_STEP_S = 1.0  # how often the wait wakes (a Ctrl-C is taken between two waits)
CANCEL_GRACE_S = 30.0  # a cancelled task's stages stop their servers within this, then it is killed


def run_comparison_on_ray(recipes: list[Path | LoadedRecipe], storage: Path, *, progress: Progress = print,
                          cpus: int = 1, verbose: bool = False, family: Family | None = None) -> Comparison:
    """The candidates as Ray tasks (connected already: ray_cluster.connect), then the
    choice and every release on this machine. One recipe is a comparison of one; a recipe
    may be one in memory (a search's trial), which travels to its node whole. The family
    (recipe/family.py; by default the candidates given) travels with each task: a
    candidate refused by its node's preflight still counts in it (known only there)."""
    import ray

    clock = start_clock()
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
        _register_here(c, folder, progress, verbose, family)
    own = own_digests(cands)  # what this machine wrote into each run folder: checked against its own digests
    try:
        outcomes = run_tasks(cands, storage, progress=progress, cpus=cpus,
                             stop_on_refusal=selection.unservable == "stop", family=family)
        check_read_back(cands, outcomes, own)
    except BaseException as err:  # Ctrl-C, the deadline, a refusal that stops all: no record stays "running"
        for c in cands:
            run = RunDir.open(c.run.path)
            if run.record.status == "running":
                mark_ended(run, err)
        raise
    write_placement(folder, outcomes)
    for c in cands:
        _adopt(c, outcomes[c.name], progress, verbose, family)
    choose_then_release(cands, selection)
    for c in cands:
        finish_candidate(c, clock)
    return conclude(folder, cands, selection, progress)


def _register_here(c: Candidate, folder: Path, progress: Progress, verbose: bool, family: Family) -> None:
    """The candidate's run folder and its registration, made and signed on this machine
    before any task starts an engine."""
    here = c.lifecycle = CandidateRun.create(c.loaded, folder / CANDIDATES_DIR, progress, verbose=verbose,
                                             family=family)
    here.plan()  # a recipe without any check is refused here, before any task
    here.preflight([release_stage.NAME])  # the signing key: on this machine, which signs
    here.ctx.baseline_model()  # the release here hashes the baseline's files: it must resolve here too
    here.register()  # signed here, before any task starts an engine


def run_tasks(cands: list[Candidate], storage: Path, *, progress: Progress, cpus: int = 1,
              stop_on_refusal: bool = False, family: Family | None = None) -> dict[str, NodeOutcome]:
    """Every candidate's task at once (Ray queues those no node can take yet); waits for
    all of them within COMPARISON_DEADLINE_S. On Ctrl-C, SIGTERM or the deadline every task is
    cancelled: its stages stop their servers (within CANCEL_GRACE_S), then it is killed."""
    import ray

    task = ray.remote(max_retries=TASK_RETRIES, retry_exceptions=False)(candidate_task)
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


def _adopt(c: Candidate, out: NodeOutcome, progress: Progress, verbose: bool, family: Family) -> None:
    """The candidate's run folder as its task left it, ready for the driver's release."""
    c.lifecycle = CandidateRun(c.loaded, RunDir.open(c.run.path), progress, verbose=verbose, family=family)
    c.lifecycle.adopt({release_stage.NAME: f"the checks ran on {out.node}"})
    if out.refused:
        c.refused = out.refused
    elif out.failed:
        c.failed = out.failed
    if c.refused or c.failed:
        c.lifecycle.end(if_running=True)


PLACEMENT_FILE = "placement.json"


def write_placement(folder: Path, outcomes: dict[str, NodeOutcome]) -> None:
    """Where each candidate ran, how long it waited for a node and took there, beside the
    comparison's files."""
    import json

    write_text_atomic(folder / PLACEMENT_FILE, json.dumps({n: {k: v for k, v in o.__dict__.items() if k != "written"}
                                                          for n, o in outcomes.items()}, indent=2))
