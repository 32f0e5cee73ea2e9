"""Quantization as Ray tasks on a real local Ray cluster (started in this process, both
cores, a small object store), tiny model: two recipes quantized at once land in the
shared cache of the storage folder, byte for byte what a local quantization writes; the
driver's quantize stage takes them from there with every file's sha256 checked, and a
cached checkpoint that does not match its record is refused by name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, quiet, tiny_variant, write_recipe

from quantlab.core.errors import RecipeError
from quantlab.core.layout import QUANTIZE_RESULT_FILE

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray", reason="ray is installed by scripts/setup.sh (pyproject's dependencies)")

RECIPES = ("rtn-w8a16", "gptq-w4a16")


@pytest.fixture(scope="module")
def on_ray(tmp_path_factory, tiny_model_dir):
    """Both recipes quantized by Ray tasks into one storage folder: (storage, recipes, results)."""
    from quantlab.pipeline.ray_quantize import check_storage, connect, disconnect, quantize_candidates

    root = tmp_path_factory.mktemp("ray")
    recipes = []
    for name in RECIPES:
        data = tiny_variant(name, tiny_model_dir)
        data["quantization"]["reuse_checkpoint"] = True  # the shared cache is how a checkpoint travels
        recipes.append(write_recipe(root / "recipes", data, f"{name}.yaml"))
    storage = check_storage(root / "storage")
    lines: list[str] = []
    info = connect("local", progress=lines.append)
    try:
        results = quantize_candidates(recipes, storage, progress=lines.append)
    finally:
        disconnect()
    assert info["nodes"] == 1 and info["resources"]["CPU"] >= 1
    return storage, recipes, results, lines


def test_each_recipe_is_quantized_by_its_own_task_into_the_shared_cache(on_ray, tiny_checkpoints):
    storage, recipes, results, lines = on_ray
    from quantlab.recipe.file import load_recipe

    assert sorted(q.name for q in results) == sorted(load_recipe(r).recipe.name for r in recipes)
    assert all(q.error is None and q.cache_key and q.node and q.seconds > 0 for q in results), results
    assert any("2 quantization task(s) submitted" in ln for ln in lines)
    root, _ = tiny_checkpoints
    for q, name in zip(sorted(results, key=lambda q: q.name), sorted(RECIPES)):
        cached = storage / "cache" / "checkpoints" / q.cache_key
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
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(storage / "cache"))
    loaded = load_recipe(recipes[0])
    key = {q.name: q.cache_key for q in results}[loaded.recipe.name]
    ctx = RunContext(loaded, RunDir.create(loaded, tmp_path / "runs"), progress=quiet)
    assert quantize_stage.reuses(ctx)
    result = quantize_stage.run(ctx)
    assert result.reused_from_cache == key
    # a cached checkpoint that is not the one its record describes is refused, by name
    cached = storage / "cache" / "checkpoints" / key / "model.safetensors"
    original = cached.read_bytes()
    try:
        cached.write_bytes(original[:-8] + b"\0" * 8)
        ctx2 = RunContext(loaded, RunDir.create(loaded, tmp_path / "runs"), progress=quiet)
        with pytest.raises(RecipeError, match="model.safetensors has another sha256"):
            quantize_stage.run(ctx2)
    finally:
        cached.write_bytes(original)


def test_an_address_nobody_answers_at_is_a_clear_error_at_once(tmp_path):
    r = subprocess.run([sys.executable, "-m", "quantlab", "run", str(REPO / "recipes" / "rtn-w8a16.yaml"),
                        "--ray", "127.0.0.1:9", "--storage", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "--ray 127.0.0.1:9: nothing answers there" in r.stderr, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "quantlab", "run", str(REPO / "recipes" / "rtn-w8a16.yaml"),
                        "--ray", "auto"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={**__import__("os").environ, "RAY_ADDRESS": ""})
    assert r.returncode == 2 and "needs --storage" in r.stderr, r.stderr[-2000:]
