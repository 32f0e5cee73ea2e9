"""`quantlab calibrate` on the tiny model: an A/A run whose per-repeat ratios land in this
cache's noise store under the keys a run of the recipe looks up (the dry run then names the
calibration), and a second call with --min-df measures nothing."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from conftest import REPO, tiny_variant, write_recipe

from quantlab.performance import noise_store

pytestmark = pytest.mark.slow

REPEATS = 3


def ql(*args, env, timeout=900):
    return subprocess.run([sys.executable, "-m", "quantlab", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, env=env)


def test_calibrate_stores_aa_repeats_where_a_run_finds_them(tmp_path, tiny_model_dir, served_format):
    data = tiny_variant(served_format.recipe, tiny_model_dir)
    data["serve"] = {"engine_args": {"max_model_len": 512}, "side_by_side": True}
    data["performance"] = {
        "workloads": [{"name": "short", "prompt_tokens": 32, "output_tokens": 8, "concurrency": [1, 2],
                       "num_requests": 4, "warmup_requests": 1}],
        "client_check": False,
        # one ratio gate, for the dry run to name its noise model (the A/A run's own decision does not matter)
        "gates": {"min_throughput_ratio": 0.5, "max_p99_ttft_ratio": None, "max_p99_tpot_ratio": None,
                  "max_error_rate": 0.0}}
    recipe = write_recipe(tmp_path, data)
    cache = tmp_path / "cache"
    env = {**os.environ, "QUANTLAB_CACHE_DIR": str(cache)}
    runs = tmp_path / "runs"

    done = ql("calibrate", recipe, "--repeats", REPEATS, "--runs-dir", runs, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "calibrate: an A/A run of" in done.stderr
    [run_dir] = list((runs / f"{data['name']}-calibrate").iterdir())
    assert done.stdout.strip().endswith(str(run_dir / "run.json"))
    record = json.loads((run_dir / "run.json").read_text())
    perf = record["stages"]["performance"]["result"]
    assert any("this A/A run's per-repeat ratios" in n for n in perf["notes"]), perf["notes"]
    files = sorted((cache / noise_store.KIND).glob("*/aa-*.json"))
    assert len(files) == 2  # one per point
    for f in files:
        body = json.loads(f.read_text())["body"]
        assert body["kind"] == noise_store.AA and body["run"] == record["run_id"]
        pt = next(p for p in perf["points"] if f"c{body['parts']['point']['concurrency']}" == p["point"])
        # the throughput figure the gate uses is the measured one: candidate / baseline per repeat
        expected = [c["output_tokens_per_s"] / b["output_tokens_per_s"]
                    for b, c in zip(pt["baseline_repeats"], pt["candidate_repeats"], strict=True)]
        assert body["figures"]["output_tokens_per_s"] == pytest.approx(expected)
        assert len(expected) == REPEATS
    # the table: per point and figure, the df this calibration added
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("short/")]
    assert len(rows) == 6 and all(r[-4] == str(REPEATS) for r in rows)
    c1 = next(json.loads(f.read_text())["body"] for f in files
              if json.loads(f.read_text())["body"]["parts"]["point"]["concurrency"] == 1)
    logs = [math.log(x) for x in c1["figures"]["output_tokens_per_s"]]
    sd = next(float(r[-3]) for r in rows if r[1] == "throughput" and r[0] == "short/c1")
    assert sd == pytest.approx(math.sqrt(sum(x * x for x in logs) / len(logs)), abs=1e-3)

    again = ql("calibrate", recipe, "--repeats", REPEATS, "--min-df", REPEATS, "--runs-dir", runs, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing measured" in again.stdout
    assert len(list((runs / f"{data['name']}-calibrate").iterdir())) == 1

    plan = ql("run", recipe, "--dry-run", "--runs-dir", runs, env=env)
    assert plan.returncode == 0, plan.stderr[-3000:]
    for point in ("c1", "c2"):
        assert f"short/{point}: host calibration: {REPEATS} df from {REPEATS} A/A repeats" in plan.stdout
