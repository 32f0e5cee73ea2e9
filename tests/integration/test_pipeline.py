"""`quantlab run`: the run directory, its record, resume, and failure records."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from conftest import REPO, tiny_variant, write_recipe

pytestmark = pytest.mark.slow


def ql(*args, cwd):
    return subprocess.run([sys.executable, "-m", "quantlab", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def test_run_writes_record_and_resume_skips_done_stages(tmp_path, tiny_model_dir):
    data = tiny_variant("gptq-w4a16", tiny_model_dir)
    data["serve"] = {"engine_args": {"max_model_len": 512}, "side_by_side": True}  # both at once
    recipe = write_recipe(tmp_path, data)
    r = ql("run", recipe, "--runs-dir", tmp_path / "runs", cwd=REPO)
    assert r.returncode == 0, r.stderr
    record_path = tmp_path / "runs" / "gptq-w4a16"
    [run_dir] = list(record_path.iterdir())
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "ok" and record["recipe_name"] == "gptq-w4a16"
    stage = record["stages"]["quantize"]
    assert stage["status"] == "ok" and stage["summary"]["scheme"] == "W4A16"
    assert stage["summary"]["quantization_config"]["format"] == "pack-quantized"
    roles = {a["role"]: a for a in stage["artifacts"]}
    assert (run_dir / roles["quantize-result"]["path"]).is_file()
    assert len(roles["checkpoint-weights"]["sha256"]) == 64

    serve = record["stages"]["serve"]
    assert serve["status"] == "ok"
    engines = serve["summary"]["engines"]
    assert set(engines) == {"baseline", "candidate"}
    assert engines["candidate"]["log"]["linear_kernels"]["CompressedTensorsWNA16"] == ["CPUWNA16LinearKernel"]
    assert engines["baseline"]["log"]["linear_kernels"] == {}  # bf16: no quantized linear layers
    assert serve["summary"]["engine_args"]["max_model_len"] == 512 and serve["summary"]["side_by_side"] is True
    assert serve["summary"]["probe"]["versions"]["vllm"] == "0.32.0"
    logs = [a for a in serve["artifacts"] if a["role"].endswith("server-log")]
    assert len(logs) == 2 and all((run_dir / a["path"]).is_file() for a in logs)

    again = ql("run", recipe, "--runs-dir", tmp_path / "runs", "--resume", "latest", cwd=REPO)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("already done, skipped") == 2
    assert json.loads((run_dir / "run.json").read_text())["stages"]["quantize"]["finished_at"] == stage["finished_at"]

    changed = copy.deepcopy(data)
    changed["quantization"]["group_size"] = 32
    recipe2 = write_recipe(tmp_path, changed, "changed.yaml")
    clash = ql("run", recipe2, "--runs-dir", tmp_path / "runs", "--resume", run_dir, cwd=REPO)
    assert clash.returncode == 2 and "cannot resume" in clash.stderr


def test_failed_stage_is_recorded(tmp_path, tiny_model_dir):
    data = tiny_variant("raw-llmcompressor", tiny_model_dir)
    data["quantization"]["raw_recipe"] = {"stage": {"modifiers": {"NoSuchModifier": {}}}}
    recipe = write_recipe(tmp_path, data)
    r = ql("run", recipe, "--runs-dir", tmp_path / "runs", cwd=REPO)
    assert r.returncode == 3, r.stderr
    [run_dir] = list((tmp_path / "runs" / "raw-llmcompressor").iterdir())
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed"
    assert record["stages"]["quantize"]["status"] == "failed"
    assert "unquantized checkpoint" in record["stages"]["quantize"]["error"]
    assert not (run_dir / "checkpoint").exists()
