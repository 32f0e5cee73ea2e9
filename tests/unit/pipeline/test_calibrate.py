"""`quantlab calibrate` refuses bad input before it serves anything (exit 2, the field named)."""

from __future__ import annotations

import subprocess
import sys

import yaml
from conftest import RECIPES, REPO


def ql(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "quantlab", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, env=env)


def recipe(tmp_path, **sections):
    data = {"name": "cal", "extends": str(RECIPES / "gptq-w4a16.yaml"), **sections}
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_recipe_without_performance_is_refused(tmp_path):
    r = ql("calibrate", recipe(tmp_path, performance=None), "--runs-dir", tmp_path / "runs")
    assert r.returncode == 2, r.stderr
    assert "no performance section" in r.stderr and "performance" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_an_endpoint_recipe_is_refused(tmp_path):
    path = recipe(tmp_path, serve={"mode": "endpoint", "endpoint": "http://127.0.0.1:9",
                                   "candidate_endpoint": "http://127.0.0.1:9", "allow_same_endpoint": True})
    r = ql("calibrate", path, "--runs-dir", tmp_path / "runs")
    assert r.returncode == 2
    assert "serve.mode" in r.stderr


def test_repeats_out_of_range_are_refused(tmp_path):
    for n in (1, 51):
        r = ql("calibrate", RECIPES / "demo-gptq-w4a16.yaml", "--repeats", n, "--runs-dir", tmp_path / "runs")
        assert r.returncode == 2 and "--repeats" in r.stderr and "2 to 50" in r.stderr
