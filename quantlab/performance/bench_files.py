"""Benchmark results measured elsewhere, read as quantlab's own per-request records, so that
the performance gates judge them unchanged (pure).

Two tools' files (each reader says what its tool's file holds):
- `vllm bench serve --save-result --save-detailed` (vLLM 0.32/0.33; performance/bench_vllm):
  one JSON object, or one a line where --append-result added several;
- a GuideLLM benchmark report (GuideLLM 0.8, `--output kind=json`; performance/bench_guidellm):
  one or more benchmarks.
Each benchmark becomes one BenchRun: its requests (outcome ok or error, in the order sent),
its duration as the tool measured it, its load (concurrency or request rate) and what the
file says of the model, tokenizer, endpoint, seed, engine, hardware and date (`facts`, the
same keys for both tools); what it does not say is None there and named in `unknown`, never
guessed. Neither tool records the server's engine version or its hardware.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantlab.core.errors import RecipeError
from quantlab.performance import bench_fields, bench_guidellm, bench_vllm
from quantlab.performance.metrics import RequestRecord

VLLM = "vllm bench serve"
GUIDELLM = "guidellm"
# every BenchRun.facts has these keys, None where the file does not say
FACTS = ("model", "tokenizer", "backend", "endpoint", "server", "dataset", "seed", "engine", "engine_version",
         "hardware", "tool_version", "client_platform", "date", "arrivals", "warmup_s", "cooldown_s", "labels",
         "sent_at")
FIX = f"{bench_vllm.FIX}, or {bench_guidellm.FIX}"


@dataclass(frozen=True)
class BenchRun:
    """One benchmark of a file: its requests as quantlab's records and what the file says."""

    file: Path
    sha256: str  # of the whole file
    tool: str  # VLLM | GUIDELLM
    index: int  # which benchmark of the file (GuideLLM reports hold several; 0 for one vLLM result)
    records: list[RequestRecord]  # one per request, in the order sent; outcome ok | error
    wall_s: float  # the benchmark's duration as the tool measured it
    concurrency: int | None  # requests in flight at most; None when not limited
    request_rate: float | None  # requests per second asked for; None for "inf"
    facts: dict[str, Any]  # the keys of FACTS
    unknown: list[str]  # the facts the file does not give


def read_bench_file(path: Path) -> list[BenchRun]:
    """Every benchmark in one file of `vllm bench serve` or GuideLLM; refused (RecipeError,
    exit 2, naming the file and the field) where it is neither, or cannot be read faithfully."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise RecipeError(f"cannot read the benchmark file ({err.strerror}); give an existing, readable file",
                          file=str(path)) from err
    tool, parts = _parse(path, _documents(path, data))
    sha = hashlib.sha256(data).hexdigest()
    runs = []
    for i, p in enumerate(parts):
        facts = {k: p.facts.get(k) for k in FACTS}
        runs.append(BenchRun(file=path, sha256=sha, tool=tool, index=i, records=p.records, wall_s=p.wall_s,
                             concurrency=p.concurrency, request_rate=p.request_rate, facts=facts,
                             unknown=[k for k in FACTS if facts[k] is None]))
    return runs


def point_of(run: BenchRun) -> str:
    """The workload point the run measured, named as quantlab names its own
    (performance/result.load_points): `r<rate>` where a request rate was asked for (a
    concurrency limit beside it stays in run.concurrency), else `c<concurrency>`."""
    where = f"{run.file} (benchmark {run.index + 1})"
    if str(run.facts.get("arrivals") or "").startswith("ramp-up"):
        raise RecipeError(f"{where} ramps its request rate up ({run.facts['arrivals']}), which is no single "
                          "workload point; give a benchmark run at one --request-rate or --max-concurrency",
                          file=str(run.file), field="ramp_up_strategy")
    if run.request_rate is not None:
        return f"r{run.request_rate:g}"
    if run.concurrency is not None:
        return f"c{run.concurrency}"
    raise RecipeError(f"{where} limited neither its concurrency nor its request rate (every request sent at "
                      "once), which is no workload point quantlab measures; rerun it with --max-concurrency N "
                      "or --request-rate R (GuideLLM: a concurrent, synchronous, constant or poisson profile)",
                      file=str(run.file), field="max_concurrency")


def _parse(path: Path, docs: list[dict[str, Any]]) -> tuple[str, list[bench_fields.Parsed]]:
    if len(docs) == 1 and bench_guidellm.is_guidellm_report(docs[0]):
        tool = GUIDELLM
    elif all(bench_vllm.is_vllm_result(d) for d in docs):
        tool = VLLM
    else:
        odd = next(d for d in docs if not bench_vllm.is_vllm_result(d))
        raise bench_fields.refuse(path, None, f"a JSON object with the keys {_some_keys(odd)}",
                                  "the result of `vllm bench serve --save-result --save-detailed` (keys duration, "
                                  "completed, ttfts, itls, ...) or a GuideLLM benchmark report (keys metadata, "
                                  "config, benchmarks)", FIX)
    try:
        if tool == GUIDELLM:
            return tool, bench_guidellm.parse(path, docs[0])
        return tool, [bench_vllm.parse(path, d, f"result {i + 1}: " if len(docs) > 1 else "")
                      for i, d in enumerate(docs)]
    except (AttributeError, TypeError, KeyError, IndexError) as err:
        # a field the readers check is refused by name; this is what a file reshaped elsewhere meets
        raise bench_fields.refuse(path, None, f"a {tool} file whose structure is not the one {tool} writes "
                                  f"({type(err).__name__}: {err})", f"the file as {tool} wrote it", FIX) from err


def group_runs(runs: list[BenchRun]) -> dict[str, list[BenchRun]]:
    """The runs by workload point (point_of), each point's repeats in the order given."""
    out: dict[str, list[BenchRun]] = {}
    for run in runs:
        out.setdefault(point_of(run), []).append(run)
    return out


def _documents(path: Path, data: bytes) -> list[dict[str, Any]]:
    """The file's JSON object, or its objects one a line (vllm bench --append-result)."""
    if not data.strip():
        raise bench_fields.refuse(path, None, "an empty file", "a benchmark result in JSON", FIX)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise bench_fields.refuse(path, None, f"bytes that are not UTF-8 text (at byte {err.start})",
                                  "a benchmark result in JSON", FIX) from err
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError as whole:
        lines = [line for line in text.splitlines() if line.strip()]
        docs = _json_lines(lines) if len(lines) > 1 else None
        if docs is None:
            raise bench_fields.refuse(path, None, f"text that is not JSON ({whole.msg} at line {whole.lineno}, "
                                      f"column {whole.colno})", "a benchmark result in JSON (a GuideLLM report "
                                      "saved as YAML is not read)", FIX) from whole
    for doc in docs:
        if not isinstance(doc, dict):
            raise bench_fields.refuse(path, None, f"JSON whose top level is a {type(doc).__name__}",
                                      "a JSON object: a vllm bench result or a GuideLLM report", FIX)
    return docs


def _json_lines(lines: list[str]) -> list[Any] | None:
    try:
        return [json.loads(line) for line in lines]
    except json.JSONDecodeError:
        return None


def _some_keys(doc: dict[str, Any]) -> str:
    keys = sorted(doc)
    if not keys:
        return "(none)"
    return ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
