"""The CLI as users call it: a subprocess, its exit code and its stderr."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from conftest import RECIPES, REPO


def ql(*args, cwd=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "quantlab", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd or REPO, timeout=timeout)


def test_version_and_help():
    assert ql("--version").stdout.startswith("quantlab ")
    r = ql("--help")
    assert r.returncode == 0 and "quantize" in r.stdout and "recipes" in r.stdout


def test_recipes_check_ok_and_failures(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "bad", "quantization": {"method": "gptq", "scheme": "W4A16",
                                                                    "group_sise": 64}}))
    r = ql("recipes", "check", RECIPES / "rtn-w8a16.yaml", bad)
    assert r.returncode == 2
    assert "ok" in r.stdout and "rtn-w8a16.yaml" in r.stdout
    assert "quantization.group_sise" in r.stderr and "Did you mean 'group_size'" in r.stderr


def test_recipes_check_validates_calibration_rows(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"text": "ok"}\n{"txt": "typo"}\n')
    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump({"name": "r", "quantization": {"method": "gptq", "scheme": "W8A16"},
                                 "calibration": {"datasets": [{"path": "c.jsonl"}]}}))
    r = ql("recipes", "check", f)
    assert r.returncode == 2 and "c.jsonl:2" in r.stderr


def test_recipes_schema_is_json_schema():
    r = ql("recipes", "schema")
    schema = json.loads(r.stdout)
    assert r.returncode == 0 and schema["title"] == "quantlab recipe"


def test_recipes_list_shows_every_shipped_recipe():
    r = ql("recipes", "list")
    assert r.returncode == 0
    for p in RECIPES.glob("*.yaml"):
        assert p.name in r.stdout
    assert "smoothquant+gptq W8A8" in r.stdout


def test_quantize_bad_input_exits_2_and_writes_nothing(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("name: r\nquantization: {method: awq, scheme: W8A8}\n")
    out = tmp_path / "out"
    r = ql("quantize", f, "--output", out)
    assert r.returncode == 2 and "AWQ protects" in r.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["r.yaml"]


def test_quantize_missing_recipe_exits_2(tmp_path):
    r = ql("quantize", tmp_path / "nope.yaml")
    assert r.returncode == 2 and "recipe file not found" in r.stderr
