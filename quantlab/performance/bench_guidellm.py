"""A GuideLLM benchmark report (GuideLLM 0.8, `--output kind=json`, schema version 2) as
quantlab's per-request records, one set per benchmark (pure).

Read from GuideLLM's own schemas (guidellm/benchmark/schemas/, guidellm/schemas/base/): each
benchmark keeps its requests by status (`requests.successful`, `errored`, `incomplete`), all
of them unless `--metrics sample_size=N` kept a reservoir sample (refused: a P99 of a sample is
not the run's). Its metrics count the requests inside the measured window (warm-up and
cool-down left out): the same rule is applied here and held to its `metrics.request_totals`.
Per request: `time_to_first_token_ms` (first token - request start), `request_latency`
(request end - start, the E2E), `prompt_tokens`, `output_tokens` (the server's usage). Its
`time_per_output_token_ms` counts the first token: not used, quantlab's TPOT comes from these.
It keeps no per-token times, so `itl` is empty. An errored or incomplete (cancelled) request is
an error. A benchmark compiled while requests were still in flight (seen with GuideLLM 0.8.1)
lacks their results: refused.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from quantlab.core import redact
from quantlab.performance import bench_fields as f
from quantlab.performance.metrics import RequestRecord

STATUSES = ("successful", "errored", "incomplete")
SCHEMA_VERSION = 2
FIX = "rerun `guidellm run` with --output kind=json,path=FILE and give that file"
CLOSED_LOOP = "closed loop (a request sent as one in flight ends)"


def is_guidellm_report(doc: dict[str, Any]) -> bool:
    return isinstance(doc.get("benchmarks"), list) and isinstance(doc.get("metadata"), dict) and "config" in doc


def parse(path: Path, report: dict[str, Any]) -> list[f.Parsed]:
    """Every benchmark of the report, in its order."""
    version = report["metadata"].get("version")
    if version != SCHEMA_VERSION:
        raise f.refuse(path, "metadata.version", f"a GuideLLM report of schema version {version!r} (GuideLLM "
                       f"{report['metadata'].get('guidellm_version', 'unknown')})",
                       f"schema version {SCHEMA_VERSION} (GuideLLM 0.8)", f"run GuideLLM 0.8 and {FIX}")
    if not report["benchmarks"]:
        raise f.refuse(path, "benchmarks", "zero benchmarks", "at least one benchmark with requests", FIX)
    spec = report["config"].get("spec") if isinstance(report["config"], dict) else None
    return [_benchmark(path, report, spec if isinstance(spec, dict) else {}, b, f"benchmarks[{i}].")
            for i, b in enumerate(report["benchmarks"])]


def _benchmark(path: Path, report: dict[str, Any], spec: dict[str, Any], bench: Any, where: str) -> f.Parsed:
    if not isinstance(bench, dict):
        raise f.refuse(path, where.rstrip("."), f"a {type(bench).__name__}", "a benchmark object", FIX)
    lists = {s: f.get(path, bench, f"requests.{s}", FIX, where=where, kind=list) for s in STATUSES}
    made = f.get(path, bench, "scheduler_metrics.requests_made", FIX, where=where, kind=dict)
    for status in ("successful", "errored"):
        if len(lists[status]) != made.get(status):
            raise f.refuse(path, f"{where}requests.{status}", f"{len(lists[status])} {status} requests kept of "
                           f"the {made.get(status)} made (scheduler_metrics.requests_made.{status}; config."
                           f"sample_size {(bench.get('config') or {}).get('sample_size')!r}): GuideLLM kept only a "
                           "sample", "every request of the benchmark",
                           "rerun GuideLLM without --metrics sample_size=N (by default it keeps every request)")
    state = f.get(path, bench, "scheduler_state", FIX, where=where, kind=dict)
    if state.get("processing_requests") or state.get("end_processing_time") is None:
        raise f.refuse(path, f"{where}scheduler_state.processing_requests", "a benchmark compiled with "
                       f"{state.get('processing_requests')} request(s) still in flight (end_processing_time "
                       f"{state.get('end_processing_time')!r}), whose results are not in the report",
                       "a benchmark whose requests had all ended", "run the benchmark again (GuideLLM 0.8.1 was seen to "
                       "compile a benchmark before its last requests were processed)")
    backend = (bench.get("config") or {}).get("backend") or spec.get("backend") or {}
    if backend.get("stream") is False:
        raise f.refuse(path, f"{where}config.backend.stream", "false: the answers were not streamed, so no "
                       "time to first token was measured", "true", "rerun GuideLLM with a streaming backend "
                       "(its default)")
    records = _records(path, bench, lists, where)
    wall = f.duration(path, where + "duration", bench.get("duration"), FIX)
    conc, rate, arrivals = _load(path, f.get(path, bench, "config.strategy", FIX, where=where, kind=dict), where)
    return f.Parsed(records=records, wall_s=wall, concurrency=conc, request_rate=rate,
                    facts=_facts(report, spec, bench, backend, arrivals))


def _records(path: Path, bench: dict[str, Any], lists: dict[str, list], where: str) -> list[RequestRecord]:
    """The requests GuideLLM measured, by its own rule (one that ended after the measured window
    opened and started before it closed), in the order they were sent."""
    lo = f.clock(path, where + "scheduler_metrics.measure_start_time",
                 f.get(path, bench, "scheduler_metrics.measure_start_time", FIX, where=where), FIX)
    hi = f.clock(path, where + "scheduler_metrics.measure_end_time",
                 f.get(path, bench, "scheduler_metrics.measure_end_time", FIX, where=where), FIX)
    kept = []
    for status, rows in lists.items():
        for j, row in enumerate(rows):
            field = f"{where}requests.{status}[{j}]."
            if not isinstance(row, dict):
                raise f.refuse(path, field.rstrip("."), f"a {type(row).__name__}", "a request's statistics", FIX)
            end, start = row.get("request_end_time"), row.get("request_start_time")
            start = end if start is None else start
            if end is not None and f.clock(path, field + "request_end_time", end, FIX) >= lo and \
                    f.clock(path, field + "request_start_time", start, FIX) <= hi:
                kept.append((start, status, field, row))
    totals = f.get(path, bench, "metrics.request_totals", FIX, where=where, kind=dict)
    for status in STATUSES:
        got = sum(k[1] == status for k in kept)
        if got != totals.get(status):
            raise f.refuse(path, f"{where}metrics.request_totals.{status}", f"{got} {status} requests in the "
                           f"measured window against request_totals.{status} = {totals.get(status)}",
                           "the report's own count", f"give the report unedited, or {FIX}")
    if not kept:
        raise f.refuse(path, f"{where}requests", "zero requests", "at least one measured request", FIX)
    kept.sort(key=lambda k: k[0])
    return [_record(path, i, start - kept[0][0], status, field, row)
            for i, (start, status, field, row) in enumerate(kept)]


def _record(path: Path, index: int, sent_at: float, status: str, field: str, row: dict[str, Any]) -> RequestRecord:
    tokens = {k: None if row.get(k) is None else f.count(path, field + k, row[k], FIX)
              for k in ("prompt_tokens", "output_tokens")}
    rec = RequestRecord(index=index, outcome="ok", sent_at=sent_at, text=row.get("output") or "", **tokens)
    if status != "successful":
        why = (row.get("info") or {}).get("error") or (
            "cancelled when the benchmark stopped" if status == "incomplete" else "no error text")
        rec.outcome, rec.error = "error", f"{status}: {why}"[:f.ERROR_CHARS]
        return rec
    e2e = f.seconds(path, field + "request_latency", row.get("request_latency"), FIX)
    ttft_ms = f.get(path, row, "time_to_first_token_ms", FIX, where=field)
    if ttft_ms is None:  # as quantlab's own load generator counts it
        rec.outcome, rec.error = "error", "the stream ended without a token"
        return rec
    rec.ttft, rec.e2e = f.seconds(path, field + "time_to_first_token_ms", ttft_ms, FIX) / 1000.0, e2e
    return rec


def _load(path: Path, strategy: dict[str, Any], where: str) -> tuple[int | None, float | None, str]:
    """(concurrency, rate, arrivals) of a GuideLLM scheduling strategy."""
    kind = strategy.get("type_")
    limit = strategy.get("max_concurrency")
    limit = None if limit is None else f.count(path, where + "config.strategy.max_concurrency", limit, FIX, least=1)
    if kind == "synchronous":
        return 1, None, "closed loop (one request at a time)"
    if kind == "concurrent":
        return f.count(path, where + "config.strategy.streams", strategy.get("streams"), FIX, least=1), None, \
            CLOSED_LOOP
    if kind in ("constant", "poisson"):
        rate = f.rate(path, where + "config.strategy.rate", strategy.get("rate"), FIX)
        return limit, rate, "poisson" if kind == "poisson" else "constant (evenly spaced)"
    if kind == "throughput":
        return limit, None, "all at once" if limit is None else CLOSED_LOOP
    return limit, None, f"GuideLLM strategy {kind!r}"


def _facts(report: dict[str, Any], spec: dict[str, Any], bench: dict[str, Any], backend: dict[str, Any],
           arrivals: str) -> dict[str, Any]:
    """A GuideLLM report says its backend (kind, model, target, request format), tokenizer, data,
    seed, its own version, the client's platform and the time; not the server's engine version
    or hardware (its vllm_python backends run vLLM in the client: the engine, not its version)."""
    seed = spec.get("seed") if isinstance(spec.get("seed"), dict) else {}
    start = bench.get("start_time")
    kind = backend.get("kind")
    return {"model": backend.get("model"), "tokenizer": (spec.get("tokenizer") or {}).get("model"),
            "backend": kind, "endpoint": backend.get("request_format"), "server": redact.url(backend.get("target")),
            "dataset": spec.get("data"), "seed": seed.get("value") if seed.get("kind") == "static" else None,
            "engine": "vllm" if str(kind).startswith("vllm_python") else None,
            "tool_version": report["metadata"].get("guidellm_version"),
            "client_platform": report["metadata"].get("platform"),
            "date": datetime.fromtimestamp(start, tz=timezone.utc).isoformat(timespec="seconds")
            if isinstance(start, (int, float)) else None,
            "arrivals": arrivals, "warmup_s": bench.get("warmup_duration"),
            "cooldown_s": bench.get("cooldown_duration"),
            "labels": ((report.get("config") or {}).get("metadata") or {}).get("labels") or {},
            "sent_at": "seconds after the benchmark's first measured request was sent (request_start_time)"}
