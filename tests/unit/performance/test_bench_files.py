"""Benchmark files written by `vllm bench serve` and GuideLLM (tests/data/imported/bench,
real files) read as quantlab's per-request records; each refusal on a mutated copy."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from quantlab.core.errors import RecipeError
from quantlab.performance.bench_files import FACTS, GUIDELLM, VLLM, group_runs, point_of, read_bench_file
from quantlab.performance.metrics import summarize
from quantlab.performance.noise import RepeatSample, ratio_draws

DATA = Path(__file__).resolve().parents[2] / "data" / "imported" / "bench"
BASELINE, CANDIDATE = DATA / "vllm-bench-baseline.json", DATA / "vllm-bench-candidate.json"
FAILED, NO_DETAIL = DATA / "vllm-bench-some-failed.json", DATA / "vllm-bench-without-detailed.json"
GL4, GL_ERR = DATA / "guidellm-concurrent4.json", DATA / "guidellm-concurrent2-some-errored.json"
GL_CUT = DATA / "guidellm-concurrent2-cut-short.json"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def mutated(tmp_path: Path, source: Path, change) -> Path:
    """A copy of a real file, changed by change(data) (which edits it in place)."""
    data = load(source)
    change(data)
    out = tmp_path / source.name
    out.write_text(json.dumps(data))
    return out


def refused(path: Path, field: str | None, *words: str) -> RecipeError:
    with pytest.raises(RecipeError) as caught:
        read_bench_file(path)
    err = caught.value
    assert err.exit_code == 2 and err.file == str(path) and err.field == field
    text = str(err)
    assert "found" in text and "expected" in text and "To fix" in text, text
    for word in words:
        assert word in text, text
    return err


# ---- vllm bench serve ------------------------------------------------------------------------

def test_a_vllm_bench_result_becomes_one_run_of_its_requests():
    data = load(BASELINE)
    (run,) = read_bench_file(BASELINE)
    assert (run.tool, run.index, run.file) == (VLLM, 0, BASELINE)
    assert run.sha256 == hashlib.sha256(BASELINE.read_bytes()).hexdigest()
    assert len(run.records) == data["completed"] == 24
    assert all(r.outcome == "ok" for r in run.records)
    assert (run.wall_s, run.concurrency, run.request_rate) == (data["duration"], 4, None)
    r = run.records[5]
    assert r.index == 5
    assert r.ttft == data["ttfts"][5] and r.e2e == data["latencies"][5] and r.itl == data["itls"][5]
    assert r.e2e == pytest.approx(r.ttft + sum(r.itl))  # vLLM's latency: the last chunk's time
    assert (r.prompt_tokens, r.output_tokens) == (data["input_lens"][5], data["output_lens"][5]) == (32, 16)
    assert r.sent_at == pytest.approx(data["start_times"][5] - min(data["start_times"]))
    assert r.text == data["generated_texts"][5]
    assert point_of(run) == "c4"


@pytest.mark.parametrize("path", [BASELINE, CANDIDATE, FAILED], ids=lambda p: p.stem)
def test_the_records_summarize_to_vllm_bench_s_own_figures(path):
    data = load(path)
    (run,) = read_bench_file(path)
    m = summarize(run.records, wall_s=run.wall_s, slo={})
    assert m["output_tokens_per_s"] == pytest.approx(data["output_throughput"])
    assert m["request_throughput"] == pytest.approx(data["request_throughput"])
    for ours, theirs in [("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("itl_ms", "itl")]:
        assert m[ours]["mean"] == pytest.approx(data[f"mean_{theirs}_ms"])
        assert m[ours]["median"] == pytest.approx(data[f"median_{theirs}_ms"])
        assert m[ours]["p99"] == pytest.approx(data[f"p99_{theirs}_ms"])


def test_a_failed_vllm_request_is_an_error_without_times():
    data = load(FAILED)
    (run,) = read_bench_file(FAILED)
    errors = [r for r in run.records if r.outcome == "error"]
    assert len(errors) == data["failed"] == 4 and len(run.records) == 12
    assert [r.index for r in errors] == [i for i, e in enumerate(data["errors"]) if e]
    assert all(r.error == "Bad Request" and r.ttft is None and r.e2e is None and r.output_tokens == 0
               for r in errors)
    assert summarize(run.records, wall_s=run.wall_s, slo={})["error_rate"] == pytest.approx(4 / 12)
    assert len(RepeatSample.of(run.records, run.wall_s).e2e) == 8


def test_what_a_vllm_bench_file_says_and_leaves_unknown():
    (run,) = read_bench_file(BASELINE)
    f = run.facts
    assert set(f) == set(FACTS)
    assert (f["model"], f["tokenizer"], f["backend"]) == ("tiny-llama", "tiny-llama", "openai")
    assert f["date"] == "2026-12-07T12:14:19"  # its "date" 20261207-121419, the client's local time
    assert f["arrivals"].startswith("closed loop") and f["labels"] == {}
    assert run.unknown == ["endpoint", "server", "dataset", "seed", "engine", "engine_version", "hardware",
                           "tool_version", "client_platform", "warmup_s"]
    assert all(f[k] is None for k in run.unknown)


def test_results_appended_to_one_file_are_runs_in_order(tmp_path):
    # --append-result writes a newline, then the next result's json.dump
    appended = tmp_path / "appended.json"
    appended.write_text(BASELINE.read_text() + "\n" + CANDIDATE.read_text())
    runs = read_bench_file(appended)
    assert [r.index for r in runs] == [0, 1]
    assert [r.wall_s for r in runs] == [load(BASELINE)["duration"], load(CANDIDATE)["duration"]]
    assert runs[0].sha256 == runs[1].sha256 == hashlib.sha256(appended.read_bytes()).hexdigest()


def test_metadata_given_to_vllm_bench_is_kept_as_labels(tmp_path):
    path = mutated(tmp_path, BASELINE, lambda d: d.update(hardware="H100", label="nightly"))
    (run,) = read_bench_file(path)
    assert run.facts["labels"] == {"hardware": "H100", "label": "nightly"}
    assert run.facts["hardware"] is None  # said by the user, not measured: kept as a label, never promoted


# ---- GuideLLM --------------------------------------------------------------------------------

def test_a_guidellm_report_becomes_a_run_per_benchmark():
    bench = load(GL4)["benchmarks"][0]
    (run,) = read_bench_file(GL4)
    assert (run.tool, run.index, run.concurrency, run.request_rate) == (GUIDELLM, 0, 4, None)
    assert run.wall_s == bench["duration"] and len(run.records) == 24
    by_id = {row["request_start_time"]: row for row in bench["requests"]["successful"]}
    starts = sorted(by_id)
    for r in run.records:
        row = by_id[starts[r.index]]  # records are in the order sent
        assert r.sent_at == pytest.approx(starts[r.index] - starts[0])
        assert r.ttft == pytest.approx(row["time_to_first_token_ms"] / 1000.0)
        assert r.e2e == row["request_latency"]
        assert (r.prompt_tokens, r.output_tokens) == (row["prompt_tokens"], row["output_tokens"]) == (62, 16)
        assert r.itl == []  # GuideLLM keeps no per-token times
        # quantlab's TPOT leaves the first token out; GuideLLM's counts it
        assert r.tpot * 1000 == pytest.approx((row["request_latency"] * 1000 - row["time_to_first_token_ms"]) / 15)
        assert r.tpot * 1000 != pytest.approx(row["time_per_output_token_ms"])
    assert point_of(run) == "c4"


@pytest.mark.parametrize("path", [GL4, GL_ERR], ids=lambda p: p.stem)
def test_the_records_agree_with_guidellm_s_own_means_and_counts(path):
    metrics = load(path)["benchmarks"][0]["metrics"]
    (run,) = read_bench_file(path)
    ok = [r for r in run.records if r.outcome == "ok"]
    assert len(ok) == metrics["request_totals"]["successful"]
    assert len(run.records) == metrics["request_totals"]["total"]
    ttft = metrics["time_to_first_token_ms"]["successful"]
    assert np.mean([r.ttft * 1000 for r in ok]) == pytest.approx(ttft["mean"])
    assert np.mean([r.e2e for r in ok]) == pytest.approx(metrics["request_latency"]["successful"]["mean"])


def test_an_errored_guidellm_request_is_an_error():
    row = load(GL_ERR)["benchmarks"][0]["requests"]["errored"][0]
    (run,) = read_bench_file(GL_ERR)
    (err,) = [r for r in run.records if r.outcome == "error"]
    assert err.error.startswith("errored: HTTPStatusError") and "400 Bad Request" in err.error
    assert (err.ttft, err.e2e, err.prompt_tokens) == (None, None, row["prompt_tokens"]) and err.prompt_tokens == 600
    assert [r.index for r in run.records] == list(range(6))
    assert all(a.sent_at <= b.sent_at for a, b in zip(run.records, run.records[1:]))
    assert point_of(run) == "c2"


def test_what_a_guidellm_report_says_and_leaves_unknown():
    (run,) = read_bench_file(GL4)
    f = run.facts
    assert (f["model"], f["tokenizer"], f["backend"], f["endpoint"]) == (
        "tiny-llama", "tiny-llama", "openai_http", "/v1/chat/completions")
    assert (f["server"], f["seed"], f["tool_version"]) == ("http://127.0.0.1:18431", 1, "0.8.1")
    assert f["date"] == "2026-12-07T12:17:36+00:00" and f["client_platform"].startswith("Linux")
    assert f["dataset"][0]["kind"] == "synthetic_text" and (f["warmup_s"], f["cooldown_s"]) == (0.0, 0.0)
    assert run.unknown == ["engine", "engine_version", "hardware"]


def test_each_benchmark_of_a_report_is_its_own_run(tmp_path):
    def second_at_a_rate(d):
        extra = json.loads(json.dumps(d["benchmarks"][0]))
        extra["config"]["strategy"] = {"type_": "poisson", "rate": 2.5, "max_concurrency": None, "random_seed": 42}
        d["benchmarks"].append(extra)
    runs = read_bench_file(mutated(tmp_path, GL4, second_at_a_rate))
    assert [r.index for r in runs] == [0, 1]
    assert [point_of(r) for r in runs] == ["c4", "r2.5"] and runs[1].facts["arrivals"] == "poisson"


# ---- the records in quantlab's performance arithmetic ----------------------------------------

def test_the_noise_model_draws_from_imported_repeats():
    (b,), (c,) = read_bench_file(BASELINE), read_bench_file(CANDIDATE)
    samples = [RepeatSample.of(r.records, r.wall_s) for r in (b, c)]
    assert [len(s.e2e) for s in samples] == [24, 24]
    for key in ("ttft_ms.p99", "tpot_ms.p99", "output_tokens_per_s"):
        draws = ratio_draws([samples[0]], [samples[1]], key, draws=200, seed=1)
        assert draws is not None and np.isfinite(draws).all()
    (g,) = read_bench_file(GL4)
    gs = RepeatSample.of(g.records, g.wall_s)
    assert len(gs.tpot) == 24 and not np.isnan(gs.tpot).any()


def test_point_names_follow_quantlab_s_own(tmp_path):
    rate = mutated(tmp_path, BASELINE, lambda d: d.update(request_rate=2.5, max_concurrency=None))
    (run,) = read_bench_file(rate)
    assert (run.request_rate, run.concurrency, point_of(run), run.facts["arrivals"]) == (2.5, None, "r2.5", "poisson")
    both = tmp_path / "both" / BASELINE.name
    both.parent.mkdir()
    both.write_text(json.dumps({**load(BASELINE), "request_rate": 4.0, "burstiness": 0.5}))
    (run,) = read_bench_file(both)
    assert point_of(run) == "r4" and run.concurrency == 4 and run.facts["arrivals"] == "gamma (burstiness 0.5)"


def test_a_run_at_no_point_is_refused_by_point_of(tmp_path):
    (run,) = read_bench_file(mutated(tmp_path, BASELINE, lambda d: d.update(max_concurrency=None)))
    with pytest.raises(RecipeError, match="neither its concurrency nor its request rate") as caught:
        point_of(run)
    assert caught.value.field == "max_concurrency"
    ramp = tmp_path / "ramp" / BASELINE.name
    ramp.parent.mkdir()
    ramp.write_text(json.dumps({**load(BASELINE), "ramp_up_strategy": "linear", "ramp_up_start_rps": 1,
                                "ramp_up_end_rps": 8}))
    (run,) = read_bench_file(ramp)
    with pytest.raises(RecipeError, match="ramps its request rate up"):
        point_of(run)


def test_group_runs_keeps_the_repeats_in_file_order():
    runs = [r for p in (BASELINE, GL_ERR, CANDIDATE, GL4) for r in read_bench_file(p)]
    groups = group_runs(runs)
    assert list(groups) == ["c4", "c2"]
    assert [r.file for r in groups["c4"]] == [BASELINE, CANDIDATE, GL4]
    assert [r.file for r in groups["c2"]] == [GL_ERR]
    assert group_runs([]) == {}


# ---- refusals --------------------------------------------------------------------------------

@pytest.mark.parametrize("content", [b"", b"  \n"], ids=["empty", "blank"])
def test_an_empty_file_is_refused(tmp_path, content):
    path = tmp_path / "empty.json"
    path.write_bytes(content)
    refused(path, None, "an empty file")


def test_a_file_that_is_not_json_is_refused(tmp_path):
    cut = tmp_path / "cut.json"
    cut.write_text(BASELINE.read_text()[:5000])
    refused(cut, None, "not JSON", "line 1")
    as_yaml = tmp_path / "report.yaml"
    as_yaml.write_text(yaml.safe_dump(load(GL_ERR)))
    refused(as_yaml, None, "not JSON", "YAML")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00{")
    refused(binary, None, "not UTF-8")


@pytest.mark.parametrize("doc", [{"results": {"ql_chat": {}}, "versions": {}}, [1, 2], {}],
                         ids=["lm-eval-results", "list", "empty-object"])
def test_json_of_neither_tool_is_refused(tmp_path, doc):
    path = tmp_path / "other.json"
    path.write_text(json.dumps(doc))
    refused(path, None, "vllm bench serve", "GuideLLM")


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(RecipeError, match="cannot read the benchmark file"):
        read_bench_file(tmp_path / "absent.json")


def test_a_vllm_result_without_per_request_rows_is_refused():
    refused(NO_DETAIL, "input_lens", "--save-detailed", "ttfts")


def test_a_vllm_result_whose_error_texts_do_not_count_its_failures_is_refused(tmp_path):
    path = mutated(tmp_path, BASELINE, lambda d: d["errors"].__setitem__(3, "Bad Request"))
    refused(path, "errors", "1 request(s) with an error text against failed = 0", "success flag")


def test_a_vllm_result_whose_rows_differ_in_length_is_refused(tmp_path):
    path = mutated(tmp_path, BASELINE, lambda d: d["itls"].pop())
    refused(path, "itls", "23 entries", "completed + failed = 24")


def test_a_vllm_result_of_zero_requests_is_refused(tmp_path):
    def empty(d):
        d.update(completed=0, failed=0, **{k: [] for k in ("input_lens", "output_lens", "ttfts", "itls", "latencies",
                                                           "start_times", "errors", "generated_texts")})
    refused(mutated(tmp_path, BASELINE, empty), "completed", "zero requests")


@pytest.mark.parametrize("field,value", [("ttfts", -0.01), ("latencies", math.nan), ("ttfts", "fast")])
def test_a_vllm_request_time_negative_or_not_a_number_is_refused(tmp_path, field, value):
    path = mutated(tmp_path, BASELINE, lambda d: d[field].__setitem__(2, value))
    refused(path, f"{field}[2]", "a time in seconds, finite and not negative")


def test_a_vllm_result_of_no_duration_is_refused(tmp_path):
    refused(mutated(tmp_path, BASELINE, lambda d: d.update(duration=0.0)), "duration", "above 0")


def test_a_guidellm_report_of_a_sample_of_its_requests_is_refused(tmp_path):
    def sampled(d):  # what --metrics sample_size=10 keeps: 10 of the rows, every count
        b = d["benchmarks"][0]
        b["requests"]["successful"] = b["requests"]["successful"][:10]
        b["config"]["sample_size"] = 10
    refused(mutated(tmp_path, GL4, sampled), "benchmarks[0].requests.successful",
            "10 successful requests kept of the 24 made", "sample_size=N")


def test_a_guidellm_benchmark_compiled_with_requests_in_flight_is_refused():
    refused(GL_CUT, "benchmarks[0].scheduler_state.processing_requests", "2 request(s) still in flight")


def test_a_guidellm_report_whose_counts_disagree_is_refused(tmp_path):
    path = mutated(tmp_path, GL4, lambda d: d["benchmarks"][0]["metrics"]["request_totals"].update(successful=23))
    refused(path, "benchmarks[0].metrics.request_totals.successful", "24 successful requests in the measured window")


def test_a_guidellm_report_of_zero_requests_is_refused(tmp_path):
    def empty(d):
        b = d["benchmarks"][0]
        b["requests"].update(successful=[], errored=[], incomplete=[])
        b["scheduler_metrics"]["requests_made"].update(successful=0, errored=0, incomplete=0, total=0)
        b["metrics"]["request_totals"].update(successful=0, errored=0, incomplete=0, total=0)
    refused(mutated(tmp_path, GL4, empty), "benchmarks[0].requests", "zero requests")
    refused(mutated(tmp_path, GL4, lambda d: d.update(benchmarks=[])), "benchmarks", "zero benchmarks")


@pytest.mark.parametrize("field,value", [("request_latency", -1.0), ("time_to_first_token_ms", math.nan)])
def test_a_guidellm_request_time_negative_or_not_a_number_is_refused(tmp_path, field, value):
    path = mutated(tmp_path, GL4, lambda d: d["benchmarks"][0]["requests"]["successful"][3].update({field: value}))
    refused(path, f"benchmarks[0].requests.successful[3].{field}", "finite and not negative")


def test_a_guidellm_report_of_another_schema_or_unstreamed_is_refused(tmp_path):
    refused(mutated(tmp_path, GL4, lambda d: d["metadata"].update(version=1)), "metadata.version",
            "schema version 1", "schema version 2")
    path = mutated(tmp_path, GL4, lambda d: d["benchmarks"][0]["config"]["backend"].update(stream=False))
    refused(path, "benchmarks[0].config.backend.stream", "not streamed")


def test_a_report_reshaped_elsewhere_is_refused_not_a_crash(tmp_path):
    path = mutated(tmp_path, GL4, lambda d: d["benchmarks"][0].update(config=["reshaped"]))
    refused(path, None, "not the one guidellm writes")


def test_the_real_files_are_read_unchanged(tmp_path):
    # reading never writes: the committed files keep their digests
    copy = tmp_path / GL4.name
    shutil.copy(GL4, copy)
    before = hashlib.sha256(copy.read_bytes()).hexdigest()
    read_bench_file(copy)
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == before
