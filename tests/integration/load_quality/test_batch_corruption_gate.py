"""A candidate right alone and wrong in batches is blocked by quality at load, and only there.

The baseline is the session's plain tiny server; the candidate is the same checkpoint served
with the batch-corruption test double (tests/data/batch_corruption: sampling steps of more
than 2 requests answer wrongly). The suite is self-consistent (the plain server's own greedy
answers as targets). The quality stage asks one request at a time (quality.num_concurrent 1),
as lm-eval at its own pace would on a quiet server, and sees nothing; load_quality at the
performance point c8 sees the candidate's answers go wrong, against the baseline at c8 and
against itself at c1, while at the point c1 it passes."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_SERVER_KEY_ENV, validate, write_recipe

pytestmark = pytest.mark.slow

KEY_ENV = "QUANTLAB_TEST_DOUBLE_KEY"


def test_a_candidate_wrong_only_in_batches_is_blocked_at_load_and_passed_at_c1(
        tiny_server, batch_corrupt_server, self_consistent_suite_dir, tiny_served_checkpoint, tmp_path, monkeypatch):
    plain, _, _ = tiny_server
    double, _, _ = batch_corrupt_server
    monkeypatch.setenv(KEY_ENV, double.api_key)
    recipe = write_recipe(tmp_path, {
        "name": "tiny-batch-corruption", "model": {"source": str(tiny_served_checkpoint)},
        "quantization": {"method": "rtn", "scheme": "W4A16", "group_size": 64},
        "serve": {"mode": "endpoint", "endpoint": plain.base_url, "served_model_name": plain.served_name,
                  "candidate_endpoint": double.base_url, "candidate_served_model_name": double.served_name,
                  "api_key_env": TINY_SERVER_KEY_ENV, "candidate_api_key_env": KEY_ENV},
        "quality": {"suites": [str(self_consistent_suite_dir)], "num_concurrent": 1, "kl": {"enabled": False},
                    "gates": {"min_samples": 20}},
        "performance": {"workloads": [{"name": "w", "prompt_tokens": 16, "output_tokens": 8, "concurrency": [1, 8],
                                       "num_requests": 8, "warmup_requests": 0}],
                        "repeats": 2, "client_check": False, "host_noise": False,
                        # the double's steps are slower by design: no speed comparison with it means anything
                        "gates": {"min_throughput_ratio": None, "max_p99_ttft_ratio": None,
                                  "max_p99_tpot_ratio": None, "max_error_rate": None}},
        "load_quality": {"items": 40, "min_items": 20, "margin": 0.1},
    })
    r = validate(recipe, tiny_served_checkpoint, tmp_path)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]  # blocked
    run_dir = sorted((tmp_path / "runs" / "tiny-batch-corruption").iterdir())[-1]
    record = json.loads((run_dir / "run.json").read_text())
    quality = record["stages"]["quality"]["result"]
    assert [g["verdict"] for g in quality["gates"] if g["gate"] == "non_inferiority"] and \
        all(g["verdict"] == "pass" for g in quality["gates"] if g["gate"] == "non_inferiority")
    lq = record["stages"]["load_quality"]["result"]
    verdicts = {(g["gate"], g["scope"]): g["verdict"] for g in lq["gates"]}
    assert verdicts == {("at_load", "w/c1"): "pass", ("at_load", "w/c8"): "fail", ("versus_c1", "w/c8"): "fail"}
    at8 = next(p for p in lq["points"] if p["name"] == "w/c8")["roles"]
    assert at8["baseline"]["load"]["accuracy"] >= 0.95 and at8["candidate"]["c1"]["accuracy"] >= 0.95
    assert at8["candidate"]["load"]["accuracy"] <= 0.5
    # the floor: the plain server hardly flips between c1 and c8, the double flips most answers
    assert at8["baseline"]["flips"]["rate"] <= 0.05 and at8["candidate"]["flips"]["rate"] >= 0.5
    decision = record["stages"]["release"]["result"]
    assert "load_quality.at_load@w/c8" in decision["failed_gates"]
