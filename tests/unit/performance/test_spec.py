"""The performance section of a recipe: what is accepted and the errors for what is not."""

from __future__ import annotations

import pytest

from quantlab.core.errors import RecipeError
from quantlab.performance.gates import verdicts as perf_gates
from quantlab.recipe.performance import PerfGates
from quantlab.recipe.file import parse_recipe
from quantlab.core.results import PerfPoint


def recipe(perf):
    return parse_recipe({"name": "x", "quantization": {"method": "rtn", "scheme": "W4A16"}, "performance": perf})


def test_defaults_and_ranges():
    p = recipe({"workloads": [{"name": "chat", "api": "chat", "prompt_tokens": [64, 128], "concurrency": [1, 4]}]})
    w = p.performance.workloads[0]
    assert w.prompt_tokens == (64, 128) and w.output_tokens == 64 and p.performance.repeats == 2
    assert p.performance.gates.max_error_rate == 0.0


@pytest.mark.parametrize("perf, needle", [
    ({"workloads": []}, "at least 1 item"),
    ({"workloads": [{"name": "a", "num_requests": 0}]}, "greater than or equal to 1"),
    ({"workloads": [{"name": "a", "prompt_tokens": [128, 64]}]}, "1 <= min <= max"),
    ({"workloads": [{"name": "a", "concurrency": [], "request_rates": []}]}, "at least one point"),
    ({"workloads": [{"name": "a", "request_rates": [0]}]}, "positive requests per second"),
    ({"workloads": [{"name": "a"}, {"name": "a"}]}, "unique"),
    ({"workloads": [{"name": "a"}], "slo": {"p99_ttft_ms": 100}}, "slo.p99_ttft_ms': unknown key"),
    ({"workloads": [{"name": "a"}], "gates": {"min_throughput": 0.9}}, "Did you mean 'min_throughput_ratio'"),
])
def test_bad_performance_sections(perf, needle):
    with pytest.raises(RecipeError, match=needle):
        recipe(perf)


def test_missing_prompt_dataset_names_the_field(tmp_path):
    import yaml

    from quantlab.recipe.file import load_recipe

    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump({"name": "x", "quantization": {"method": "rtn", "scheme": "W4A16"},
                                 "performance": {"workloads": [{"name": "a", "dataset": "nope.jsonl"}]}}))
    with pytest.raises(RecipeError, match=r"performance.workloads.0.dataset.*prompt dataset not found"):
        load_recipe(f)


def point(tp_ratio, p99_ttft_ms, error_rate=0.0, intervals=None, ttft_ratio=1.0):
    cmp = {"output_tokens_per_s": {"ratio": tp_ratio}, "ttft_ms.p99": {"ratio": ttft_ratio},
           "tpot_ms.p99": {"ratio": None}}
    cand = {"ttft_ms": {"p99": p99_ttft_ms}, "tpot_ms": {"p99": None}, "error_rate": error_rate}
    return PerfPoint(workload="w", point="c8", concurrency=8, baseline={}, candidate=cand, baseline_repeats=[{}],
                     candidate_repeats=[{}], comparison=cmp, monitor={}, intervals=intervals or {})


def iv(pass_low, pass_high, fail_low, fail_high, requests=100):
    return {"pass_low": pass_low, "pass_high": pass_high, "fail_low": fail_low, "fail_high": fail_high,
            "fail_alpha": 0.004, "draws": 4000, "repeats": 2, "requests": requests}


def test_perf_gate_verdicts_without_intervals_judge_the_value():
    gates = PerfGates(min_throughput_ratio=0.9, max_p99_ttft_ms=500, max_p99_tpot_ratio=1.2, max_error_rate=0.0)
    v = {g.gate: g for g in perf_gates([point(0.7, 400)], gates)}
    assert v["min_throughput_ratio"].verdict == "fail" and v["min_throughput_ratio"].value == pytest.approx(0.7)
    assert "no interval" in v["min_throughput_ratio"].evidence
    # within its limit, but a P99 from no counted requests shows no tail: not shown
    assert v["max_p99_ttft_ms"].verdict == "inconclusive" and "a pass needs >= 100" in v["max_p99_ttft_ms"].evidence
    assert v["max_p99_tpot_ratio"].verdict == "inconclusive"  # not measured
    assert v["max_error_rate"].verdict == "pass"
    v = {g.gate: g for g in perf_gates([point(0.95, 600, error_rate=0.05)], gates)}
    assert v["max_p99_ttft_ms"].verdict == "fail" and v["max_error_rate"].verdict == "fail"


