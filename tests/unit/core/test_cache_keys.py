"""The cache keys of the baseline's quality and stability results: whatever can change
those results changes the key (a changed baseline, suite, engine argument, engine
version, device, hardware or check setting misses); a gate, which only judges results,
does not."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from quantlab.recipe.quality import QualitySpec
from quantlab.core.result_cache import cache_key
from quantlab.recipe.stability import StabilitySpec
from quantlab.quality import work as quality
from quantlab.stability import stage as stability


def fake_ctx(*, baseline, quality_spec=None, stability_spec=None, engine_args=None, device="cpu", vllm="0.32.0",
             cpu="Xeon"):
    plan = SimpleNamespace(probe={"versions": {"vllm": vllm}, "cpu": {"model": cpu}, "gpus": []},
                           engine_args=engine_args or {"max_model_len": 2048}, device=device)
    recipe = SimpleNamespace(quality=quality_spec or QualitySpec(), stability=stability_spec or StabilitySpec())
    return SimpleNamespace(recipe=recipe, baseline_identity=lambda: baseline, serving_plan=lambda: plan)


BASE = {"model.safetensors": "a" * 64}
SUITES = [SimpleNamespace(name="default", sha256="s" * 64, code_tasks=set())]


def quality_key(**kw) -> str:
    suites = kw.pop("suites", SUITES)
    ctx = fake_ctx(**{"baseline": BASE, **kw})
    return cache_key(quality.cache_parts(ctx, suites, ["ql_lastword"], ctx.serving_plan()))


def stability_key(tmp_path, **kw) -> str:
    (tmp_path / "tokenizer.json").write_text("{}")
    return cache_key(stability._cache_parts(fake_ctx(**{"baseline": BASE, **kw}), tmp_path, 2048))


CHANGES = {
    "baseline": {"baseline": {"model.safetensors": "b" * 64}},
    "engine argument": {"engine_args": {"max_model_len": 2048, "enforce_eager": True}},
    "engine version": {"vllm": "0.33.0"},
    "device": {"device": "cuda"},
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_what_changes_the_baselines_results_misses(change, tmp_path):
    assert quality_key(**CHANGES[change]) != quality_key()
    assert stability_key(tmp_path, **CHANGES[change]) != stability_key(tmp_path)


def test_quality_key_follows_the_suite_and_the_settings_not_the_gates():
    edited = [SimpleNamespace(name="default", sha256="t" * 64, code_tasks=set())]
    assert quality_key(suites=edited) != quality_key()
    assert quality_key(quality_spec=QualitySpec(limit=21)) != quality_key()
    assert quality_key(quality_spec=QualitySpec(num_concurrent=4)) != quality_key()  # batching changes outputs
    gates = QualitySpec.model_validate({"gates": {"min_recovery": 0.5}})
    assert quality_key(quality_spec=gates) == quality_key()


def test_stability_key_follows_probes_hardware_and_tokenizer_not_the_gates(tmp_path):
    base = stability_key(tmp_path)
    assert stability_key(tmp_path, cpu="EPYC") != base
    soak = StabilitySpec.model_validate({"soak": {"requests": 17}})
    assert stability_key(tmp_path, stability_spec=soak) != base
    gates = StabilitySpec.model_validate({"gates": {"max_rss_growth_mb": 1}, "fallback": "baseline"})
    assert stability_key(tmp_path, stability_spec=gates) == base
    (tmp_path / "tokenizer.json").write_text('{"changed": 1}')
    changed = cache_key(stability._cache_parts(fake_ctx(baseline=BASE), tmp_path, 2048))
    assert changed != base


def test_quality_key_follows_where_model_code_ran():
    """A baseline scored unsandboxed is not reused by a run whose model code runs in a sandbox."""
    code = [SimpleNamespace(name="default", sha256="s" * 64, code_tasks={"ql_code"})]

    def key(sandbox: str | None, tasks: list[str]) -> str:
        ctx = fake_ctx(baseline=BASE)
        ctx.memo = {"quality.code_sandbox": sandbox}  # what the preflight decided (work.code_sandbox)
        return cache_key(quality.cache_parts(ctx, code, tasks, ctx.serving_plan()))

    assert key("unsandboxed", ["ql_code"]) != key("bwrap", ["ql_code"]) != key("unshare", ["ql_code"])
    assert key("unsandboxed", ["ql_lastword"]) == key("bwrap", ["ql_lastword"])  # no code task runs: no matter
