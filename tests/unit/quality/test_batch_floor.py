"""The batch noise floor in the cache: keyed by host, engine, device, engine args and the
model's weights; one contribution per run, role and point, written once and authenticated
under the cache secret (an edited or moved entry is not pooled); pooled as sum k over sum n
with its exact interval, whose upper bound is the planner's discordance."""

from __future__ import annotations

import json
import warnings

import pytest
from scipy.stats import beta

from quantlab.core import cache_secret
from quantlab.core.result_cache import CacheEntryWarning
from quantlab.quality import batch_floor as store


pytestmark = pytest.mark.usefixtures("own_cache")  # tests/conftest.py: a cache and secret of its own


PROBE = {"versions": {"vllm": "0.32.0"}, "cpu": {"model": "EPYC"}, "gpus": []}
WEIGHTS = {"model.safetensors": "a" * 64}


def parts(probe=PROBE, device="cpu", weights=WEIGHTS, engine_args=None):
    return store.model_parts(probe, device, weights, engine_args or {"dtype": "bfloat16"})


def test_the_key_follows_host_engine_device_args_and_weights():
    key = store.key_of(parts())
    assert store.key_of(parts()) == key
    for changed in (parts(probe={**PROBE, "cpu": {"model": "Xeon"}}),
                    parts(probe={**PROBE, "versions": {"vllm": "0.33.0"}}), parts(device="cuda"),
                    parts(weights={"model.safetensors": "b" * 64}), parts(engine_args={"dtype": "float32"})):
        assert store.key_of(changed) != key


def test_the_exact_interval():
    assert store.clopper_pearson(4, 150) == (pytest.approx(beta.ppf(0.025, 4, 147)),
                                             pytest.approx(beta.ppf(0.975, 5, 146)))
    assert store.clopper_pearson(0, 40)[0] == 0.0 and store.clopper_pearson(40, 40)[1] == 1.0
    assert store.clopper_pearson(0, 40)[1] == pytest.approx(1 - 0.025 ** (1 / 40))
    with pytest.raises(ValueError):
        store.clopper_pearson(3, 2)
    fr = store.FlipRate.of(4, 150)
    assert fr.rate == pytest.approx(4 / 150) and fr.line().startswith("2.7% (4 of 150 documents; 95% CI ")
    assert store.FlipRate.of(0, 0).line() == "no document answered at both levels"


def test_points_are_named_by_concurrency_or_rate():
    assert store.point_label(concurrency=8) == "c8" and store.point_label(rate=2.5) == "r2.5"
    with pytest.raises(ValueError):
        store.point_label(concurrency=8, rate=2.0)
    with pytest.raises(ValueError, match="is not"):
        store.record(parts(), "chat/c8", run_id="r1", role="baseline", k=1, n=10)


def test_contributions_pool_and_the_planner_reads_the_upper_bound():
    p = parts()
    assert store.floor_for(p) is None and store.planner_discordance(p) is None
    assert store.record(p, "c8", run_id="run-1", role="candidate", k=3, n=100, tasks=["b", "a"]) is not None
    assert store.record(p, "c8", run_id="run-2", role="candidate", k=1, n=50) is not None
    assert store.record(p, "c32", run_id="run-2", role="candidate", k=6, n=50) is not None
    at8 = store.floor_for(p, "c8")
    assert (at8.k, at8.n, at8.rate) == (4, 150, pytest.approx(4 / 150))
    assert at8.low == pytest.approx(beta.ppf(0.025, 4, 147)) and at8.high == pytest.approx(beta.ppf(0.975, 5, 146))
    every = store.floor_for(p)
    assert (every.k, every.n) == (10, 200)
    assert store.planner_discordance(p) == pytest.approx(beta.ppf(0.975, 11, 190))
    assert store.planner_discordance(p, "c8") == pytest.approx(at8.high)
    assert (store.floor_for(p, "c8", exclude_run="run-1").k, store.floor_for(p, "c8", exclude_run="run-1").n) == \
        (1, 50)
    assert store.floor_for(parts(device="cuda")) is None  # another key holds nothing
    first = store.contributions(p, "c8")[0]
    assert first["tasks"] == ["a", "b"] and first["role"] == "candidate" and first["parts"] == json.loads(
        json.dumps(p))


def test_each_run_role_and_point_is_written_once():
    p = parts()
    path = store.record(p, "c8", run_id="run-1", role="baseline", k=2, n=80)
    assert path.name == "c8-baseline-run-1.json"
    assert store.record(p, "c8", run_id="run-1", role="baseline", k=9, n=80) is None  # never rewritten
    assert store.record(p, "c8", run_id="run-1", role="candidate", k=0, n=80) is not None  # an A/A run's other role
    assert store.record(p, "c8", run_id="run-3", role="baseline", k=0, n=0) is None  # nothing measured
    with pytest.raises(ValueError):
        store.record(p, "c8", run_id="run-4", role="baseline", k=5, n=4)
    assert (store.floor_for(p).k, store.floor_for(p).n) == (2, 160)


def test_an_edited_or_moved_entry_is_skipped_with_a_warning():
    p = parts()
    path = store.record(p, "c8", run_id="run-1", role="baseline", k=0, n=100)
    doc = json.loads(path.read_text())
    doc["body"]["k"] = 40  # a floor made to look noisy, so the planner assumes more discordance
    path.write_text(json.dumps(doc))
    with pytest.warns(CacheEntryWarning, match="batch noise floor entry .* not authenticated"):
        assert store.floor_for(p) is None
    good = store.record(p, "c8", run_id="run-2", role="baseline", k=1, n=100)
    other = store.store_root() / store.key_of(parts(device="cuda")) / good.name
    other.parent.mkdir(parents=True)
    other.write_text(good.read_text())
    with pytest.warns(CacheEntryWarning):
        assert store.floor_for(parts(device="cuda")) is None


def test_an_entry_made_under_another_secret_is_not_pooled():
    p = parts()
    cache_secret.use(b"1" * 64)
    store.record(p, "c8", run_id="run-1", role="baseline", k=1, n=100)
    cache_secret.use(b"2" * 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.floor_for(p) is None
    assert any(issubclass(w.category, CacheEntryWarning) for w in caught)


def test_a_secret_looking_engine_arg_is_not_written_into_the_store():
    p = parts(engine_args={"dtype": "bfloat16", "api_key": "sk-very-secret-value-0123456789"})
    path = store.record(p, "r2", run_id="run-1", role="baseline", k=1, n=10)
    assert "sk-very-secret" not in path.read_text() and store.floor_for(p, "r2").n == 10
