"""Ray's cost for the part of a comparison that runs on it today, the candidates'
quantization: the same recipes quantized one after another here (as the local comparison
does) and as Ray tasks on a local cluster of N nodes (ray.cluster_utils.Cluster, all on
this machine), side by side in one run, each from an empty checkpoint cache.


Reported: the wall time of each side and their ratio; per task, the wait from submit to
its start on a node (Ray's scheduling and worker start, plus waiting for a free node
when there are more tasks than nodes) and its own wall time; the cluster's start; and
Ray's overhead per candidate = (the scheduling latency, the shortest wait, + its share of
the cluster start) / (that + the task's own wall time). Say the CPU kind with the figures (lscpu).
A task asks for one CPU, so Ray runs its torch with one thread; the local side uses all.

    python scripts/bench_ray.py [--nodes 2] [--cpus-per-node 1] [recipes ...]

Default recipes: rtn-w8a16, fp8-dynamic and demo-gptq-w4a16 on the embedded default
model (quantization only: no server is started).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_RECIPES = ("rtn-w8a16", "fp8-dynamic", "demo-gptq-w4a16")


def fresh_checkpoints(root: Path, name: str) -> Path:
    """An empty checkpoint cache (the rest of the quantlab cache, the converted default
    model among it, is shared: its conversion is not what is measured)."""
    folder = root / name
    folder.mkdir(parents=True)
    return folder


def with_reuse(recipe: Path, folder: Path) -> Path:
    """The recipe with quantization.reuse_checkpoint on (the shared cache carries the
    checkpoint), written beside the shipped ones so its relative paths resolve."""
    import yaml

    data = yaml.safe_load(recipe.read_text())
    data.setdefault("quantization", {})["reuse_checkpoint"] = True
    out = recipe.parent / f".bench-ray-{folder.name}-{recipe.name}"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def local_side(recipes: list[Path], checkpoints: Path) -> dict:
    from quantlab.core.run import RunDir
    from quantlab.pipeline.context import RunContext
    from quantlab.quantize import stage as quantize_stage
    from quantlab.recipe.file import load_recipe

    os.environ["QUANTLAB_CHECKPOINT_CACHE"] = str(checkpoints)
    per, t0 = {}, time.monotonic()
    for r in recipes:
        t = time.monotonic()
        loaded = load_recipe(r)
        run = RunDir.create(loaded, checkpoints.parent / "local-runs")
        ctx = RunContext(loaded, run, progress=lambda _m: None)
        quantize_stage.preflight(ctx)
        quantize_stage.run(ctx)
        per[loaded.recipe.name] = round(time.monotonic() - t, 1)
    return {"wall_s": round(time.monotonic() - t0, 1), "per_candidate_s": per}


def ray_side(recipes: list[Path], storage: Path, nodes: int, cpus: int) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from quantlab.pipeline.ray_quantize import connect, disconnect, quantize_candidates

    t0 = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "include_dashboard": False,
                                                            "object_store_memory": 128 * 2**20})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=cpus, object_store_memory=128 * 2**20)
    started = round(time.monotonic() - t0, 1)
    try:
        t1 = time.monotonic()
        connect(cluster.address, progress=lambda _m: None)
        joined = round(time.monotonic() - t1, 1)
        t2 = time.monotonic()
        done = quantize_candidates(recipes, storage, progress=print)
        wall = round(time.monotonic() - t2, 1)
        alive = len([n for n in ray.nodes() if n.get("Alive")])
    finally:
        disconnect()
        cluster.shutdown()
    share = (started + joined) / max(1, len(done))
    # a task submitted beyond the nodes' capacity waits for a free node too: Ray's own
    # scheduling latency is the wait of a task that found one free
    latency = min((q.waited_s for q in done if q.error is None), default=0.0)
    rows = {q.name: {"node": q.node, "waited_s": q.waited_s, "task_s": q.seconds, "error": q.error,
                     "overhead": round((latency + share) / (latency + q.seconds + share), 3)
                     if q.error is None else None} for q in done}
    return {"cluster_start_s": started, "join_s": joined, "scheduling_latency_s": latency, "wall_s": wall,
            "nodes": alive, "tasks": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipes", nargs="*", default=list(DEFAULT_RECIPES), help="shipped recipe names or files")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--cpus-per-node", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    shipped = REPO / "recipes"
    written = []
    try:
        files = [Path(r) if r.endswith(".yaml") else shipped / f"{r}.yaml" for r in args.recipes]
        local_recipes = [with_reuse(f, root) for f in files]
        written += local_recipes
        local = local_side(local_recipes, fresh_checkpoints(root, "local-checkpoints"))
        storage = root / "storage"
        fresh_checkpoints(storage, "checkpoints")
        os.environ.pop("QUANTLAB_CHECKPOINT_CACHE", None)
        on_ray = ray_side(local_recipes, storage, args.nodes, args.cpus_per_node)
    finally:
        for f in written:
            f.unlink(missing_ok=True)
        shutil.rmtree(root, ignore_errors=True)
    overheads = [t["overhead"] for t in on_ray["tasks"].values() if t["overhead"] is not None]
    out = {"cpu": os.popen("lscpu | grep 'Model name' | cut -d: -f2").read().strip(), "cores": os.cpu_count(),
           "nodes": args.nodes, "cpus_per_node": args.cpus_per_node, "local": local, "ray": on_ray,
           "wall_ratio_ray_over_local": round(on_ray["wall_s"] / local["wall_s"], 3) if local["wall_s"] else None,
           "median_overhead": statistics.median(overheads) if overheads else None}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
