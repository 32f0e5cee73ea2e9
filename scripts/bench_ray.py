"""Ray's cost for a comparison run on it: the same candidates compared here (one baseline
server beside the candidates, as `quantlab run a.yaml b.yaml c.yaml` does) and as one Ray
task each on a local cluster of N nodes (ray.cluster_utils.Cluster, all on this machine:
every task quantizes, serves its own baseline and candidate, and checks on its node),
side by side in one run, each side from empty shared caches.

Reported: the wall time of each side and their ratio; per task, the wait from submit to
its start on a node (Ray's scheduling and worker start, plus waiting for a free node when
there are more tasks than nodes) and its own wall time; the cluster's start; and Ray's
overhead per candidate = (the scheduling latency, the shortest wait, + its share of the
cluster start) / (that + the task's own wall time). Say the CPU kind with the figures
(lscpu). On one machine the nodes share its cores, so the Ray side cannot be faster: what
it shows is the overhead, not the speed-up a cluster of real nodes gives.

    python scripts/bench_ray.py [--nodes 2] [--cpus-per-node 1] [recipes ...]

Default recipes: demo-gptq-w4a16, awq-w4a16 and demo-smoothquant-gptq-w8a8 on the embedded
default model, each with one serve section and small checks (KL on 4 texts, a 4-request
load, a short stability probe).
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

DEFAULT_RECIPES = ("demo-gptq-w4a16", "awq-w4a16", "demo-smoothquant-gptq-w8a8")


SMALL_CHECKS = {
    "quality": {"tasks": ["ql_lastword"], "limit": 10, "kl": {"max_texts": 4, "max_tokens": 32},
                "gates": {"non_inferiority_margin": None}, "pooled": None},
    "performance": {"workloads": [{"name": "short", "prompt_tokens": 32, "output_tokens": 8, "concurrency": [2],
                                   "num_requests": 4, "warmup_requests": 1}], "repeats": 2, "client_check": False},
    "stability": {"prompts": 2, "max_tokens": 8, "lengths": None, "soak": None},
    "selection": {"rule": "highest_throughput"},
}


def small_variant(recipe: Path, folder: Path) -> Path:
    """The recipe with small checks and quantization.reuse_checkpoint on (the shared cache
    carries the checkpoint), written beside the shipped ones so its relative paths resolve."""
    import yaml

    from quantlab.recipe.file import load_recipe

    data = load_recipe(recipe).recipe.model_dump(mode="json")  # whole, its base (extends:) merged in
    data["quantization"]["reuse_checkpoint"] = True
    data.update(SMALL_CHECKS)
    data["serve"] = {"side_by_side": True, "engine_args": {"max_model_len": 1024}}  # one baseline: one section
    out = recipe.parent / f".bench-ray-{folder.name}-{recipe.name}"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def local_side(recipes: list[Path], root: Path) -> dict:
    from quantlab.pipeline.candidates.run import run_comparison

    os.environ["QUANTLAB_SHARED_CACHE"] = str(root / "local-cache")  # empty: nothing reused from earlier runs
    try:
        t0 = time.monotonic()
        result = run_comparison(recipes, root / "local-runs", progress=lambda _m: None)
        wall = round(time.monotonic() - t0, 1)
    finally:
        os.environ.pop("QUANTLAB_SHARED_CACHE", None)
    return {"wall_s": wall, "decisions": {r["name"]: r["decision"] for r in result.data["candidates"]},
            "chosen": result.choice.chosen if result.choice else None}


def ray_side(recipes: list[Path], storage: Path, nodes: int, cpus: int) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from quantlab.executors.ray_cluster import connect, disconnect
    from quantlab.executors.ray_driver import PLACEMENT_FILE, run_comparison_on_ray

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
        result = run_comparison_on_ray(recipes, storage, progress=print, cpus=cpus)
        wall = round(time.monotonic() - t2, 1)
        alive = len([n for n in ray.nodes() if n.get("Alive")])
    finally:
        disconnect()
        cluster.shutdown()
    done = json.loads((result.folder / PLACEMENT_FILE).read_text())
    share = (started + joined) / max(1, len(done))
    # a task submitted beyond the nodes' capacity waits for a free node too: Ray's own
    # scheduling latency is the wait of a task that found one free
    latency = min((q["waited_s"] for q in done.values() if q["waited_s"] is not None), default=0.0)
    rows = {name: {"node": q["node"], "waited_s": q["waited_s"], "task_s": q["seconds"], "failed": q["failed"],
                   "overhead": round((latency + share) / (latency + q["seconds"] + share), 3)
                   if q["seconds"] else None} for name, q in done.items()}
    return {"cluster_start_s": started, "join_s": joined, "scheduling_latency_s": latency, "wall_s": wall,
            "nodes": alive, "tasks": rows, "decisions": {r["name"]: r["decision"] for r in result.data["candidates"]},
            "chosen": result.choice.chosen if result.choice else None}


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
        recipes = [small_variant(f, root) for f in files]
        written += recipes
        local = local_side(recipes, root)
        on_ray = ray_side(recipes, root / "storage", args.nodes, args.cpus_per_node)
    finally:
        for f in written:
            f.unlink(missing_ok=True)
        shutil.rmtree(root, ignore_errors=True)
    overheads = [t["overhead"] for t in on_ray["tasks"].values() if t["overhead"] is not None]
    out = {"cpu": os.popen("lscpu | grep 'Model name' | cut -d: -f2").read().strip(), "cores": os.cpu_count(),
           "nodes": args.nodes, "cpus_per_node": args.cpus_per_node, "local": local, "ray": on_ray,
           "wall_ratio_ray_over_local": round(on_ray["wall_s"] / local["wall_s"], 3) if local["wall_s"] else None,
           "median_overhead": statistics.median(overheads) if overheads else None,
           "same_decisions": local["decisions"] == on_ray["decisions"] and local["chosen"] == on_ray["chosen"]}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
