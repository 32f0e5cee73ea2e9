"""The host's performance noise in the cache: keyed per workload point by what makes two
spreads comparable, authenticated under the cache secret (an edited entry is not pooled),
accumulated over runs, one contribution per run and kind, and the two kinds' sums of
squares and degrees of freedom as the store defines them."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from quantlab.core import cache_secret
from quantlab.core.result_cache import CacheEntryWarning
from quantlab.performance import noise_store as store
from tests.unit.performance.test_noise import requests
from quantlab.performance.noise import RepeatSample, per_repeat_figures
from quantlab.recipe.performance import PerformanceSpec


pytestmark = pytest.mark.usefixtures("own_cache")  # tests/conftest.py: a cache and secret of its own


BASE = {"files": {"model.safetensors": "a" * 64, "config.json": "c" * 64}}
SPEC = PerformanceSpec.model_validate({"workloads": [{"name": "short", "prompt_tokens": 128, "output_tokens": 32,
                                                      "concurrency": [1, 8], "num_requests": 16}]})


def fake_ctx(tmp_path: Path, *, run_id="run-1", baseline=BASE, engine_args=None, device="cpu", vllm="0.32.0",
             cpu="EPYC", side_by_side=True, candidate_weights=None):
    """The parts of a run context the store reads (the serving plan, the baseline, the record)."""
    plan = SimpleNamespace(probe={"versions": {"vllm": vllm}, "cpu": {"model": cpu}, "gpus": []},
                           engine_args=engine_args or {"dtype": "bfloat16"}, device=device)
    checkpoint = SimpleNamespace(weights_sha256=candidate_weights or {"model.safetensors": "q" * 64})
    record = SimpleNamespace(run_id=run_id, result=lambda name: checkpoint if name == "checkpoint" else None)
    return SimpleNamespace(recipe=SimpleNamespace(name="demo", serve=SimpleNamespace(side_by_side=side_by_side)),
                           loaded=SimpleNamespace(resolve=lambda p: tmp_path / p), checkpoint_dir=tmp_path / "ckpt",
                           serving_plan=lambda predicted=False: plan, baseline_identity=lambda: baseline,
                           run=SimpleNamespace(record=record))


def parts(tmp_path, point="c8", spec=SPEC, **kw):
    return store.point_parts(fake_ctx(tmp_path, **kw), spec.workloads[0], point)


def test_the_key_follows_what_makes_the_spread_comparable_not_the_recipes_name_or_gates(tmp_path):
    key = store.key_of(parts(tmp_path))
    changed = {
        "point": parts(tmp_path, point="c1"),
        "baseline": parts(tmp_path, baseline={"files": {"model.safetensors": "b" * 64}}),
        "engine args": parts(tmp_path, engine_args={"dtype": "float32"}),
        "engine version": parts(tmp_path, vllm="0.33.0"),
        "device": parts(tmp_path, device="cuda"),
        "hardware": parts(tmp_path, cpu="Xeon"),
        "side by side": parts(tmp_path, side_by_side=False),
        "requests": parts(tmp_path, spec=SPEC.model_copy(update={"workloads": [
            SPEC.workloads[0].model_copy(update={"num_requests": 100})]})),
        "output tokens": parts(tmp_path, spec=SPEC.model_copy(update={"workloads": [
            SPEC.workloads[0].model_copy(update={"output_tokens": 64})]})),
    }
    for what, other in changed.items():
        assert store.key_of(other) != key, what
    same = SPEC.model_copy(update={"repeats": 5, "confidence": 0.9, "host_noise": False})
    assert store.key_of(parts(tmp_path, spec=same)) == key
    assert store.key_of(store.point_parts(fake_ctx(tmp_path, run_id="run-2"), SPEC.workloads[0], "c8")) == key


def test_a_dataset_is_keyed_by_its_content(tmp_path):
    (tmp_path / "prompts.jsonl").write_text('{"text": "one"}\n')
    spec = SPEC.model_copy(update={"workloads": [SPEC.workloads[0].model_copy(update={"dataset": "prompts.jsonl"})]})
    before = store.key_of(parts(tmp_path, spec=spec))
    (tmp_path / "prompts.jsonl").write_text('{"text": "two"}\n')
    assert store.key_of(parts(tmp_path, spec=spec)) != before


def test_aa_and_baseline_contributions_sum_their_squares_as_defined():
    ratios = [1.1, 0.95, 1.02]
    ss, df = store.ss_df(store.AA, ratios)
    assert df == 3 and ss == pytest.approx(sum(np.log(r) ** 2 for r in ratios))
    figures = [100.0, 110.0, 90.0, 105.0]
    logs = np.log(figures)
    ss, df = store.ss_df(store.BASELINE_REPEATS, figures)
    assert df == 3 and ss == pytest.approx(2 * np.sum((logs - logs.mean()) ** 2))
    assert store.ss_df(store.BASELINE_REPEATS, [100.0]) == (0.0, 0)  # one repeat: no spread
    # a constant bias between the two servers counts as A/A noise; a level shared by a run's repeats does not
    assert store.ss_df(store.AA, [1.05, 1.05])[0] > 0
    assert store.ss_df(store.BASELINE_REPEATS, [200.0, 200.0])[0] == 0


def test_contributions_accumulate_over_runs_and_each_run_counts_once(tmp_path):
    p = parts(tmp_path)
    assert store.host_noise(p, "ttft_ms.p99") is None
    assert store.add(p, store.AA, "cal-1", {"ttft_ms.p99": [1.1, 0.9, 1.0, 1.05]}) is not None
    assert store.add(p, store.AA, "cal-1", {"ttft_ms.p99": [2.0, 2.0]}) is None  # the same run again: kept once
    assert store.add(p, store.BASELINE_REPEATS, "run-7", {"ttft_ms.p99": [50.0, 55.0, 52.0]}) is not None
    noise = store.host_noise(p, "ttft_ms.p99")
    aa_ss, aa_df = store.ss_df(store.AA, [1.1, 0.9, 1.0, 1.05])
    b_ss, b_df = store.ss_df(store.BASELINE_REPEATS, [50.0, 55.0, 52.0])
    assert noise.df == aa_df + b_df == 6 and noise.ss == pytest.approx(aa_ss + b_ss)
    assert len(noise.sources) == 2 and "4 A/A repeats from 1 calibration run(s)" in noise.sources[0]
    assert "2 df from 1 earlier run(s)' baseline repeats" in noise.sources[1]
    # the judging run's own baseline repeats are already in its interval: left out
    assert store.host_noise(p, "ttft_ms.p99", exclude_run="run-7").df == 4
    assert store.host_noise(p, "tpot_ms.p99") is None  # no figures for this metric
    assert store.host_noise(parts(tmp_path, point="c1"), "ttft_ms.p99") is None  # another point


def test_an_edited_or_planted_entry_is_not_pooled(tmp_path):
    p = parts(tmp_path)
    path = store.add(p, store.AA, "cal-1", {"output_tokens_per_s": [1.01, 0.99, 1.0]})
    doc = json.loads(path.read_text())
    doc["body"]["figures"]["output_tokens_per_s"] = [1.0, 1.0, 1.0]  # a quieter host than measured
    path.write_text(json.dumps(doc))
    planted = path.with_name("aa-planted.json")
    planted.write_text(json.dumps({"body": {**doc["body"], "run": "planted"}, "hmac": "0" * 64}))
    with pytest.warns(CacheEntryWarning, match="not authenticated"):
        assert store.host_noise(p, "output_tokens_per_s") is None
    # an entry moved to another point's folder does not authenticate there either
    q = parts(tmp_path, point="c1")
    good = store.add(p, store.AA, "cal-2", {"output_tokens_per_s": [1.2, 0.8]})
    other = store.store_root() / store.key_of(q) / good.name
    other.parent.mkdir(parents=True)
    other.write_text(good.read_text())
    with pytest.warns(CacheEntryWarning):
        assert store.host_noise(q, "output_tokens_per_s") is None


def test_an_entry_made_under_another_secret_is_not_pooled(tmp_path):
    p = parts(tmp_path)
    cache_secret.use(b"1" * 64)
    store.add(p, store.AA, "cal-1", {"output_tokens_per_s": [1.01, 0.99]})
    cache_secret.use(b"2" * 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.host_noise(p, "output_tokens_per_s") is None
    assert any(issubclass(w.category, CacheEntryWarning) for w in caught)


def repeat(rng, n, slow=1.0):
    return RepeatSample.of(*requests(rng, n, slow=slow, tpot_spread=None))


def test_a_run_stores_its_baseline_repeats_and_an_aa_run_its_ratios(tmp_path):
    rng = np.random.default_rng(3)
    samples = {("short", pt): {"baseline": [repeat(rng, 16, s) for s in (1.0, 1.1, 0.95)],
                               "candidate": [repeat(rng, 16, s) for s in (1.0, 1.1, 0.95)]}
               for pt in ("c1", "c8")}
    ctx = fake_ctx(tmp_path, run_id="run-1")
    assert not store.is_aa_run(ctx)
    assert store.record_run(ctx, SPEC, samples) == (store.BASELINE_REPEATS, 2)
    assert store.record_run(ctx, SPEC, samples) == (store.BASELINE_REPEATS, 0)  # once per run
    b = samples[("short", "c8")]["baseline"]
    noise = store.host_noise(parts(tmp_path), "ttft_ms.p99")
    assert (noise.ss, noise.df) == pytest.approx(store.ss_df(store.BASELINE_REPEATS,
                                                             per_repeat_figures(b, None, "ttft_ms.p99")))
    aa = fake_ctx(tmp_path, run_id="cal-1", candidate_weights={"model.safetensors": "a" * 64})
    assert store.is_aa_run(aa)
    assert store.record_run(aa, SPEC, samples) == (store.AA, 2)
    c = samples[("short", "c8")]["candidate"]
    got = store.host_noise(parts(tmp_path), "ttft_ms.p99")
    aa_ss, aa_df = store.ss_df(store.AA, per_repeat_figures(b, c, "ttft_ms.p99"))
    assert got.df == noise.df + aa_df and got.ss == pytest.approx(noise.ss + aa_ss)
    # for_run: this run's own contribution left out, and nothing when the recipe turns it off
    by_point = store.for_run(fake_ctx(tmp_path, run_id="run-1"), SPEC)
    assert by_point[("short", "c8")]["ttft_ms.p99"].df == aa_df
    assert store.for_run(ctx, SPEC.model_copy(update={"host_noise": False})) == {}


def test_describe_says_which_noise_model_judges():
    assert store.describe(None, 1) == "the run's own repeats: 1 df"
    line = store.describe(store.HostNoise(ss=0.1, df=20, sources=("20 A/A repeats from 2 calibration run(s) "
                                                                   "(2026-12-06)",)), 1)
    assert line.startswith("host calibration: 20 df from 20 A/A repeats") and line.endswith("own 1")
