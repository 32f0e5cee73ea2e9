"""Past one machine: joining a Ray cluster, and what a candidate's task asks of it.

`quantlab run a.yaml b.yaml --ray ADDRESS --storage DIR` runs each candidate as a Ray task
(executors/ray_driver.py, executors/ray_node.py); this module is the cluster's side of
it: join or start the cluster (an unreachable address is said within seconds, not after
Ray's minutes of retries), check the storage folder every node writes to, and refuse at
once a task no node can hold (Ray would otherwise wait for resources that never come).

Ray is imported only here, in ray_driver and in ray_node, and only when `--ray` is given:
the CLI starts as fast as ever.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from quantlab.core.errors import RecipeError
from quantlab.core.progress import Progress
from quantlab.recipe.file import LoadedRecipe

CACHE_SUBDIR = "cache"  # in the storage folder: the checkpoints and baseline results every node shares
RUNS_SUBDIR = "runs"  # in the storage folder: the comparison's run folders, written by the nodes
LOCAL_OBJECT_STORE_BYTES = 128 * 2**20  # --ray local: checkpoints go through storage, not the object store


def shared_cache(storage: Path) -> Path:
    """The caches every node shares in the storage folder: checkpoints and the baseline's
    quality and stability results (core.result_cache.SHARED_KINDS). The probe cache and the
    signing key stay each machine's own."""
    return Path(storage).resolve() / CACHE_SUBDIR


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


def check_storage_creatable(storage: Path) -> None:
    """What can be told of the storage folder without creating anything (check_storage
    creates it once the cluster is joined): its nearest existing folder must be a folder
    this process can write in."""
    folder = Path(storage).expanduser().resolve()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "is not a folder" if not existing.is_dir() else "is not writable by this user"
        raise RecipeError(f"--storage {storage}: {existing} {what}; give a folder every Ray node can write (NFS or "
                          "a mounted bucket)", field="--storage")


SETUP_HOOK_ENV = "QUANTLAB_RAY_WORKER_SETUP_HOOK"  # "module.function": run in every Ray worker before its tasks


def worker_setup(progress: Progress) -> dict[str, Any] | None:
    """The job's runtime_env when SETUP_HOOK_ENV names a function ("module.function", the
    string form of Ray's `worker_process_setup_hook`): every worker of this job calls it
    before any task. Unset (every production run): None, Ray's default. It exists for
    code that changes quantlab in the driver and must change it in each worker too (the
    tests' stage lists: tests/data/stages/with_dummy_stage.py). The module must be found
    here; a folder outside the installed packages that holds it goes first on the workers'
    PYTHONPATH (the same path on every node, as Ray assumes of a driver's script). The
    driver says which hook it installed: nothing runs in the workers unannounced."""
    import importlib.util
    import site

    hook = os.environ.get(SETUP_HOOK_ENV, "").strip()
    if not hook:
        return None
    module, _, function = hook.rpartition(".")
    spec = importlib.util.find_spec(module.split(".")[0]) if module and function.isidentifier() else None
    if spec is None or spec.origin is None:
        raise RecipeError(f"{SETUP_HOOK_ENV}={hook}: expected module.function with the module importable here "
                          "(it runs in every Ray worker before its tasks); unset it for a plain run",
                          field=SETUP_HOOK_ENV)
    found = Path(spec.origin).parent  # a module's folder, or a package's own folder
    folder = found.parent if spec.submodule_search_locations else found
    installed = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    env = {} if folder.resolve() in installed else {"PYTHONPATH": f"{folder}{os.pathsep}${{PYTHONPATH}}"}
    progress(f"ray: every worker of this job runs {hook} before its tasks ({SETUP_HOOK_ENV}"
             + (f"; {folder} first on its PYTHONPATH)" if env else ")"))
    return {"worker_process_setup_hook": hook, "env_vars": env}


