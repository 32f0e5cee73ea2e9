"""The standard suite through the real served endpoint (the session's tiny server, no
server started here): PIQA runs with the suite's own sample limit, in lm-eval's format;
GSM8K, longer than the served context, is skipped with a note."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_endpoint_recipe, validate, write_recipe

pytestmark = pytest.mark.slow


def test_standard_tasks_on_the_served_tiny_model(tiny_server, tiny_served_checkpoint, tmp_path):
    server, _, _ = tiny_server
    recipe = write_recipe(tmp_path, {
        **tiny_endpoint_recipe("tiny-standard", server, tiny_served_checkpoint),
        "quality": {"suites": ["standard"], "tasks": ["std_piqa", "std_gsm8k"], "kl": {"enabled": False}},
        "release": {"policy": {"not_shown": "warn"}},
    })
    r = validate(recipe, tiny_served_checkpoint, tmp_path, relative_runs=True)
    [run_dir] = (tmp_path / "runs" / "tiny-standard").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    q = record["stages"]["quality"]["result"]
    # gsm8k cannot run at the served 512 tokens: a gate that could not decide, which not even
    # `not_shown: warn` lets through (it used to vanish from the decision, and this run released)
    release = record["stages"]["release"]["result"]
    assert r.returncode == 1 and release["decision"] == "not_shown", r.stderr[-3000:]
    assert "quality.skipped@std_gsm8k" in release["not_shown_gates"], release
    assert "quality skipped at std_gsm8k" in r.stderr
    [piqa] = q["tasks"]
    assert piqa["task"] == "std_piqa" and piqa["n"] == 300 and piqa["slice"] == "commonsense"  # the suite's limit
    assert any(s.startswith("std_gsm8k: needs max_model_len >= 1280, served 512") for s in q["skipped"]), q["skipped"]
    rows = [json.loads(x) for x in (run_dir / "quality" / "candidate" / "std_piqa.jsonl").read_text().splitlines()]
    assert len(rows) == 300 and rows[0]["prompt"].startswith("Question: ") and rows[0]["prompt"].endswith("\nAnswer:")
    assert all(r["metrics"]["acc"] in (0, 1) for r in rows)
    # same weights on the same server: the two roles answer alike
    assert piqa["baseline"] == piqa["candidate"]
