"""Past one machine, first part: each candidate's quantization as a Ray task.

`quantlab run a.yaml b.yaml --ray ADDRESS --storage DIR` quantizes every recipe candidate
as a task on the Ray cluster (Ray places it on a node with the CPUs and GPUs it asks for
and retries it once if its node is lost). The task runs the quantize stage itself, with
the checkpoint cache in the storage folder every node sees, so the checkpoint lands in the
checkpoint cache atomically, keyed by everything it depends on (the driver's own key for
it, which may name another CPU, is made an alias of the task's). The run on the driver
then finds it there (each file's sha256 checked against the record the task wrote, see
quantize/stage.py) and serves and checks as a local run does. Serving, the checks and
the performance comparison on the nodes that hold the checkpoints are the next part.

Ray is imported only here and only when `--ray` is given: the CLI starts as fast as ever.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantlab.core.errors import EngineError, RecipeError
from quantlab.core.fsutil import write_text_atomic
from quantlab.core.result_cache import CHECKPOINT_CACHE_ENV
from quantlab.core.progress import Progress
from quantlab.recipe.file import LoadedRecipe, load_recipe

CHECKPOINTS_SUBDIR = "checkpoints"  # in the storage folder: the checkpoint cache every node shares
SCRATCH_SUBDIR = "ray-quantize"  # in the storage folder: a task's throw-away run folder
TASK_RETRIES = 1  # a task whose node is lost runs once more elsewhere (Ray's retry)
TASK_DEADLINE_S = 12 * 3600  # the longest one quantization may take before the run gives up on it
WAIT_STEP_S = 1.0  # how often the wait wakes (a Ctrl-C is taken between two waits)
LOCAL_OBJECT_STORE_BYTES = 128 * 2**20  # --ray local: checkpoints go through storage, not the object store


@dataclass
class Quantized:
    """What one candidate's task did: where, how long, and the checkpoint's cache key."""

    name: str
    node: str | None = None  # the node's host name and Ray node id
    seconds: float | None = None  # the task's own wall time, on its node
    waited_s: float | None = None  # from submitting the task to its start on a node (Ray's scheduling)
    attempts: int = 1  # 2: its first node was lost and Ray ran it again elsewhere
    cache_key: str | None = None
    reused: bool = False
    error: str | None = None  # set when the task failed (after Ray's retry): quantized on the driver instead


def storage_cache(storage: Path) -> Path:
    """The checkpoint cache in the storage folder (only the checkpoints travel: every
    other cache, and the signing key, stay on each machine)."""
    return Path(storage).resolve() / CHECKPOINTS_SUBDIR


def check_storage(storage: Path) -> Path:
    """The storage folder, created and written to once (a folder no process can write is a
    clear error before any work, naming it)."""
    folder = Path(storage).expanduser().resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".quantlab-write-check-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise RecipeError(f"--storage {storage}: cannot write there ({err}); give a folder every Ray node can "
                          "write (NFS or a mounted bucket)", field="--storage") from None
    return folder


def connect(address: str, *, progress: Progress) -> dict[str, Any]:
    """Join the cluster at `address` ('auto': the one `ray start` made here; 'local': start
    one in this process). Returns what the cluster has (its nodes and resources)."""
    try:
        import ray
    except ImportError:
        raise RecipeError("--ray needs the `ray` package in quantlab's environment: pip install ray==2.60.0 "
                          "(scripts/setup.sh installs it)", field="--ray") from None
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address == "local":
        kwargs.update(num_cpus=os.cpu_count() or 1, object_store_memory=LOCAL_OBJECT_STORE_BYTES)
    else:
        _check_reachable(address)
        kwargs["address"] = address
    progress(f"ray: joining the cluster at {address}")
    try:
        ray.init(**kwargs)
    except Exception as err:  # noqa: BLE001 - Ray raises several kinds here; each is the same bad address
        raise RecipeError(f"--ray {address}: no Ray cluster could be joined there ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}); start one with `ray start --head`, "
                          "pass its address (or RAY_ADDRESS), or use --ray local", field="--ray") from None
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return {"nodes": len(nodes), "resources": ray.cluster_resources()}


CONNECT_DEADLINE_S = 10.0  # Ray itself retries an unreachable head for minutes


def _check_reachable(address: str) -> None:
    """An explicit host:port must answer a TCP connect within CONNECT_DEADLINE_S: Ray's own
    join waits minutes on an address nobody listens at."""
    import socket

    if address == "auto":
        return  # Ray finds the cluster's address itself (RAY_ADDRESS, or `ray start` here), says when there is none
    if address.startswith(("http://", "https://")):
        raise RecipeError(f"--ray {address}: that is a dashboard or Jobs API address; give the cluster's "
                          "host:port (its GCS, 6379 by default) or ray://host:10001", field="--ray")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")  # an IPv6 address in brackets
    if not host or not port.isdigit():
        raise RecipeError(f"--ray {address}: expected host:port (or 'auto', 'local')", field="--ray")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_DEADLINE_S).close()
    except OSError as err:
        raise RecipeError(f"--ray {address}: nothing answers there ({err}); start a cluster with `ray start "
                          "--head`, pass its address (or RAY_ADDRESS), or use --ray local", field="--ray") from None


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def task_resources(loaded: LoadedRecipe, cpus: int = 1) -> dict[str, float]:
    """What a candidate's quantization asks of a node: `cpus` CPUs (Ray runs its torch with
    as many threads), and one GPU where the recipe serves on CUDA (llm-compressor
    calibrates on it)."""
    device = loaded.recipe.serve.device
    return {"num_gpus": 1.0, "num_cpus": float(cpus)} if device == "cuda" else {"num_cpus": float(cpus)}


def check_fits(loaded: list[LoadedRecipe], nodes: list[dict[str, float]], cpus: int) -> None:
    """Every task must fit on one node of the cluster (Ray would otherwise wait for
    resources that never come): a clear error naming the recipe and the largest node."""
    for lr in loaded:
        for key, want in task_resources(lr, cpus).items():
            name = {"num_cpus": "CPU", "num_gpus": "GPU"}[key]
            most = max((n.get(name, 0.0) for n in nodes), default=0.0)
            if most < want:
                raise RecipeError(f"{lr.path}: its quantization asks for {want:g} {name}(s) (serve.device "
                                  f"{lr.recipe.serve.device}, --ray-cpus {cpus}), and the Ray cluster's largest "
                                  f"node has {most:g}; add nodes with them, or lower --ray-cpus",
                                  file=str(lr.path), field="serve.device" if name == "GPU" else "--ray-cpus")


def quantize_candidates(recipes: list[Path], storage: Path, *, progress: Progress, cpus: int = 1) -> list[Quantized]:
    """Every recipe's quantization as a Ray task at once; waits for all of them (each
    within TASK_DEADLINE_S). A task that still fails after Ray's retry is reported and its
    candidate quantized on the driver as a local run would."""
    import ray

    cache = storage_cache(storage)
    task = ray.remote(max_retries=TASK_RETRIES, retry_exceptions=False)(_quantize_task)
    loaded = [load_recipe(r) for r in recipes]
    todo = [lr for lr in loaded if lr.recipe.quantization.reuse_checkpoint]
    check_fits(todo, [n["Resources"] for n in ray.nodes() if n.get("Alive")], cpus)
    for lr in loaded:
        if lr not in todo:
            progress(f"ray: {lr.recipe.name} sets quantization.reuse_checkpoint: false, so it is quantized on the "
                     "driver (a checkpoint only reaches the driver through the shared cache)")
    env = {"env_vars": {CHECKPOINT_CACHE_ENV: str(cache)}}
    by_name = {lr.recipe.name: lr for lr in todo}
    submitted = time.time()
    batch = f"{int(submitted)}-{os.getpid()}"  # this run's tasks count their attempts under it
    refs = {task.options(runtime_env=env, name=f"quantize:{lr.recipe.name}", **task_resources(lr, cpus))
            .remote(str(lr.path), str(storage), batch): lr.recipe.name for lr in todo}
    progress(f"ray: {len(refs)} quantization task(s) submitted")
    done: list[Quantized] = []
    deadline = time.monotonic() + TASK_DEADLINE_S
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=min(WAIT_STEP_S, max(
                0.1, deadline - time.monotonic())))
            if not ready:
                if time.monotonic() >= deadline:
                    raise EngineError(f"ray: {len(pending)} quantization task(s) did not finish within "
                                      f"{TASK_DEADLINE_S} s: " + ", ".join(refs[r] for r in pending))
                continue
            q = _collected(ray, ready[0], refs, submitted, progress)
            if q.error is None:
                _alias_for_driver(by_name[q.name], q, cache)
            done.append(q)
    except BaseException:  # Ctrl-C, SIGTERM, the deadline: every task this run started is stopped
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        # this run's scratch: attempt marks, and the run folders of tasks a Ctrl-C killed
        shutil.rmtree(Path(storage) / SCRATCH_SUBDIR / batch, ignore_errors=True)
    return done


def _alias_for_driver(loaded: LoadedRecipe, q: Quantized, cache: Path) -> None:
    """The checkpoint's key as this machine computes it leads to the task's entry: with
    calibration_dtype auto the key names the host's CPU, which a task's node may not share."""
    import tempfile

    from quantlab.core.run import RunDir
    from quantlab.pipeline.context import RunContext
    from quantlab.quantize import stage as quantize_stage

    with tempfile.TemporaryDirectory() as tmp:
        ctx = RunContext(loaded, RunDir.create(loaded, Path(tmp)), progress=lambda _msg: None)
        mine = quantize_stage.cache_key(ctx)
    if mine and mine != q.cache_key:
        write_text_atomic(cache / f"{mine}.alias", q.cache_key)


def _collected(ray, ref, refs: dict, submitted: float, progress: Progress) -> Quantized:
    """One finished task's outcome (a failure after Ray's retry is reported, not raised)."""
    try:
        out = ray.get(ref)
        q = Quantized(refs[ref], node=out["node"], seconds=out["seconds"], cache_key=out["cache_key"],
                      reused=out["reused"], waited_s=round(out["started_at"] - submitted, 2),
                      attempts=out["attempts"])
        progress(f"ray: {q.name} quantized on {q.node} in {q.seconds:.0f} s"
                 + (" (from the shared cache)" if q.reused else "")
                 + (f", after {q.attempts - 1} retry: its first node was lost" if q.attempts > 1 else ""))
    except Exception as err:  # noqa: BLE001 - a task's failure is reported, the others go on
        said = (str(err).strip().splitlines() or [""])[-1][:300]
        q = Quantized(refs[ref], error=f"{type(err).__name__}: {said}")
        progress(f"ray: {q.name}'s quantization failed after {TASK_RETRIES} retry ({q.error}); it is quantized "
                 "on the driver instead")
    return q


def _quantize_task(recipe: str, storage: str, batch: str) -> dict[str, Any]:
    """Runs on a Ray node: the quantize stage in a scratch run folder, its checkpoint stored
    in the shared cache (the scratch folder is removed; the cache entry is what stays).
    Each attempt leaves a mark in the storage folder, so a retry is known and said."""
    import socket

    import ray

    from quantlab.core.run import RunDir
    from quantlab.pipeline.context import RunContext
    from quantlab.quantize import stage as quantize_stage

    started_at, t0 = time.time(), time.monotonic()
    loaded = load_recipe(Path(recipe))
    node_id = ray.get_runtime_context().get_node_id()
    marks = Path(storage) / SCRATCH_SUBDIR / batch / "attempts" / loaded.recipe.name
    marks.mkdir(parents=True, exist_ok=True)
    (marks / f"{node_id[:8]}.{os.getpid()}").write_text(str(started_at))
    run = RunDir.create(loaded, Path(storage) / SCRATCH_SUBDIR / batch / "runs")
    try:
        ctx = RunContext(loaded, run, progress=lambda _msg: None)
        reused = quantize_stage.reuses(ctx) is not None
        quantize_stage.preflight(ctx)
        result = quantize_stage.run(ctx)
        key = result.reused_from_cache or quantize_stage.cache_key(ctx)
    finally:
        shutil.rmtree(run.path, ignore_errors=True)
    attempts = len(list(marks.iterdir()))
    return {"node": f"{socket.gethostname()}/{node_id[:8]}", "seconds": round(time.monotonic() - t0, 1),
            "cache_key": key, "reused": reused, "started_at": started_at, "attempts": attempts}
