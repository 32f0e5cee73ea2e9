"""The stream of decisions against one baseline, through real runs: two `quantlab validate`
runs of the same checkpoint against the same baseline answers (the session's tiny server as
both roles' endpoint, quality only, one task of 10 items), with stream control on in a cache
folder of the test's own. The second run takes position 2 at the level LORD++ gives from the
first's outcome, reuses the cached baseline, and `quantlab verify` re-derives its level."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, tiny_endpoint_recipe, validate, write_recipe

from quantlab.recipe.stream import LORD, SHIPPED_GAMMAS, SHIPPED_W0, next_share

pytestmark = pytest.mark.slow


def test_two_runs_against_one_baseline_are_decisions_1_and_2_of_its_stream(tiny_server, tiny_served_checkpoint,
                                                                           tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTLAB_STREAM_CONTROL", "on")  # the suite judges each run alone (tests/conftest.py)
    server, _, _ = tiny_server
    recipe = write_recipe(tmp_path, {
        **tiny_endpoint_recipe("tiny-stream", server, tiny_served_checkpoint),
        "quality": {"tasks": ["ql_lastword"], "limit": 10, "kl": {"enabled": False}},
    })
    manifests, records, runs = [], [], []
    for _ in range(2):
        r = validate(recipe, tiny_served_checkpoint, tmp_path, relative_runs=True)
        assert r.returncode in (0, 1), r.stdout[-3000:] + r.stderr[-3000:]  # released or not: a decision
        run_dir = sorted((tmp_path / "runs" / "tiny-stream").iterdir())[-1]
        runs.append(run_dir)
        records.append(json.loads((run_dir / "run.json").read_text()))
        manifests.append(json.loads((run_dir / "checkpoint" / "quantlab-manifest.json").read_text()))
    first, second = (m["error_budget"]["stream"] for m in manifests)
    assert (first["control"], first["method"], first["position"]) == ("controlled", LORD, 1)
    assert (second["control"], second["method"], second["position"]) == ("controlled", LORD, 2)
    assert first["key"] == second["key"]
    gamma = SHIPPED_GAMMAS[LORD]
    assert first["share"] == pytest.approx(SHIPPED_W0 * gamma.at(1)) and first["history"] == []
    released = manifests[0]["decision"]["decision"] == "release"
    assert second["history"] == [{"t": 1, "share": first["share"], "released": released}]
    assert second["share"] == pytest.approx(next_share(gamma, [(first["share"], released)], method=LORD,
                                                       w0=SHIPPED_W0))
    assert second["level"] == pytest.approx(second["alpha"] * second["share"])
    # the gates were judged at that level: the quality gates' confidence 1 - 2 x level
    budget = manifests[1]["error_budget"]["checks"]
    assert max(c["pass_alpha"] for c in budget.values() if c.get("pass_alpha")) <= second["level"] + 2e-6
    # the register in the run's cache: both decisions closed with their outcomes
    register = tmp_path / "cache" / "streams" / first["key"]
    closed = [json.loads((register / f"{t}.json").read_text()) for t in (1, 2)]
    assert [d["released"] for d in closed] == [released, manifests[1]["decision"]["decision"] == "release"]
    assert records[1]["stages"]["quality"]["result"]["baseline_cached"]  # the same answers, from the cache
    assert "Stream: decision 2 against this baseline (lord++)" in (runs[1] / "report.md").read_text()

    from quantlab.release.signing_key import local_public_key

    v = subprocess.run([sys.executable, "-m", "quantlab", "verify", runs[1] / "checkpoint", "--public-key",
                        local_public_key(), "--allow-blocked", "--allow-dev-key"], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert v.returncode == 0, v.stdout + v.stderr
