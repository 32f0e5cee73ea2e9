"""`quantlab run a.yaml b.yaml --ray` on a real Ray cluster on this machine
(ray.cluster_utils: a head and two workers of one CPU each, small object stores), tiny
model: each candidate is a task that quantizes, serves and checks on a node of its own,
its run folder (records, engine logs) in the storage folder; the driver decides, chooses
and signs. A node lost mid-task makes Ray run that candidate again on the free node; the
decisions, every quality verdict by gate id and the choice are those of a local
comparison of the same recipes; a candidate that fails a required gate with
`samples: auto` is stopped after its quality stage. Both comparisons run with one more
stage in STAGES (tests/data/stages/with_dummy_stage.py, handed to the Ray workers as the
job's setup hook), and each task runs it. Ctrl-C stops every task."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import COMPARISON_PERF as TINY_PERF, REPO, quiet, tiny_variant, write_recipe

from quantlab.core.errors import RecipeError
from quantlab.core.layout import MANIFEST_FILE
from quantlab.release.signing_key import local_public_key

DUMMY_STAGE_DIR = REPO / "tests" / "data" / "stages"  # with_dummy_stage.py: one more stage in STAGES

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray", reason="ray is installed by scripts/setup.sh (pyproject's dependencies)")


def ray_processes() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    return [line for line in ps if "raylet" in line or "gcs_server" in line or line.startswith("ray::")]


def candidate(folder, name: str, recipe: str, model_dir, *, max_mean_kl: float):
    data = tiny_variant(recipe, model_dir)
    data["name"] = name
    data["quantization"]["reuse_checkpoint"] = True  # the shared cache is how a checkpoint travels
    data["serve"] = {"engine_args": {"max_model_len": 512}, "side_by_side": True}
    data["performance"] = TINY_PERF
    # a KL gate each candidate sets for itself: the broken one's cannot be met by any quantized model
    data["quality"] = {"tasks": ["ql_lastword"], "limit": 10, "samples": "auto", "sequential": {"first": 10},
                       "kl": {"max_texts": 4, "max_tokens": 64, "max_mean_kl": max_mean_kl},
                       "gates": {"non_inferiority_margin": None}, "pooled": None}
    data["stability"] = {"prompts": 2, "max_tokens": 8, "lengths": None, "soak": None}
    data["selection"] = {"rule": "highest_throughput"}
    return write_recipe(folder, data, f"{name}.yaml")


def test_ctrl_c_stops_every_task_and_the_cluster_it_started(tmp_path, tiny_model_dir, served_format):
    """Runs first (before the module's cluster exists): `--ray local` interrupted while its
    tasks run exits 130 and leaves no Ray process behind."""
    assert not ray_processes(), "a Ray cluster is already running on this machine"
    recipes = [candidate(tmp_path, n, served_format.recipe, tiny_model_dir, max_mean_kl=50.0) for n in ("a", "b")]
    storage = tmp_path / "storage"
    # SIGINT as a terminal's Ctrl-C delivers it: a suite started in the background by a non-interactive
    # shell inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler (the run
    # would finish, exit 0, and this test would fail for how it was launched)
    proc = subprocess.Popen([sys.executable, "-m", "quantlab", "run", *map(str, recipes), "--ray", "local",
                             "--storage", str(storage), "--runs-dir", str(tmp_path / "runs")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 180
        while not list(storage.glob("runs/compare/*/candidates/*/*/ray-attempts/*")):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate(timeout=30)
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    deadline = time.monotonic() + 30
    while ray_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ray_processes(), ray_processes()
    assert not list(storage.rglob("*.partial"))  # nothing half-written is left in storage


@pytest.fixture(scope="module")
def cluster():
    """A head and two workers of one CPU each on this machine (all share its cores)."""
    from ray.cluster_utils import Cluster

    small = {"num_cpus": 1, "object_store_memory": 96 * 2**20}
    c = Cluster(initialize_head=True, head_node_args={**small, "include_dashboard": False})
    workers = [c.add_node(**small), c.add_node(**small)]
    c.wait_for_nodes()
    yield c, workers
    c.shutdown()


def test_an_address_nobody_answers_at_is_a_clear_error_at_once(tmp_path):
    r = subprocess.run([sys.executable, "-m", "quantlab", "run", str(REPO / "recipes" / "rtn-w8a16.yaml"),
                        "--ray", "127.0.0.1:9", "--storage", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "--ray 127.0.0.1:9: nothing answers there" in r.stderr, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "quantlab", "run", str(REPO / "recipes" / "rtn-w8a16.yaml"),
                        "--ray", "auto"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={**__import__("os").environ, "RAY_ADDRESS": ""})
    assert r.returncode == 2 and "needs --storage" in r.stderr, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "quantlab", "search", str(REPO / "recipes" / "rtn-w8a16.yaml"),
                        "--ray", "127.0.0.1:9", "--storage", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "--ray 127.0.0.1:9: nothing answers there" in r.stderr, r.stderr[-2000:]


def test_a_storage_folder_a_node_cannot_write_is_named_before_any_task(tmp_path, cluster):
    from quantlab.executors.ray_cluster import check_storage_on_nodes, connect, disconnect

    connect(cluster[0].address, progress=quiet)
    try:
        check_storage_on_nodes(tmp_path)  # every node writes here
        with pytest.raises(RecipeError, match=r"--storage .*missing: not writable from 3 of 3 Ray node\(s\) \(node "
                                              r".*does not exist there"):
            check_storage_on_nodes(tmp_path / "missing")
    finally:
        disconnect()


def test_a_task_the_cluster_cannot_hold_is_refused_before_any_work(tmp_path, tiny_model_dir, cluster,
                                                                   served_format):
    """Ray would wait forever for a GPU a CPU cluster never gets: say so at once, naming the recipe."""
    from quantlab.executors.ray_cluster import check_storage, connect, disconnect
    from quantlab.executors.ray_driver import run_comparison_on_ray

    data = tiny_variant("rtn-w8a16", tiny_model_dir)
    data["quality"] = {"tasks": ["ql_lastword"], "limit": 10}
    data["serve"] = {"device": "cuda", "engine_args": {"tensor_parallel_size": 2}}
    gpu_recipe = write_recipe(tmp_path / "r", data, "gpu.yaml")
    storage = check_storage(tmp_path / "storage")
    connect(cluster[0].address, progress=quiet)
    try:
        with pytest.raises(RecipeError, match=r"gpu.yaml: its task asks for 2 GPU\(s\) on one node .* node has 0"):
            run_comparison_on_ray([gpu_recipe], storage, progress=quiet)
        cpu_recipe = candidate(tmp_path / "c", "c", served_format.recipe, tiny_model_dir, max_mean_kl=50.0)
        with pytest.raises(RecipeError, match=r"asks for 3 CPU\(s\) .*--ray-cpus 3.* largest node has 1"):
            run_comparison_on_ray([cpu_recipe], storage, progress=quiet, cpus=3)
    finally:
        disconnect()
    assert not (storage / "runs").exists()  # nothing was submitted


@pytest.fixture(scope="module")
def local_and_ray(tmp_path_factory, tiny_model_dir, served_format, cluster):
    """The same two recipes (good, broken) compared here and on the cluster, where the
    node of one candidate is removed while its task runs: (local, on_ray, lines, lost).
    Both run under tests/data/stages/with_dummy_stage.py's stage lists: this process's,
    and each Ray worker's through the job's setup hook."""
    root = tmp_path_factory.mktemp("ray-compare")
    recipes = [candidate(root / "recipes", "good", served_format.recipe, tiny_model_dir, max_mean_kl=50.0),
               candidate(root / "recipes", "broken", served_format.recipe, tiny_model_dir, max_mean_kl=1e-9)]
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(DUMMY_STAGE_DIR))
        from with_dummy_stage import dummy_stage_added

        with dummy_stage_added():
            return compare_here_and_on_ray(root, recipes, cluster)


def compare_here_and_on_ray(root, recipes, cluster):
    from quantlab.executors.ray_cluster import check_storage, connect, disconnect
    from quantlab.executors.ray_driver import run_comparison_on_ray
    from quantlab.pipeline.candidates.run import run_comparison

    local = run_comparison(recipes, root / "runs", progress=quiet)
    c, workers = cluster
    storage = check_storage(root / "storage")
    lines: list[str] = []
    connect(c.address, progress=lines.append)
    out: dict = {}
    runner = threading.Thread(target=lambda: out.update(done=run_comparison_on_ray(recipes, storage,
                                                                                  progress=lines.append)),
                              daemon=True)  # a failed assertion below must not keep pytest waiting for it
    lost = None
    try:
        runner.start()
        deadline = time.monotonic() + 300
        while len(marks := list(storage.glob("runs/compare/*/candidates/*/*/ray-attempts/*"))) < 2:
            assert time.monotonic() < deadline and runner.is_alive(), lines
            time.sleep(0.2)
        # the node of one task, not the head's (the cluster cannot lose its head)
        by_id = {w.node_id[:8]: w for w in workers}
        lost = next((m for m in marks if m.name.split(".")[0] in by_id), None)
        assert lost is not None, (marks, list(by_id))
        c.remove_node(by_id[lost.name.split(".")[0]], allow_graceful=False)
        runner.join(timeout=1500)
        assert not runner.is_alive(), lines
    finally:
        disconnect()
    return local, out["done"], lines, lost.parents[2].name


def verdicts(run_dir, stage: str) -> dict[str, str]:
    record = json.loads((run_dir / "run.json").read_text())
    result = (record["stages"].get(stage) or {}).get("result") or {}
    return {f"{g['check']}.{g['gate']}@{g['scope']}": g["verdict"] for g in result.get("gates", [])}


def test_each_candidate_is_checked_on_a_node_and_decided_as_a_local_run(local_and_ray):
    local, on_ray, lines, lost = local_and_ray
    assert any("2 candidate task(s) submitted" in ln for ln in lines), lines
    rows = {r["name"]: r for r in on_ray.data["candidates"]}
    local_rows = {r["name"]: r for r in local.data["candidates"]}
    # the same decision per candidate, the same quality verdict per gate id, the same choice
    assert {n: r["decision"] for n, r in rows.items()} == {n: r["decision"] for n, r in local_rows.items()}
    assert rows["good"]["decision"] == "release" and rows["broken"]["decision"] != "release"
    assert on_ray.choice.chosen == local.choice.chosen == "good"
    runs = {c.name: c.run for c in on_ray.candidates}
    local_runs = {c.name: c.run for c in local.candidates}
    for name in ("good", "broken"):
        assert verdicts(runs[name].path, "quality") == verdicts(local_runs[name].path, "quality"), name
        record = runs[name].record
        assert record.placement and record.placement["ray_job_id"], record.placement
        # its engines' logs and what its task said are in its run folder
        assert (runs[name].path / "serve" / "candidate-server.log").is_file(), name
        assert (runs[name].path / "logs" / "node-progress.log").is_file(), name
        # only the driver signs: the manifest names the node its checks ran on and the Ray job
        manifest = json.loads((runs[name].path / "checkpoint" / MANIFEST_FILE).read_text())
        assert manifest["run"]["placement"]["node"] == record.placement["node"]
        assert manifest["hardware"]["cpu"], manifest["hardware"]  # the node's own probe, from its serve stage
    public = local_public_key()
    v = subprocess.run([sys.executable, "-m", "quantlab", "verify", runs["good"].path / "checkpoint", "--public-key",
                        public, "--allow-dev-key"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert v.returncode == 0, v.stdout + v.stderr  # signed here, verifiable as a local (development-key) release
    assert runs["good"].record.placement["node"] != runs["broken"].record.placement["node"] or \
        runs[lost].record.placement["attempt"] == 2
    # performance measured on the good one's node, baseline and candidate interleaved there
    assert runs["good"].record.result("performance") is not None
    assert rows["good"]["served_at"].startswith("Ray node ")


def test_a_node_lost_mid_task_runs_that_candidate_again_elsewhere(local_and_ray):
    _, on_ray, lines, lost = local_and_ray
    run = {c.name: c.run for c in on_ray.candidates}[lost]
    assert run.record.placement["attempt"] == 2, run.record.placement
    assert len(list((run.path / "ray-attempts").iterdir())) == 2
    assert any(f"candidate {lost} on" in ln and "after 1 retry: its first node was lost" in ln for ln in lines), lines
    assert not list(run.path.glob(".*.partial"))


def test_a_candidate_that_failed_a_required_gate_is_stopped_after_quality(local_and_ray):
    """Racing with samples: auto: the broken one's KL gate fails at quality, so its
    performance and stability never run (its node is free for the next task); the local
    comparison, which does not race, measured both."""
    local, on_ray, _, _ = local_and_ray
    broken = {c.name: c.run for c in on_ray.candidates}["broken"]
    assert broken.record.stopped_early and "kl" in broken.record.stopped_early.lower(), broken.record.stopped_early
    assert broken.record.stopped_early.startswith("blocked at look 1 of its quality stage: ")
    assert "performance" not in broken.record.stages and "stability" not in broken.record.stages
    good = {c.name: c.run for c in on_ray.candidates}["good"]
    assert good.record.stopped_early is None and "stability" in good.record.stages
    assert "performance" in {c.name: c.run for c in local.candidates}["broken"].record.stages


def test_a_stage_added_to_stages_runs_in_each_task_as_in_the_driver(local_and_ray):
    """The driver installed the wrapper's hook and said so; each Ray task ran the added
    stage after quality, as the local comparison did, but where racing stopped the
    candidate at quality (nothing after it runs there)."""
    local, on_ray, lines, _ = local_and_ray
    assert any("runs with_dummy_stage.add_dummy_stage before its tasks" in ln for ln in lines), lines
    for comparison in (local, on_ray):
        for c in comparison.candidates:
            record = c.run.record
            if record.stopped_early:
                assert comparison is on_ray and "dummy" not in record.stages, (c.name, list(record.stages))
                continue
            assert record.stages["dummy"].status == "ok", (c.name, record.stages.get("dummy"))
            order = list(record.stages)
            assert order.index("quality") < order.index("dummy"), order
            seen = (c.run.path / "dummy.txt").read_text().split()
            assert seen[0] == c.name and seen[1], seen
    assert {c.name for c in on_ray.candidates if "dummy" in c.run.record.stages} == {"good"}