def connect(address: str, *, progress: Progress) -> dict[str, Any]:
    """Join the cluster at `address` ('auto': the one `ray start` made here; 'local': start
    one in this process). Returns what the cluster has (its nodes and resources)."""
    try:
        import ray
    except ImportError:
        raise RecipeError("--ray needs the `ray` package in quantlab's environment: pip install ray==2.60.0 "
                          "(scripts/setup.sh installs it)", field="--ray") from None
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    setup = worker_setup(progress)
    if setup is not None:
        kwargs["runtime_env"] = setup
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


NODE_CHECK_DEADLINE_S = 60.0  # a node that cannot start a task in this long is named as not answering


def check_storage_on_nodes(storage: Path) -> None:
    """Every alive node writes and removes a file in the storage folder (a task of no CPU
    pinned to each node): a node where the folder is not mounted, or read-only, is named
    before any candidate's task starts."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(_write_probe)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = {probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(str(storage)): n for n in nodes}
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=NODE_CHECK_DEADLINE_S)
    problems = [(refs[r], ray.get(r)) for r in ready] + [(refs[r], f"no answer within {NODE_CHECK_DEADLINE_S:.0f} s")
                                                          for r in pending]
    for ref in pending:
        ray.cancel(ref, force=True)
    problems = [f"node {n.get('NodeManagerHostname')}/{n['NodeID'][:8]}: {why}" for n, why in problems if why]
    if problems:
        raise RecipeError(f"--storage {storage}: not writable from {len(problems)} of {len(nodes)} Ray node(s) ("
                          + "; ".join(problems) + "); mount the same folder at the same path on every node (NFS "
                          "or a mounted bucket)", field="--storage")


def _write_probe(storage: str) -> str | None:
    """Runs on one node: None where it can write in `storage`, else why not."""
    import socket

    folder = Path(storage)
    if not folder.is_dir():
        return f"{storage} does not exist there"
    probe = folder / f".quantlab-node-check-{socket.gethostname()}-{os.getpid()}"
    try:
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        return f"cannot write there ({err})"
    return None


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def task_resources(loaded: LoadedRecipe, cpus: int = 1) -> dict[str, float]:
    """What a candidate's task asks of one node: `cpus` CPUs (its torch threads and the
    engines' own), and on CUDA the GPUs its server spans (tensor x pipeline parallel size
    from serve.engine_args) or its calibration ranks (quantization.distributed), the more. A server across nodes
    is vLLM's own (`distributed_executor_backend: ray`), not a task's."""
    spec = loaded.recipe.serve
    if spec.device != "cuda":
        return {"num_cpus": float(cpus)}
    args = spec.engine_args or {}
    gpus = int(args.get("tensor_parallel_size", 1) or 1) * int(args.get("pipeline_parallel_size", 1) or 1)
    distributed = loaded.recipe.quantization.distributed  # one GPU a calibration rank, on the same node
    gpus = max(gpus, distributed.nproc_per_node if distributed is not None else 1)
    return {"num_gpus": float(gpus), "num_cpus": float(cpus)}


def check_fits(loaded: list[LoadedRecipe], nodes: list[dict[str, float]], cpus: int) -> None:
    """Every task must fit on one node of the cluster (Ray would otherwise wait for
    resources that never come): a clear error naming the recipe and the largest node."""
    for lr in loaded:
        for key, want in task_resources(lr, cpus).items():
            name = {"num_cpus": "CPU", "num_gpus": "GPU"}[key]
            most = max((n.get(name, 0.0) for n in nodes), default=0.0)
            if most < want:
                raise RecipeError(f"{lr.path}: its task asks for {want:g} {name}(s) on one node (serve.device "
                                  f"{lr.recipe.serve.device}, serve.engine_args tensor x pipeline parallel size, "
                                  f"--ray-cpus {cpus}), and the Ray cluster's largest "
                                  f"node has {most:g}; add nodes with them, or lower --ray-cpus",
                                  file=str(lr.path), field="serve.engine_args" if name == "GPU" else "--ray-cpus")
