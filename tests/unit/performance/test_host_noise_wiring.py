"""The host's noise reaches the intervals: the crossover's orders from the measuring order,
the store's HostNoise pooled into a ratio's interval (never an absolute one), the dry run's
line per point, and the report's line per point."""

from __future__ import annotations

import numpy as np
import pytest

from quantlab.core.results import PerfPoint, PerfResult
from quantlab.performance import noise_store, stage
from tests.unit.performance.test_noise import requests
from quantlab.performance.noise import HostNoise, RepeatSample
from quantlab.performance.result import crossover_orders, intervals
from quantlab.recipe.performance import PerformanceSpec
from quantlab.reports.sections import _noise_lines
from tests.unit.performance.test_noise_store import SPEC, fake_ctx

pytestmark = pytest.mark.usefixtures("own_cache")  # tests/conftest.py: a cache and secret of its own


def test_orders_follow_the_measuring_order():
    # side by side, alternating (the stage), with an adaptive repeat after two
    seq = ["baseline", "candidate", "candidate", "baseline", "baseline", "candidate"]
    assert crossover_orders(seq).tolist() == [1, -1, 1]
    # a comparison's sweeps: the shared baseline always first
    assert crossover_orders(["baseline", "candidate"] * 3).tolist() == [1, 1, 1]
    # one server at a time: every baseline block before every candidate block
    assert crossover_orders(["candidate", "candidate", "baseline", "baseline"]).tolist() == [-1, -1]
    assert crossover_orders([]) is None


def sample(rng, slow, n=16):
    return RepeatSample.of(*requests(rng, n, slow=slow, spread=0.2, tpot_spread=None))


def test_a_ratios_interval_pools_the_host_noise_and_an_absolute_one_does_not():
    rng = np.random.default_rng(5)
    spec = PerformanceSpec.model_validate({"workloads": [{"name": "w"}], "bootstrap_draws": 500,
                                           "gates": {"max_p99_ttft_ms": 5000}})
    samples = {"baseline": [sample(rng, 1.0), sample(rng, 1.3)], "candidate": [sample(rng, 0.6), sample(rng, 0.7)]}
    host = {m: HostNoise(ss=0.002 * 40, df=40, sources=("40 A/A repeats from 4 calibration run(s) (2026-12-06)",))
            for m in noise_store.METRICS}
    own = intervals(spec, samples, fail_alpha=0.004, seed=0)
    pooled = intervals(spec, samples, fail_alpha=0.004, seed=0, host_noise=host, orders=np.array([1, -1]))
    ratio = "ratio:output_tokens_per_s"
    assert own[ratio]["host_df"] is None and own[ratio]["between_df"] == 1
    assert pooled[ratio]["host_df"] == 40 and pooled[ratio]["between_df"] == 41
    assert "40 A/A repeats" in pooled[ratio]["noise_model"]
    # 40 df of a quiet host narrow the fail side that 1 df left wide open
    assert pooled[ratio]["fail_high"] - pooled[ratio]["fail_low"] < own[ratio]["fail_high"] - own[ratio]["fail_low"]
    assert pooled["candidate:ttft_ms.p99"]["host_df"] is None  # an absolute limit: not a log ratio


def test_the_dry_run_says_which_noise_model_will_judge_each_point(tmp_path):
    ctx = fake_ctx(tmp_path, run_id="dry")
    ctx.recipe.performance = SPEC
    ctx.loaded.path = tmp_path / "demo.yaml"
    lines = stage.plan(ctx)
    assert lines == [f"short/{p}: the run's own repeats: 1 df; run `quantlab calibrate {tmp_path / 'demo.yaml'}` to "
                     "calibrate this host" for p in ("c1", "c8")]
    parts = noise_store.point_parts(ctx, SPEC.workloads[0], "c8")
    noise_store.add(parts, noise_store.AA, "cal-1", {m: [1.02, 0.97, 1.01, 0.99] for m in noise_store.METRICS})
    lines = stage.plan(ctx)
    assert lines[0].startswith("short/c1: the run's own repeats: 1 df")
    assert lines[1].startswith("short/c8: host calibration: 4 df from 4 A/A repeats from 1 calibration run(s)")
    # what each ratio gate needs to decide; a P99 from 16 requests a repeat can fail, never pass
    assert "output_tokens_per_s ratio passes >= " in lines[1]
    assert "ttft_ms.p99 ratio fails >= " in lines[1] and "never passes (16 requests a repeat" in lines[1]
    ctx.recipe.performance = SPEC.model_copy(update={"host_noise": False})
    assert "performance.host_noise is false" in stage.plan(ctx)[0]


def point(models: dict[str, tuple[str, int | None]]) -> PerfPoint:
    ivs = {f"ratio:{m}": {"noise_model": model, "host_df": df} for m, (model, df) in models.items()}
    return PerfPoint(workload="short", point="c8", baseline={}, candidate={}, baseline_repeats=[],
                     candidate_repeats=[], comparison={}, monitor={}, intervals=ivs)


def result(points) -> PerfResult:
    return PerfResult(interleaved=True, order=[], points=points, client_cpu_share=0.0, memory={})


def test_the_report_says_which_noise_model_judged_each_point():
    same = "pooled: run 1 df + host 20 df (20 A/A repeats ...), order-balanced centre"
    lines = _noise_lines(result([point({"output_tokens_per_s": (same, 20), "ttft_ms.p99": (same, 20)})]))
    assert lines == [f"noise at short/c8: {same}"]
    lines = _noise_lines(result([point({"output_tokens_per_s": ("run's own repeats: 1 df, plain mean", None)})]))
    assert lines[0] == "noise at short/c8: run's own repeats: 1 df, plain mean"
    assert "quantlab calibrate RECIPE" in lines[1]
    mixed = _noise_lines(result([point({"output_tokens_per_s": (same, 20), "ttft_ms.p99": ("refused", 20)})]))
    assert mixed == [f"noise at short/c8: output_tokens_per_s: {same}; ttft_ms.p99: refused"]
    assert _noise_lines(result([point({})])) == []