def test_perf_gates_fail_only_beyond_the_interval_and_are_not_shown_inside_it():
    gates = PerfGates(min_throughput_ratio=0.8, max_p99_ttft_ratio=1.5, max_p99_ttft_ms=500, max_p99_tpot_ratio=None)
    # the GPTQ run that failed once at 1.513 against 1.5: inside the noise, so not shown
    noisy = {"ratio:output_tokens_per_s": iv(0.82, 1.1, 0.78, 1.2),
             "ratio:ttft_ms.p99": iv(1.2, 1.7, 1.1, 1.8), "candidate:ttft_ms.p99": iv(300, 450, 280, 480)}
    v = {g.gate: g for g in perf_gates([point(0.95, 400, intervals=noisy)], gates)}
    assert v["min_throughput_ratio"].verdict == "pass"
    assert v["max_p99_ttft_ratio"].verdict == "inconclusive" and "interval includes it" in \
        v["max_p99_ttft_ratio"].evidence and "max_repeats" in v["max_p99_ttft_ratio"].evidence
    assert v["max_p99_ttft_ms"].verdict == "pass"
    # beyond the limit at the one-sided bound, but not at the family-adjusted one: still not shown
    edge = {"ratio:output_tokens_per_s": iv(0.7, 0.79, 0.66, 0.83)}
    assert perf_gates([point(0.75, 400, intervals=edge)], gates)[0].verdict == "inconclusive"
    worse = {"ratio:output_tokens_per_s": iv(0.6, 0.7, 0.55, 0.75), "ratio:ttft_ms.p99": iv(1.7, 2.1, 1.6, 2.2),
             "candidate:ttft_ms.p99": iv(520, 700, 510, 720)}
    v = {g.gate: g for g in perf_gates([point(0.65, 600, intervals=worse, ttft_ratio=1.9)], gates)}
    assert [v[g].verdict for g in ("min_throughput_ratio", "max_p99_ttft_ratio", "max_p99_ttft_ms")] == ["fail"] * 3
    assert "beyond the limit even at the fail side's bound" in v["max_p99_ttft_ratio"].evidence


def test_max_repeats_below_repeats_is_refused():
    with pytest.raises(RecipeError, match=r"max_repeats \(2\).*cannot be below repeats \(3\)"):
        recipe({"workloads": [{"name": "a"}], "repeats": 3, "max_repeats": 2})


def test_warm_up_requests_keep_the_prompt_and_shorten_the_answer():
    from quantlab.performance.loadgen import PreparedRequest
    from quantlab.performance.measure_loop import _short

    long = PreparedRequest("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 64, "min_tokens": 64,
                                               "ignore_eos": True}, 64)
    short = _short(long)
    assert short.body == {"prompt": [1, 2, 3], "max_tokens": 16, "min_tokens": 16, "ignore_eos": True}
    assert short.requested_output_tokens == 16 and long.body["max_tokens"] == 64  # the original is untouched
    tiny = PreparedRequest("/v1/chat/completions", {"messages": [], "max_tokens": 8}, 8)
    assert _short(tiny).body == {"messages": [], "max_tokens": 8}


def test_a_p99_gate_passes_only_on_100_requests_a_repeat_and_may_fail_on_fewer():
    """From 16 requests a P99 is the slowest one or two: a tail 1.7x worse was blocked 2-4%
    of the time. Below 100 requests a repeat it cannot pass; a breach beyond the interval still fails."""
    gates = PerfGates(min_throughput_ratio=0.8, max_p99_ttft_ratio=1.5, max_p99_ttft_ms=None, max_p99_tpot_ratio=None)
    fine = {"ratio:output_tokens_per_s": iv(0.9, 1.1, 0.85, 1.15, requests=16),
            "ratio:ttft_ms.p99": iv(0.9, 1.1, 0.85, 1.15, requests=16)}
    v = {g.gate: g for g in perf_gates([point(1.0, 400, intervals=fine)], gates)}
    assert v["min_throughput_ratio"].verdict == "pass"  # a mean figure: 16 requests are enough
    assert v["max_p99_ttft_ratio"].verdict == "inconclusive" and "16 requests a repeat" in v["max_p99_ttft_ratio"].evidence
    bad = {"ratio:ttft_ms.p99": iv(1.8, 2.2, 1.7, 2.3, requests=16)}
    v = {g.gate: g for g in perf_gates([point(1.0, 400, intervals=bad, ttft_ratio=2.0)], gates)}
    assert v["max_p99_ttft_ratio"].verdict == "fail"
    enough = {"ratio:ttft_ms.p99": iv(0.9, 1.1, 0.85, 1.15, requests=100)}
    v = {g.gate: g for g in perf_gates([point(1.0, 400, intervals=enough)], gates)}
    assert v["max_p99_ttft_ratio"].verdict == "pass"
