"""`quantization.distributed`: the torchrun launch quantlab builds, run for real on this
CPU with the gloo backend (`--check`: each rank's process-group handshake), and the
preflight's refusal where the host has fewer accelerators than the recipe asks for
(llm-compressor's distributed oneshot gives each rank an accelerator; a CPU has none)."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import REPO, quiet, tiny_variant, write_recipe

from quantlab.core.errors import RecipeError
from quantlab.quantize.distributed import RANK_MODULE, torchrun_argv


def test_the_launch_starts_one_process_per_rank_that_join_one_group(tmp_path):
    argv = torchrun_argv(2, "--check")
    assert argv[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert argv[-3:] == ["-m", RANK_MODULE, "--check"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("{")))
    assert seen == {"world_size": 2, "rank_sum": 1, "backend": "gloo"}  # ranks 0 and 1, one group


def test_a_host_without_the_accelerators_is_refused_before_quantizing(tmp_path, tiny_model_dir):
    import torch

    from quantlab.core.run import RunDir
    from quantlab.pipeline.context import RunContext
    from quantlab.quantize import stage as quantize_stage
    from quantlab.recipe.file import load_recipe

    if torch.accelerator.is_available() and torch.accelerator.device_count() >= 2:
        pytest.skip("this host has two accelerators: the refusal is for hosts without them")
    data = tiny_variant("gptq-w4a16", tiny_model_dir)
    data["quantization"]["distributed"] = {"nproc_per_node": 2}
    loaded = load_recipe(write_recipe(tmp_path, data, "dist.yaml"))
    ctx = RunContext(loaded, RunDir.create(loaded, tmp_path / "runs"), progress=quiet)
    with pytest.raises(RecipeError) as err:
        quantize_stage.preflight(ctx)
    assert err.value.field == "quantization.distributed.nproc_per_node"
    assert "quantization.distributed.nproc_per_node is 2, and this host has" in str(err.value)
    assert "Remove quantization.distributed" in str(err.value)
    assert not ctx.checkpoint_dir.exists()


def test_one_process_is_not_a_distributed_run(tmp_path, tiny_model_dir):
    from quantlab.recipe.file import load_recipe

    data = tiny_variant("gptq-w4a16", tiny_model_dir)
    data["quantization"]["distributed"] = {"nproc_per_node": 1}
    with pytest.raises(RecipeError, match="nproc_per_node"):
        load_recipe(write_recipe(tmp_path, data, "one.yaml"))
