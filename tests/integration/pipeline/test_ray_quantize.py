"""Quantization as Ray tasks on a real Ray cluster of two nodes on this machine
(ray.cluster_utils: a head and a worker of one CPU each, small object stores), tiny
model: two recipes quantized at once run one on each node and land in the shared cache
of the storage folder, byte for byte what a local quantization writes; the driver's
quantize stage takes them from there with every file's sha256 checked, and a cached
checkpoint that does not match its record is replaced, never served; a node lost mid-task makes
Ray run that candidate again on the other node, and the run says so."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO, quiet, tiny_variant, write_recipe

from quantlab.core.errors import RecipeError
from quantlab.core.layout import QUANTIZE_RESULT_FILE

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray", reason="ray is installed by scripts/setup.sh (pyproject's dependencies)")

RECIPES = ("rtn-w8a16", "gptq-w4a16")


def ray_processes() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    return [line for line in ps if "raylet" in line or "gcs_server" in line or line.startswith("ray::")]


def test_ctrl_c_stops_every_task_and_the_cluster_it_started(tmp_path, tiny_model_dir):
    """Runs first (before the module's cluster exists): `--ray local` interrupted while its
    tasks run exits 130 and leaves no Ray process behind."""
    import signal

    assert not ray_processes(), "a Ray cluster is already running on this machine"
    recipes = tiny_recipes(tmp_path / "recipes", tiny_model_dir)
    storage = tmp_path / "storage"
    proc = subprocess.Popen([sys.executable, "-m", "quantlab", "run", *map(str, recipes), "--ray", "local",
                             "--storage", str(storage), "--runs-dir", str(tmp_path / "runs")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 180
        while not list((storage / "ray-quantize").glob("*/attempts/*/*")):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate(timeout=30)
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    deadline = time.monotonic() + 30
    while ray_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ray_processes(), ray_processes()
    assert not any((storage / "ray-quantize").iterdir())  # the killed tasks' scratch folders are gone


def tiny_recipes(folder, tiny_model_dir):
    recipes = []
    for name in RECIPES:
        data = tiny_variant(name, tiny_model_dir)
        data["quantization"]["reuse_checkpoint"] = True  # the shared cache is how a checkpoint travels
        recipes.append(write_recipe(folder, data, f"{name}.yaml"))
    return recipes


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes of one CPU each on this machine (both share its cores)."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                      "object_store_memory": 96 * 2**20})
    worker = c.add_node(num_cpus=1, object_store_memory=96 * 2**20)
    c.wait_for_nodes()
    yield c, worker
    c.shutdown()


@pytest.fixture(scope="module")
def on_ray(tmp_path_factory, tiny_model_dir, cluster):
    """Both recipes quantized by Ray tasks into one storage folder: (storage, recipes, results)."""
    from quantlab.pipeline.ray_quantize import check_storage, connect, disconnect, quantize_candidates

    root = tmp_path_factory.mktemp("ray")
    recipes = tiny_recipes(root / "recipes", tiny_model_dir)
    storage = check_storage(root / "storage")
    lines: list[str] = []
    info = connect(cluster[0].address, progress=lines.append)
    try:
        results = quantize_candidates(recipes, storage, progress=lines.append)
    finally:
        disconnect()
    assert info["nodes"] == 2 and info["resources"]["CPU"] == 2
    return storage, recipes, results, lines


def test_each_recipe_is_quantized_by_its_own_task_into_the_shared_cache(on_ray, tiny_checkpoints):
    storage, recipes, results, lines = on_ray
    from quantlab.recipe.file import load_recipe

    assert sorted(q.name for q in results) == sorted(load_recipe(r).recipe.name for r in recipes)
    assert all(q.error is None and q.cache_key and q.node and q.seconds > 0 for q in results), results
    assert any("2 quantization task(s) submitted" in ln for ln in lines)
    assert len({q.node for q in results}) == 2  # one CPU a node: each candidate on a node of its own
    assert all(q.attempts == 1 for q in results)
    root, _ = tiny_checkpoints
    for q, name in zip(sorted(results, key=lambda q: q.name), sorted(RECIPES)):
        cached = storage / "checkpoints" / q.cache_key
        assert (cached / "complete.json").is_file()
        mine = json.loads((cached / QUANTIZE_RESULT_FILE).read_text())["checkpoint"]["files"]
        local = json.loads((root / name / QUANTIZE_RESULT_FILE).read_text())["checkpoint"]["files"]
        # the same weights as quantizing here (the recipe copy names its own path, so it differs)
        assert mine["model.safetensors"]["sha256"] == local["model.safetensors"]["sha256"], name
    assert not any((storage / "ray-quantize").rglob("*.safetensors"))  # the tasks' scratch folders are gone


def test_the_driver_takes_the_checkpoint_from_the_shared_cache_and_checks_it(on_ray, tmp_path, monkeypatch):
    from quantlab.core.run import RunDir
    from quantlab.pipeline.context import RunContext
    from quantlab.quantize import stage as quantize_stage
    from quantlab.recipe.file import load_recipe

    storage, recipes, results, _ = on_ray
    monkeypatch.setenv("QUANTLAB_CHECKPOINT_CACHE", str(storage / "checkpoints"))
    loaded = load_recipe(recipes[0])
    key = {q.name: q.cache_key for q in results}[loaded.recipe.name]
    ctx = RunContext(loaded, RunDir.create(loaded, tmp_path / "runs"), progress=quiet)
    assert quantize_stage.reuses(ctx)
    result = quantize_stage.run(ctx)
    assert result.reused_from_cache == key
    # a cached checkpoint that is not the one its record describes is never served: it is
    # removed, said, and the recipe quantized again (its entry stored anew)
    cached = storage / "checkpoints" / key / "model.safetensors"
    good = json.loads((cached.parent / QUANTIZE_RESULT_FILE).read_text())["checkpoint"]["files"]
    cached.write_bytes(cached.read_bytes()[:-8] + b"\0" * 8)
    said: list[str] = []
    ctx2 = RunContext(loaded, RunDir.create(loaded, tmp_path / "runs"), progress=said.append)
    again = quantize_stage.run(ctx2)
    assert again.reused_from_cache is None
    assert any("does not match its record (model.safetensors has another sha256)" in s for s in said), said
    assert again.files["model.safetensors"].sha256 == good["model.safetensors"]["sha256"]  # RTN: the same again
    assert quantize_stage.reuses(RunContext(loaded, RunDir.create(loaded, tmp_path / "runs"), progress=quiet))


def test_an_address_nobody_answers_at_is_a_clear_error_at_once(tmp_path):
    r = subprocess.run([sys.executable, "-m", "quantlab", "run", str(REPO / "recipes" / "rtn-w8a16.yaml"),
                        "--ray", "127.0.0.1:9", "--storage", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "--ray 127.0.0.1:9: nothing answers there" in r.stderr, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "quantlab", "run", str(REPO / "recipes" / "rtn-w8a16.yaml"),
                        "--ray", "auto"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={**__import__("os").environ, "RAY_ADDRESS": ""})
    assert r.returncode == 2 and "needs --storage" in r.stderr, r.stderr[-2000:]


def test_the_driver_finds_a_checkpoint_keyed_on_another_cpu(tmp_path, tiny_model_dir, cluster, monkeypatch):
    """calibration_dtype auto puts the host's CPU in the checkpoint's key; a task's node may
    have another one: the driver's key is an alias of the task's."""
    from quantlab.core.run import RunDir
    from quantlab.pipeline.context import RunContext
    from quantlab.pipeline.ray_quantize import check_storage, connect, disconnect, quantize_candidates
    from quantlab.quantize import stage as quantize_stage
    from quantlab.recipe.file import load_recipe

    [recipe] = tiny_recipes(tmp_path / "r", tiny_model_dir)[:1]
    assert load_recipe(recipe).recipe.quantization.calibration_dtype == "auto"
    storage = check_storage(tmp_path / "storage")
    monkeypatch.setattr(quantize_stage, "host_kernel_identity", lambda: {"cpu": "the driver's own CPU"})
    connect(cluster[0].address, progress=quiet)
    try:
        [q] = quantize_candidates([recipe], storage, progress=quiet)
    finally:
        disconnect()
    monkeypatch.setenv("QUANTLAB_CHECKPOINT_CACHE", str(storage / "checkpoints"))
    loaded = load_recipe(recipe)
    ctx = RunContext(loaded, RunDir.create(loaded, tmp_path / "runs"), progress=quiet)
    assert quantize_stage.cache_key(ctx) != q.cache_key  # the two machines name it apart
    assert quantize_stage.run(ctx).reused_from_cache == quantize_stage.cache_key(ctx)


def test_a_task_the_cluster_cannot_hold_is_refused_before_any_work(tmp_path, tiny_model_dir, cluster):
    """Ray would wait forever for a GPU a CPU cluster never gets: say so at once, naming the recipe."""
    from quantlab.pipeline.ray_quantize import check_storage, connect, disconnect, quantize_candidates

    data = tiny_variant("rtn-w8a16", tiny_model_dir)
    data["quantization"]["reuse_checkpoint"] = True
    data.setdefault("serve", {})["device"] = "cuda"
    gpu_recipe = write_recipe(tmp_path / "r", data, "gpu.yaml")
    storage = check_storage(tmp_path / "storage")
    connect(cluster[0].address, progress=quiet)
    try:
        with pytest.raises(RecipeError, match=r"gpu.yaml: its quantization asks for 1 GPU\(s\) .* node has 0"):
            quantize_candidates([gpu_recipe], storage, progress=quiet)
        cpu_recipe = tiny_recipes(tmp_path / "c", tiny_model_dir)[0]
        with pytest.raises(RecipeError, match=r"asks for 3 CPU\(s\) .*--ray-cpus 3.* largest node has 1"):
            quantize_candidates([cpu_recipe], storage, progress=quiet, cpus=3)
    finally:
        disconnect()
    assert not (storage / "checkpoints").exists()  # nothing was submitted


def test_a_node_lost_mid_task_runs_that_candidate_again_on_the_other_node(tmp_path, tiny_model_dir, cluster):
    """Runs last: it removes the cluster's worker node while both tasks run (one a node),
    once both have started (their attempt marks are in the storage folder)."""
    from quantlab.pipeline.ray_quantize import SCRATCH_SUBDIR, check_storage, connect, disconnect, \
        quantize_candidates

    c, worker = cluster
    recipes = tiny_recipes(tmp_path / "recipes", tiny_model_dir)
    storage = check_storage(tmp_path / "storage")
    lines: list[str] = []
    connect(c.address, progress=lines.append)
    head = ray.get_runtime_context().get_node_id()[:8]
    out: dict = {}
    runner = threading.Thread(target=lambda: out.update(done=quantize_candidates(recipes, storage,
                                                                                 progress=lines.append)))
    try:
        runner.start()
        deadline = time.monotonic() + 120
        while len(list((storage / SCRATCH_SUBDIR).glob("*/attempts/*/*"))) < 2:
            assert time.monotonic() < deadline and runner.is_alive(), lines
            time.sleep(0.2)
        c.remove_node(worker, allow_graceful=False)
        runner.join(timeout=600)
        assert not runner.is_alive()
    finally:
        disconnect()
    done = out["done"]
    assert all(q.error is None for q in done), done
    [retried] = [q for q in done if q.attempts == 2]
    assert retried.node.endswith(head)  # its second attempt ran on the node that was left
    assert any(f"{retried.name} quantized on" in ln and "after 1 retry: its first node was lost" in ln
               for ln in lines), lines
    assert (storage / "checkpoints" / retried.cache_key / "complete.json").is_file()
