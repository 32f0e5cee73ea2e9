"""Quality at load through a real `quantlab validate`: the session's tiny server as both roles'
endpoint (an A/A run), two tasks of the default suite sliced, sent at concurrency 1 and at the
performance point c4 through the load shaper; the gates, the accuracies, the flips and the
goodput are recorded, every document is joined to its timed requests, the report has its
section and plot, the manifest its summary, and `quantlab verify` holds the gates to the
registered section."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, tiny_endpoint_recipe, validate, write_recipe

pytestmark = pytest.mark.slow

ITEMS = 24


def test_an_a_a_run_judges_the_slice_at_load_and_at_c1(tiny_server, tiny_served_checkpoint, tmp_path):
    server, _, _ = tiny_server
    recipe = write_recipe(tmp_path, {
        **tiny_endpoint_recipe("tiny-load-quality", server, tiny_served_checkpoint),
        "quality": {"tasks": ["ql_knowledge_mc", "ql_arithmetic"], "limit": 20, "kl": {"enabled": False}},
        "performance": {"workloads": [{"name": "w", "prompt_tokens": 16, "output_tokens": 8, "concurrency": [4],
                                       "num_requests": 8, "warmup_requests": 1}],
                        "repeats": 2, "client_check": False, "host_noise": False,
                        "slo": {"ttft_ms": 60000, "tpot_ms": 60000}, "price_per_hour": 1.0},
        "load_quality": {"items": ITEMS, "min_items": 10, "margin": 0.3},
    })
    r = validate(recipe, tiny_served_checkpoint, tmp_path)
    assert r.returncode in (0, 1), r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = sorted((tmp_path / "runs" / "tiny-load-quality").iterdir())[-1]
    record = json.loads((run_dir / "run.json").read_text())
    stage = record["stages"]["load_quality"]
    assert stage["status"] == "ok", stage
    result = stage["result"]
    assert result["items"] == {"ql_knowledge_mc": 12, "ql_arithmetic": 12}
    (point,) = result["points"]
    assert point["name"] == "w/c4" and point["concurrency"] == 4
    for role in ("baseline", "candidate"):
        got = point["roles"][role]
        assert got["load"]["documents"] == ITEMS and got["load"]["answered"] == ITEMS
        assert got["c1"]["answered"] == ITEMS
        assert 0 <= got["load"]["accuracy"] <= 1
        assert got["flips"]["n"] == ITEMS and 0 <= got["flips"]["k"] <= ITEMS
        good = got["load"]["goodput"]
        # generous SLOs: every right answer counts, at a rate over the time the server had work
        assert good["correct_within_slo"] == got["load"]["correct"]
        assert good["rate"] >= 0 and (good["cost_per_correct_answer"] is None) == (good["rate"] == 0)
    assert not [n for n in result["notes"] if "matched no document" in n]  # every request joined
    gates = {(g["gate"], g["scope"]): g for g in result["gates"]}
    assert set(gates) == {("at_load", "w/c4"), ("versus_c1", "w/c4")}
    assert all(g["samples"] == ITEMS for g in gates.values())
    # the same weights on the same server: the baseline at load and the candidate at load are the same answers
    assert point["roles"]["baseline"]["load"]["accuracy"] is not None
    # each evaluation's timed requests on file: lm-eval's requests, one concurrency at a time at c1
    rows = [json.loads(x) for x in (run_dir / "load-quality" / "candidate" / "c1" / "requests.jsonl").read_text()
            .splitlines()]
    assert rows and max(r["in_flight_at_send"] for r in rows) == 1
    rows = [json.loads(x) for x in (run_dir / "load-quality" / "candidate" / "w_c4" / "requests.jsonl").read_text()
            .splitlines()]
    assert max(r["in_flight_at_send"] for r in rows) <= 4
    report = (run_dir / "report.md").read_text()
    assert "Quality at load" in report and "accuracy at load" in report
    assert (run_dir / "load-quality" / "accuracy-vs-concurrency.png").is_file()
    manifest = json.loads((run_dir / "checkpoint" / "quantlab-manifest.json").read_text())
    assert manifest["results"]["load_quality"]["points"][0]["point"] == "w/c4"
    assert "load_quality" in manifest["error_budget"]["checks"]

    from quantlab.release.signing_key import local_public_key

    v = subprocess.run([sys.executable, "-m", "quantlab", "verify", run_dir / "checkpoint", "--public-key",
                        local_public_key(), "--allow-blocked", "--allow-dev-key"], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert v.returncode == 0, v.stdout + v.stderr
